"""AnglE on scored pairs (``jaxembed.losses.scored``: ``angle_loss``): the ranking loss on the angle similarities,
plus ``cosine_weight`` x CoSENT's (AnglE Eq. 6's w1, with w3 = 1)."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import SCORED, Loss, Settings, non_negative, positive, resolve, setting


@dataclasses.dataclass(frozen=True)
class AngleSettings(Settings):
    """scale: lambda, shared with CoSENT; cosine_weight: + this weight x the CoSENT loss (AnglE's w1)."""

    scale: float = setting("scored_scale", 20.0, positive)
    cosine_weight: float = setting("angle_cosine_weight", 0.0, non_negative)

    def pairs_loss(self, u, v, scores, member):
        """(loss, pairs compared) of the member pairs (``jaxembed.losses.scored.scored_loss``)."""
        return resolve("jaxembed.losses.scored:angle_loss")(u, v, scores, member, self.scale, self.cosine_weight)


LOSS = Loss("angle", "AnglE", SCORED, AngleSettings,
            "jaxembed.losses.scored:scored_rows", "scored pairs (sentence1, sentence2, score)")
