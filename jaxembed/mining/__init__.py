"""Hard-negative mining with ranking-consistency filtering (KaLM-Embedding 3.2, ``jaxembed mine``).

- ``negatives``: the filter and the negative sampling (``mine``, ``mine_with_embeddings``, ``MineConfig``; the
  method is in its docstring);
- ``search``: the nearest corpus texts of every query (exact ``blocked_search`` over all devices, or ``IVFIndex``);
- ``encoding``: the reference encoder (``load_encoder``) and texts encoded in cached shards (``encode_texts``;
  ``jaxembed score`` uses it too);
- ``job``: the job's input and output files (``run_mine``, ``read_input``, the report).

The names below are re-exported: ``from jaxembed import mining; mining.mine(...)``.
"""

from jaxembed.mining.encoding import encode_texts, load_encoder, model_fingerprint, normalize, progress_bar
from jaxembed.mining.job import (MineInput, annotate_records, data_config_entry, format_report, input_from_file,
                                 input_from_store, instruction_prompt, read_input, run_mine, write_jsonl,
                                 write_report)
from jaxembed.mining.negatives import (RANK_BINS, MineConfig, MineResult, build_corpus, mine, mine_with_embeddings,
                                       norm_text, parse_window, rank_histogram)
from jaxembed.mining.search import IVFIndex, SearchResult, blocked_search, prepare_corpus, search_memory

__all__ = ["IVFIndex", "MineConfig", "MineInput", "MineResult", "RANK_BINS", "SearchResult", "annotate_records",
           "blocked_search", "build_corpus", "data_config_entry", "encode_texts", "format_report", "input_from_file",
           "input_from_store", "instruction_prompt", "load_encoder", "mine", "mine_with_embeddings",
           "model_fingerprint", "norm_text", "normalize", "parse_window", "prepare_corpus", "progress_bar",
           "rank_histogram", "read_input", "run_mine", "search_memory", "write_jsonl", "write_report"]
