"""Losses as pure functions: InfoNCE over the global batch (plain and tiled), PEG, Matryoshka, GIST's guided mask
(gist), distillation from teacher scores (distill: KL, MarginMSE), scored pairs (scored: CoSENT, AnglE), and the
per-row combination of a batch (objective)."""

from jaxembed.losses.core import CandidateInfo, LossOptions, QueryInfo, layout_pos_index, normalize
from jaxembed.losses.infonce import PegState, QueryTerms, contrastive_loss, peg_statistics, query_terms
from jaxembed.losses.tiled import tiled_terms

__all__ = ["CandidateInfo", "LossOptions", "QueryInfo", "layout_pos_index", "normalize", "PegState", "QueryTerms",
           "contrastive_loss", "peg_statistics", "query_terms", "tiled_terms"]
