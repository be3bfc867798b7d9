"""The pieces the GPU benchmark's workers share (benchmarks/gpu/workers.py): model folders with random weights of
real configs, the natural-length data and its batches, synthetic fixed-length batches, FLOP counts and timing.

Imported only in worker processes (it imports jax and jaxembed); benchmarks/gpu/bench.py, the entry, does not.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

TEMPERATURE = 0.05  # sentence-transformers' MultipleNegativesRankingLoss scale 20
MAX_LEN = 128       # tokens per text at most (natural lengths), both tools

BERT_BASE = dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12, pad_token_id=0)
BERT_LARGE = dict(BERT_BASE, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)
QWEN2_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=True, attention_dropout=0.0,
                 use_sliding_window=False, sliding_window=None, max_window_layers=24)
#: part 6 (LLM embedders at size): Qwen2-1.5B and Qwen2-7B's configs (Hugging Face, Qwen/Qwen2-*/config.json)
QWEN2_15B = dict(QWEN2_05B, hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, max_window_layers=28)
QWEN2_7B = dict(QWEN2_05B, vocab_size=152064, hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, intermediate_size=18944, max_window_layers=28, tie_word_embeddings=False)
#: model name -> its Hugging Face config, for the named real configs
REAL_CONFIGS = {"bert-base": BERT_BASE, "bert-large": BERT_LARGE, "qwen2-0.5b": QWEN2_05B, "qwen2-1.5b": QWEN2_15B,
                "qwen2-7b": QWEN2_7B}
#: name -> what the folder holds (tokenizer: all-MiniLM-L6-v2's WordPiece for the BERTs; for Qwen2 the byte-level
#: BPE of jaxembed.models.qwen2.tokenizer.qwen2_tokenizer, in Qwen2's layout: Qwen2's own cannot be fetched offline)
MODEL_NOTES = {
    "minilm": "all-MiniLM-L6-v2's config (6 x 384), random weights",
    "bert-base": "BERT-base config (12 x 768, 110M parameters), random weights",
    "bert-large": "BERT-large config (24 x 1024, 335M parameters), random weights",
    "qwen2-0.5b": "Qwen2-0.5B config (24 x 896, GQA 14/2, 494M parameters), random weights, causal; tokenizer: a "
                  "16k byte-level BPE in Qwen2's layout (more tokens per text than Qwen2's own)",
    "qwen2-1.5b": "Qwen2-1.5B config (28 x 1536, GQA 12/2, 1.5B parameters), random weights initialised on the "
                  "device (no folder weights: part 6), causal",
    "qwen2-7b": "Qwen2-7B config (28 x 3584, GQA 28/4, 7.6B parameters), random weights initialised on the device "
                "(no folder weights: part 6), causal",
    "tiny-bert": "jaxembed.models.tiny BERT (2 x 32), random weights",
    "tiny-qwen2": "jaxembed.models.tiny Qwen2 (2 x 32), random weights",
}


def hf_config(name: str) -> dict:
    from jaxembed import paths
    from jaxembed.models.tiny import tiny_hf_config

    if name == "minilm":
        return json.loads((paths.demo_model_dir() / "config.json").read_text(encoding="utf-8"))
    if name.startswith("tiny-"):
        return tiny_hf_config(name[5:], num_layers=1)
    return REAL_CONFIGS[name]


def model_folder(name: str, root: Path) -> Path:
    """A sentence-transformers folder of ``name`` (MODEL_NOTES) with random weights (seed 0, jaxembed's own
    initialisation on the CPU, exported by jaxembed.export): both tools load this same folder. Built once under
    ``root``."""
    out = Path(root) / name
    if (out / ".complete").is_file():
        return out
    import jax

    from jaxembed import export, models
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.paths import demo_model_dir
    from jaxembed.tokenizer import Tokenizer

    hf = hf_config(name)
    with jax.default_device(jax.devices("cpu")[0]):  # the accelerator's allocator counts none of it
        model = EmbeddingModel.init(models.config_from_hf(hf, where=name), HeadConfig("mean"), seed=0)
    tok_dir = tiny_model_dir("qwen2") if hf["model_type"] == "qwen2" else demo_model_dir()
    tokenizer = Tokenizer.from_folder(tok_dir, MAX_LEN)
    if out.exists():
        shutil.rmtree(out)
    export.export(model, tokenizer, out, hf_config=dict(hf),
                  model_card=f"# {name}\n\n{MODEL_NOTES[name]} (benchmarks/gpu). Not a trained model.\n")
    (out / ".complete").write_text("1\n")
    return out


# ------------------------------------------------------------------------------------------------ natural data


def natural_data_file(root: Path) -> Path:
    """The shared snli triplets and wikiqa (train), one JSONL: every row with a positive and a hard negative."""
    from jaxembed import paths

    out = Path(root) / "snli_wikiqa.jsonl"
    if out.is_file():
        return out
    rows = []
    for f in ("snli_triplets.jsonl", "wikiqa.jsonl"):
        for line in open(paths.shared_data_dir() / "train" / f, encoding="utf-8"):
            r = json.loads(line)
            if r.get("pos") and r.get("neg"):
                rows.append(json.dumps({"query": r["query"], "pos": r["pos"], "neg": r["neg"]}))
    Path(root).mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")  # two processes may build it at once (prepare, smoke)
    tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


def run_config(folder: Path, B: int, *, data: Path, store: Path, K: int = 2, packing: bool = True,
               chunk: int = 0, tiled: bool = False, plan_steps: int = 40, dtype: str = "bfloat16",
               max_len: int = MAX_LEN, max_query_len: int | None = None, dropout: bool = True,
               lora_rank: int = 0, remat: bool = False, name: str = "snli_wikiqa"):
    """The trainer's config: the snli + wikiqa rows (task type nli: no instruction), 1 positive + K-1 hard
    negatives, every text at most MAX_LEN tokens, global batch B, AdamW (lr 2e-5, weight decay 0.01, clip 1.0),
    temperature 0.05, dropout on, ``dtype`` compute with float32 master weights. Long texts (parts 5 and 6):
    documents up to ``max_len`` tokens and queries up to ``max_query_len``, dropout off (the fused attention
    kernels have no attention dropout), LoRA adapters of ``lora_rank`` (alpha 2 x rank, the architecture's default
    targets) and ``remat`` (every layer rematerialised in the backward pass)."""
    from jaxembed.config import default_config
    from jaxembed.data.config import dataset_config

    c = default_config()
    c.model.name = str(folder)
    c.model.dtype = dtype
    c.model.max_length = max_len
    c.model.remat = bool(remat)
    if lora_rank:
        c.model.lora.enabled = True
        c.model.lora.rank = int(lora_rank)
        c.model.lora.alpha = 2.0 * lora_rank
    c.data.datasets = [dataset_config(name=name, path=str(data), task_type="nli", num_negatives=K - 1,
                                      max_query_length=max_query_len or max_len, max_doc_length=max_len)]
    c.data.packing = bool(packing)
    c.plan.global_batch_size = B
    c.plan.steps = plan_steps
    c.loss.temperature = TEMPERATURE
    c.loss.tiled = bool(tiled)
    c.train.gradcache_chunk = int(chunk)
    c.train.dropout = bool(dropout)
    c.eval.tasks, c.eval.every, c.eval.best_metric, c.eval.before = (), 0, "", False
    c.export.at_end = False
    from jaxembed import config as cfglib
    from jaxembed.data.store import write_store

    store = Path(store)
    if not (store / "manifest.json").exists():  # one store per K, shared by every worker of the call
        write_store(cfglib.data_section(c), store)
    c.data.store = str(store)
    return c


def make_runs(c, workdir: Path):
    """-> (packed Run, padded Run) of one config: the same model, store and plan; only the batch layout differs."""
    import dataclasses

    from jaxembed.train import setup

    c.data.packing = True
    packed = setup(c, workdir)
    c2 = c.copy_and_resolve_references()
    c2.data.packing = False
    return packed, dataclasses.replace(packed, config=c2, packing=None)


def loader_of(run, name: str):
    """The trainer's loader over the run's plan (power-of-two length buckets, as train.length_buckets='pow2')."""
    from jaxembed.data.pipeline import make_loader
    from jaxembed.train import step_table

    table = step_table(run, run.workdir / f"plan_lengths_{name}.npz", "pow2")
    return make_loader(run.store, run.plan, run.loaded.tokenizer, num_candidates=run.K, packing=run.packing,
                       step_table=table)


def choose_steps(padded_loader, look: int, take: int) -> tuple[list[int], dict]:
    """The first ``take`` steps among the plan's first ``look`` whose padded shape is the most common one (one
    compilation per setting; at a large global batch almost every step pads to the longest bucket) -> (steps,
    the padded shapes' counts)."""
    shapes = [tuple(int(x) for x in padded_loader.batcher.shape(s)) for s in range(look)]
    counts = collections.Counter(shapes)
    top = counts.most_common(1)[0][0]
    steps = [s for s, sh in enumerate(shapes) if sh == top][:take]
    return steps, {"padded_shapes": {str(list(k)): v for k, v in counts.most_common()}, "chosen_shape": list(top),
                   "looked_at_steps": look}


def natural_texts(run, steps: list[int]) -> list[dict[str, list[str]]]:
    """The texts of ``steps`` as the loader builds them (the chosen positive and negatives): per step
    {"anchor": [...], "positive": [...], "negative_1": [...], ...} for sentence-transformers."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared _harness
    from _harness.recipe import loader_tables, step_items

    plan, store = run.plan, run.store
    tables = loader_tables(store, plan, run.loaded.tokenizer, run.K)
    G, K = plan.global_batch_size, tables.K
    out = []
    for s in steps:
        q, d, _, _ = step_items(tables, store, plan, s)
        cols = {"anchor": [t for t, _ in q]}
        for j in range(K):
            cols["positive" if j == 0 else f"negative_{j}"] = [
                d[r * K + j][0] if d[r * K + j] is not None else "" for r in range(G)]
        out.append(cols)
    return out


def synthetic_ids(rows: int, length: int, vocab: int, seed: int) -> np.ndarray:
    """int32 [rows, length] token ids in [1000, min(vocab, 30000)): distinct rows, no false negatives."""
    rng = np.random.default_rng(seed)
    return rng.integers(1000, min(vocab, 30000), size=(rows, length), dtype=np.int32)


def fixed_batch(template: dict, B: int, K: int, lq: int, ld: int, vocab: int, seed: int = 0) -> dict:
    """A padded host batch of B queries (lq tokens) and B*K candidates (ld tokens), every token real, from a padded
    loader batch ``template`` (its keys; per-row arrays tiled to B / B*K rows): random token ids, distinct
    hashes (the false-negative masks mask nothing)."""
    assert K >= 2, "a fixed batch needs a hard negative (K >= 2)"
    b0 = int(template["query_prompt_length"].shape[0])
    out = {}
    for k, v in template.items():
        v = np.asarray(v)
        if v.ndim and v.shape[0] == b0 * K:  # per candidate
            out[k] = np.resize(v, (B * K,) + v.shape[1:])
        elif v.ndim and v.shape[0] == b0:  # per query
            out[k] = np.resize(v, (B,) + v.shape[1:])
        else:
            out[k] = v
    n = B * K
    out.update(query_input_ids=synthetic_ids(B, lq, vocab, seed + 1), query_attention_mask=np.ones((B, lq), np.int32),
               doc_input_ids=synthetic_ids(n, ld, vocab, seed + 2), doc_attention_mask=np.ones((n, ld), np.int32),
               query_prompt_length=np.zeros(B, np.int32), doc_prompt_length=np.zeros(n, np.int32),
               doc_valid=np.ones(n, bool))
    if "doc_hash" in out:
        out["doc_hash"] = np.stack([np.arange(n, dtype=np.uint32) + 1, np.zeros(n, np.uint32)], 1)
    if "query_hash" in out:
        out["query_hash"] = np.stack([np.arange(B, dtype=np.uint32) + 1, np.ones(B, np.uint32)], 1)
    if "example_index" in out:
        out["example_index"] = np.arange(B, dtype=out["example_index"].dtype)
    return out


# ------------------------------------------------------------------------------------------------ FLOPs


def text_lengths(batch: dict) -> np.ndarray:
    """Real tokens of every text of a host batch (padded or packed; an empty candidate slot counts 0)."""
    if "pack_text_len" in batch:
        return np.asarray(batch["pack_text_len"])
    if "query_pack_text_len" in batch:
        return np.concatenate([batch["query_pack_text_len"], batch["doc_pack_text_len"]])
    q = np.asarray(batch["query_attention_mask"]).sum(1)
    d = np.asarray(batch["doc_attention_mask"]).sum(1) * np.asarray(batch["doc_valid"], bool)
    return np.concatenate([q, d])


def real_flops(config, lengths, queries: int, candidates: int, dim: int, cached: bool = False) -> float:
    """Training FLOPs of the real tokens alone: every text at its own length (no padding, no packing neighbour),
    jaxembed.flops' per-token count (2 x matrix weights + 4 x layers x length x attention width per token), x3
    for forward + backward (x4 with the gradient cache's second forward), + the similarity matrix. The same count
    for every tool and layout: MFU on it is useful work per second."""
    from jaxembed.flops import attention_width, layer_matrix_params

    L = np.asarray(lengths, np.float64)
    enc = 2.0 * layer_matrix_params(config) * L.sum() + 4.0 * config.num_layers * attention_width(config) * \
        float((L * L).sum())
    return enc * (4.0 if cached else 3.0) + 3 * 2.0 * queries * candidates * dim


def padded_flops(config, rows_and_lengths, queries: int, candidates: int, dim: int, cached: bool = False) -> float:
    """Training FLOPs of the computed token slots: [(rows, padded length), ...] (jaxembed.flops.forward_flops)."""
    from jaxembed.flops import forward_flops

    enc = sum(forward_flops(config, r, L) for r, L in rows_and_lengths)
    return enc * (4.0 if cached else 3.0) + 3 * 2.0 * queries * candidates * dim


def peak_flops(device_kind: str, override: float | None = None) -> float | None:
    if override:
        return override
    from jaxembed.flops import peak_flops_for

    return peak_flops_for(device_kind)


# ------------------------------------------------------------------------------------------------ timing / memory


class Deadline:
    """Seconds left until an absolute time (time.time()); ``enough(s)``: at least s left."""

    def __init__(self, at: float):
        self.at = float(at)

    def left(self) -> float:
        return self.at - time.time()

    def enough(self, s: float) -> bool:
        return self.left() >= s


def xla_memory(compiled) -> dict:
    """The compiled step's buffers (XLA's memory analysis): arguments + outputs - aliased (donated) + temporaries,
    GiB; {} where the backend reports none."""
    try:
        m = compiled.memory_analysis()
        total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
        return {"xla_step_gib": total / 2**30, "xla_temp_gib": m.temp_size_in_bytes / 2**30,
                "xla_argument_gib": m.argument_size_in_bytes / 2**30}
    except Exception:  # noqa: BLE001 -- not every backend / version reports it
        return {}


def jax_device_peak_gib() -> float | None:
    from jaxembed.flops import device_memory_peak_gib

    return device_memory_peak_gib()


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for p in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy", "torch", "transformers",
              "sentence-transformers", "tokenizers", "jax-cuda13-plugin", "jax-cuda12-plugin"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    import flax

    out["flax_file"] = str(Path(flax.__file__).parent)
    out.update(cuda_versions())
    return out


def cuda_versions() -> dict:
    """CUDA and cuDNN as each framework reports them at run time (None where it has none: the CPU): JAX's CUDA
    plugin (jax._src.lib.cuda_versions: runtime, cuDNN, driver) and torch (torch.version.cuda, the build's;
    torch.backends.cudnn.version(), the loaded library's)."""
    out = {"jax_cuda_runtime": None, "jax_cudnn": None, "jax_cuda_driver": None, "torch_cuda": None,
           "torch_cudnn": None}
    try:
        from jax._src.lib import cuda_versions as cv
    except ImportError:
        cv = None
    if cv is not None:
        for key, fn in (("jax_cuda_runtime", "cuda_runtime_get_version"), ("jax_cudnn", "cudnn_get_version"),
                        ("jax_cuda_driver", "cuda_driver_get_version")):
            try:
                out[key] = getattr(cv, fn)()
            except Exception:  # noqa: BLE001 -- a plugin without that query (or no device): not reported
                pass
    try:
        import torch
    except ImportError:
        return out
    if torch.cuda.is_available():
        out.update(torch_cuda=torch.version.cuda, torch_cudnn=torch.backends.cudnn.version())
    return out


def plan_view(c, workdir: Path):
    """The run's store, plan and tokenizer without its model (the sentence-transformers worker): a stand-in for a
    jaxembed.train.Run wherever only those are read (loader_of, natural_texts). The tokenizer is loaded as
    jaxembed.loading.load loads it."""
    from types import SimpleNamespace

    from jaxembed import config as cfglib
    from jaxembed import loading
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.tokenizer import Tokenizer

    store = Store.open(c.data.store)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    st = loading.read_sentence_transformers(Path(c.model.name))
    tok = Tokenizer.from_folder(st.transformer_dir, c.model.max_length, lowercase=st.do_lower_case)
    K = 1 + max(int(d.num_negatives) for d in store.datasets)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(config=c, workdir=Path(workdir), store=store, plan=plan,
                           loaded=SimpleNamespace(tokenizer=tok), K=K, packing=None)


# ------------------------------------------------------------------------------------------------ models at size


def config_folder(name: str, root: Path) -> Path:
    """A sentence-transformers folder of ``name``'s real config WITHOUT weights (part 6: a 7B folder could not be
    written and read back quickly on the GPU machine): config.json, the tokenizer (jaxembed.models.tiny's byte-level BPE
    in Qwen2's layout, or all-MiniLM-L6-v2's WordPiece for BERTs), mean pooling. Load it inside
    ``random_weights()``."""
    out = Path(root) / f"{name}_config_only"
    if (out / ".complete").is_file():
        return out
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.paths import demo_model_dir

    hf = dict(hf_config(name))
    src = tiny_model_dir("qwen2") if hf["model_type"] == "qwen2" else demo_model_dir()
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "jaxembed_*.json",
                                                            "README.md", ".complete"))
    hf.setdefault("architectures", ["Qwen2Model" if hf["model_type"] == "qwen2" else "BertModel"])
    (out / "config.json").write_text(json.dumps(hf, indent=1) + "\n", encoding="utf-8")
    pool = out / "1_Pooling" / "config.json"
    if pool.is_file():
        p = json.loads(pool.read_text(encoding="utf-8"))
        p["word_embedding_dimension"] = int(hf["hidden_size"])
        pool.write_text(json.dumps(p, indent=1) + "\n", encoding="utf-8")
    (out / "README.md").write_text(f"# {name}\n\n{MODEL_NOTES.get(name, name)} (benchmarks/gpu). No weights.\n")
    (out / ".complete").write_text("1\n")
    return out


class random_weights:
    """Within it, jaxembed.loading.load builds the model from its config with random weights (HF-style normal(0.02),
    seed 0) on the default device instead of reading the folder's weights, and LoRA's base fingerprint (a hash of
    every base weight: minutes for 7B) is a constant: for ``config_folder`` folders (part 6). Such a folder has no
    weights file, so the folder check before loading is off (its tokenizer is still checked on a probe sentence)."""

    def __enter__(self):
        from jaxembed import loading, lora, models

        self._saved = (loading.read_weights, models.load_weights, lora.base_fingerprint, loading.check_complete)
        loading.check_complete = lambda tdir: None
        loading.read_weights = lambda folder: ({}, f"{folder} (random weights: benchmarks/gpu)")
        models.load_weights = lambda config, tensors, source="": (models.init_model(config, seed=0), config)
        lora.base_fingerprint = lambda model: "random-weights"
        return self

    def __exit__(self, *exc):
        from jaxembed import loading, lora, models

        loading.read_weights, models.load_weights, lora.base_fingerprint, loading.check_complete = self._saved
        return False


# ------------------------------------------------------------------------------------------------ long texts

#: the longest-passage set of the shared data (eval/newsgroups_mini.jsonl: 20 Newsgroups posts, 737 WordPiece
#: tokens on average, 63 % over 512): only its token counts are used (no text is trained on), carried to the
#: device as data/long/lengths.json by prepare.sh
LONG_SOURCE = "eval/newsgroups_mini.jsonl"
LONG_FILE = "long/lengths.json"


def long_lengths() -> dict:
    """{"source", "tokenizer", "lengths": [...]}: the WordPiece token count (all-MiniLM-L6-v2's tokenizer, [CLS] and
    [SEP] included, no truncation) of every text of LONG_SOURCE; read from the carried ``LONG_FILE`` when the data
    folder has it (the device), else computed from the shared set."""
    from jaxembed import paths

    base = paths.shared_data_dir()
    f = base / LONG_FILE
    if f.is_file():
        return json.loads(f.read_text(encoding="utf-8"))
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(paths.demo_model_dir() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    texts = [json.loads(line)["text"] for line in open(base / LONG_SOURCE, encoding="utf-8") if line.strip()]
    return {"source": LONG_SOURCE, "tokenizer": "all-MiniLM-L6-v2 WordPiece",
            "lengths": [len(e.ids) for e in tok.encode_batch(texts)]}


def _single_token_words(folder: Path) -> list[str]:
    """Words the folder's tokenizer turns into exactly one token each (WordPiece: whole lowercase words; byte-level
    BPE: space-prefixed ones), so that a text of n of them is n tokens plus the specials."""
    import re

    import tokenizers

    vocab = tokenizers.Tokenizer.from_file(str(Path(folder) / "tokenizer.json")).get_vocab()
    bpe = sorted(w[1:] for w in vocab if re.fullmatch(r"\u0120[a-z]{3,}", w))
    return bpe or sorted(w for w in vocab if re.fullmatch(r"[a-z]{3,}", w))


def long_data_file(root: Path, folder: Path, *, rows: int, cap: int, K: int = 2, seed: int = 0,
                   query_lengths=None) -> tuple[Path, dict]:
    """A JSONL of ``rows`` rows (query, a positive and K-2 hard negatives) whose documents have the token counts of
    ``long_lengths()`` drawn with replacement (seed) and cut at ``cap``, and whose queries have the natural
    set's query lengths (``query_lengths``: a sample; default 8-32 tokens): texts of random single-token words
    of the model folder's tokenizer (distinct rows: no false negatives). -> (path, its length statistics)."""
    ll = long_lengths()
    rng = np.random.default_rng(seed)
    words = np.asarray(_single_token_words(folder))
    lengths = np.asarray(ll["lengths"])
    ql = np.asarray(query_lengths if query_lengths is not None else rng.integers(8, 33, 256))
    out = Path(root) / f"long_{Path(folder).name}_{rows}x{K}_{cap}_{seed}.jsonl"
    docs = np.minimum(rng.choice(lengths, size=(rows, K)), cap)
    qs = rng.choice(ql, size=rows)
    if not out.is_file():
        text = lambda n: " ".join(rng.choice(words, size=max(int(n) - 2, 1)))  # - [CLS] / [SEP] (or EOS)
        lines = [json.dumps({"query": text(q), "pos": [text(d[0])], "neg": [text(x) for x in d[1:]]})
                 for q, d in zip(qs, docs)]
        Path(root).mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, out)
    stats = {"source": ll["source"], "tokenizer": ll["tokenizer"], "texts_in_source": len(lengths),
             "source_mean": float(lengths.mean()), "source_p50": float(np.median(lengths)),
             "source_over_cap": float((lengths > cap).mean()), "cap": cap, "doc_mean": float(docs.mean()),
             "doc_at_cap": float((docs >= cap).mean()), "query_mean": float(qs.mean())}
    return out, stats


def with_row_length(run, row_length: int):
    """The run packing its rows at ``row_length`` slots (part 5): the Packing's shortest row raised to it, so the
    cost rule (``jaxembed.data.pack_shapes``) takes it whenever it holds the longest text."""
    import dataclasses

    return dataclasses.replace(run, packing=dataclasses.replace(run.packing, min_row_length=int(row_length)))


def segment_bound(hosts: list[dict]) -> int:
    """The most runs of equal segment ids (texts, and the padding run) in any packed row of ``hosts``: the
    cuDNN kernel's segment bound (``jaxembed.models.attention.segment_runs(max_runs=...)``) for those batches."""
    m = 1
    for h in hosts:
        for k, v in h.items():
            if k.endswith("segment_ids"):
                ids = np.asarray(v)
                runs = 1 + (ids[:, 1:] != ids[:, :-1]).sum(axis=1)
                m = max(m, int(runs.max()))
    return m


def plan_segment_bound(table: dict, lengths: np.ndarray) -> int:
    """The segment bound a whole plan guarantees from its pack table alone: a row of L slots holds at most
    L // (shortest text) texts, plus one padding run."""
    L = int(np.asarray(table["row_length"]).max())
    return L // max(int(np.min(lengths)), 1) + 1


class forced_attention:
    """Within it, every attention call of the model runs ``kernel`` (xla / cudnn / pallas / te), whatever
    model.attention says: a model built once is lowered with each kernel (part 5). ``max_runs``: cuDNN's segment
    bound. Lower inside it, compile anywhere."""

    def __init__(self, kernel: str, max_runs: int | None = None):
        self.kernel, self.max_runs = kernel, max_runs

    def __enter__(self):
        import functools

        from jaxembed.models import attention as A

        self._saved = (A.attention, A.cudnn_attention)
        orig, kernel = A.attention, self.kernel

        def forced(*a, implementation="xla", **kw):
            return orig(*a, implementation=kernel, **kw)

        A.attention = forced
        if self.max_runs:
            A.cudnn_attention = functools.partial(self._saved[1], max_runs=self.max_runs)
        return self

    def __exit__(self, *exc):
        from jaxembed.models import attention as A

        A.attention, A.cudnn_attention = self._saved
        return False
