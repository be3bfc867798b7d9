"""CoSENT on scored pairs (``jaxembed.losses.scored``: ``cosent_loss``): the ranking loss on the cosines of the
pairs."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import SCORED, Loss, Settings, positive, resolve, setting


@dataclasses.dataclass(frozen=True)
class CosentSettings(Settings):
    """scale: lambda (sentence-transformers' scale), shared with AnglE."""

    scale: float = setting("scored_scale", 20.0, positive)

    def pairs_loss(self, u, v, scores, member):
        """(loss, pairs compared) of the member pairs (``jaxembed.losses.scored.scored_loss``)."""
        return resolve("jaxembed.losses.scored:cosent_loss")(u, v, scores, member, self.scale)


LOSS = Loss("cosent", "CoSENT", SCORED, CosentSettings,
            "jaxembed.losses.scored:scored_rows", "scored pairs (sentence1, sentence2, score)")
