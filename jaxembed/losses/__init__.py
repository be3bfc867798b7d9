"""Losses as pure functions: InfoNCE over the global batch (plain and tiled), PEG, Matryoshka, GIST's guided mask
(gist), distillation from teacher scores (distill: KL, MarginMSE), scored pairs (scored: CoSENT, AnglE), and the
per-row combination of a batch (objective). The table of the losses a config may name and of the loss-side features
is ``table`` (``PARTS``, ``LOSS_TABLE``); each one's settings, checks, model-card words and hook are in ``parts/``.

The names below are imported from their modules when first used, so that ``jaxembed.losses.table`` is read without
JAX (the data config reads it)."""

_EXPORTS = {"CandidateInfo": "core", "LossOptions": "core", "QueryInfo": "core", "layout_pos_index": "core",
            "normalize": "core", "PegState": "infonce", "QueryTerms": "infonce", "contrastive_loss": "infonce",
            "peg_statistics": "infonce", "query_terms": "infonce", "tiled_terms": "tiled"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
