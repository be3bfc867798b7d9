"""The pieces the GPU benchmark's workers share (benchmarks/gpu/workers.py): model folders with random weights of
real configs, the natural-length data and its batches, synthetic fixed-length batches, FLOP counts and timing.

Imported only in worker processes (it imports jax and jaxembed); benchmarks/gpu/bench.py, the entry, does not.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
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
#: name -> what the folder holds (tokenizer: all-MiniLM-L6-v2's WordPiece for the BERTs; for Qwen2 the byte-level
#: BPE of jaxembed.models.tiny.qwen2_tokenizer, in Qwen2's layout: Qwen2's own cannot be fetched offline)
MODEL_NOTES = {
    "minilm": "all-MiniLM-L6-v2's config (6 x 384), random weights",
    "bert-base": "BERT-base config (12 x 768, 110M parameters), random weights",
    "bert-large": "BERT-large config (24 x 1024, 335M parameters), random weights",
    "qwen2-0.5b": "Qwen2-0.5B config (24 x 896, GQA 14/2, 494M parameters), random weights, causal; tokenizer: a "
                  "16k byte-level BPE in Qwen2's layout (more tokens per text than Qwen2's own)",
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
    return {"bert-base": BERT_BASE, "bert-large": BERT_LARGE, "qwen2-0.5b": QWEN2_05B}[name]


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
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


def run_config(folder: Path, B: int, *, data: Path, store: Path, K: int = 2, packing: bool = True,
               chunk: int = 0, tiled: bool = False, plan_steps: int = 40, dtype: str = "bfloat16"):
    """The trainer's config: the snli + wikiqa rows (task type nli: no instruction), 1 positive + K-1 hard
    negatives, every text at most MAX_LEN tokens, global batch B, AdamW (lr 2e-5, weight decay 0.01, clip 1.0),
    temperature 0.05, dropout on, ``dtype`` compute with float32 master weights."""
    from jaxembed.config import default_config
    from jaxembed.data.config import dataset_config

    c = default_config()
    c.model.name = str(folder)
    c.model.dtype = dtype
    c.model.max_length = MAX_LEN
    c.data.datasets = [dataset_config(name="snli_wikiqa", path=str(data), task_type="nli", num_negatives=K - 1,
                                      max_query_length=MAX_LEN, max_doc_length=MAX_LEN)]
    c.data.packing = bool(packing)
    c.plan.global_batch_size = B
    c.plan.steps = plan_steps
    c.loss.temperature = TEMPERATURE
    c.loss.tiled = bool(tiled)
    c.train.gradcache_chunk = int(chunk)
    c.train.dropout = True
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
    from jaxembed.train import pow2_lengths, step_table

    table = step_table(run, run.workdir / f"plan_lengths_{name}.npz")
    lengths = tuple(pow2_lengths(x) for x in (table["query_len"], table["doc_len"]))
    return make_loader(run.store, run.plan, run.loaded.tokenizer, lengths=lengths, num_candidates=run.K,
                       packing=run.packing, pack_table=table if run.packing is not None else None)


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
    from jaxembed.data.pipeline import _fetch, _row_items, _Tables

    plan, store = run.plan, run.store
    tables = _Tables(store.datasets, run.loaded.tokenizer, np.unique(plan.dataset_ids).tolist(), run.K)
    G, K = plan.global_batch_size, tables.K
    out = []
    for s in steps:
        ds, ex = plan.dataset_ids[s], plan.example_ids[s]
        q, d, _, _ = _row_items(tables, _fetch(store, ds, ex), ds, np.arange(G), s, plan.seed,
                                plan.config.get("negatives", "first"))
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
    return out


def plan_view(c, workdir: Path):
    """The run's store, plan and tokenizer without its model (the sentence-transformers worker): a stand-in for a
    jaxembed.train.Run wherever only those are read (loader_of, natural_texts). The tokenizer is loaded as
    jaxembed.hf.load loads it."""
    from types import SimpleNamespace

    from jaxembed import config as cfglib
    from jaxembed import hf
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.tokenizer import Tokenizer

    store = Store.open(c.data.store)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    st = hf.read_sentence_transformers(Path(c.model.name))
    tok = Tokenizer.from_folder(st.transformer_dir, c.model.max_length, lowercase=st.do_lower_case)
    K = 1 + max(int(d.num_negatives) for d in store.datasets)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    return SimpleNamespace(config=c, workdir=Path(workdir), store=store, plan=plan,
                           loaded=SimpleNamespace(tokenizer=tok), K=K, packing=None)
