"""Distillation's settings (``jaxembed.losses.distill``): the teacher scores (pos_scores / neg_scores) of each
contrastive query's candidates, distilled by KL or MarginMSE and added to its loss with a weight."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import Feature, Settings, non_negative, one_of, positive, setting

KINDS = ("none", "kl", "margin_mse")


@dataclasses.dataclass(frozen=True)
class DistillSettings(Settings):
    """kind: 'none' | 'kl' | 'margin_mse'; weight: of the distillation term; temperature: KL's teacher-score
    temperature (0 = the batch's; FE reranker scores: 1.0)."""

    kind: str = setting("distill", "none", one_of(*KINDS))
    weight: float = setting("distill_weight", 1.0, positive)
    temperature: float = setting("distill_temperature", 0.0, non_negative)

    @classmethod
    def card(cls, v: dict) -> str:
        if v["kind"] in (None, "none"):
            return ""
        return f", distillation `{v['kind']}` weight {v['weight']}"


FEATURE = Feature("distill", DistillSettings)
