"""The contrastive path's settings, shared by the contrastive losses (InfoNCE, PEG): the symmetric term, the
other tasks' candidates masked, and how the loss is computed (plain or tiled: ``jaxembed.losses.tiled``, never
building the [B, N] logits; under jit on global arrays or under ``jax.shard_map``: ``jaxembed.parallel``). The train
step (``jaxembed.train.step``) builds the path from them."""

from __future__ import annotations

import dataclasses

from jaxembed.losses.parts.base import Feature, Settings, one_of, positive_integer, setting

IMPLS = ("jit", "shard_map")


@dataclasses.dataclass(frozen=True)
class ContrastiveSettings(Settings):
    """symmetric: add the positive -> query term; same_task_mask: in mixed batches, a candidate of another task is
    not a negative; tiled / block_q / block_c: the memory-bounded loss and its blocks; impl: 'jit' (global arrays,
    XLA collectives) | 'shard_map' (explicit all_gather)."""

    symmetric: bool = setting("symmetric", False)
    same_task_mask: bool = setting("same_task_mask", False)
    tiled: bool = setting("tiled", False)
    block_q: int = setting("block_q", 1024, positive_integer)
    block_c: int = setting("block_c", 8192, positive_integer)
    impl: str = setting("impl", "jit", one_of(*IMPLS))

    @classmethod
    def card(cls, v: dict) -> str:
        return (", symmetric" if v["symmetric"] else "") + (
            ", other tasks' candidates masked" if v["same_task_mask"] else "")


FEATURE = Feature("contrastive", ContrastiveSettings)
