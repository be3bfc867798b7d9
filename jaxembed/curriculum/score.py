"""The ``jaxembed score`` job (Data-CUBE 3.1, 3.2): encode a store's instructed queries and documents with a reference
model, then write the task similarity (Eq. 4, 5) of its units and phi (Eq. 8) per example (``run_score``); the
store of a run config (``config_store``); the summary's terminal lines (``format_score``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from jaxembed.runs import atomic_files
from jaxembed.errors import UserError

SCORE_FILES = ("task_similarity.npz", "task_similarity.png", "scores.npz", "score_summary.json")


def write_json(path: Path, obj) -> None:
    """JSON written atomically (a temporary file renamed into place); the curriculum jobs' files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)


def _dataset_texts(store, d: int, indices: np.ndarray | None, need_docs: bool):
    """Unique query texts (+ example -> row) and, with need_docs, unique document texts with each example's positive
    and negative rows. Reads the store in chunks."""
    info = store.datasets[d]
    idx = np.arange(info.size) if indices is None else np.asarray(indices, np.int64)
    q_rows, q_index, d_index = [], {}, {}
    pos_ids, neg_ids = [], []
    for s in range(0, len(idx), 8192):
        for e in store.examples(d, idx[s:s + 8192].tolist()):
            q_rows.append(q_index.setdefault(e["query"], len(q_index)))
            if need_docs:
                p = [d_index.setdefault(t, len(d_index)) for t in e["pos"]]
                n = [d_index.setdefault(t, len(d_index)) for t in e["neg"]]
                pos_ids.append(p)
                neg_ids.append(n)
    q_texts = list(q_index)
    d_texts = list(d_index)
    return np.array(q_rows, np.int64), q_texts, d_texts, pos_ids, neg_ids



def run_score(encoder, store, out, *, unit: str = "dataset", n_task_queries: int = 1000, seed: int = 0,
              negatives: str = "min", sampled_negatives: int = 7, similarity_only: bool = False,
              shard_size: int = 2048, batch_size: int = 64, model_key: str | None = None, model_name: str = "",
              progress: bool | None = None) -> dict:
    """The ``jaxembed score`` job on an opened Store with an Encoder: writes SCORE_FILES into ``out`` and returns the
    summary. Embeddings are cached under ``out/cache`` (per dataset, per shard of ``shard_size`` texts)."""
    from jaxembed.curriculum import difficulty as dif
    from jaxembed.curriculum import similarity as sim
    from jaxembed.mining.encoding import encode_texts, limit, model_fingerprint, normalize, progress_bar

    if negatives not in dif.REDUCE:
        raise UserError(f"--negatives {negatives!r}: one of {', '.join(dif.REDUCE)}")
    if shard_size < 1 or batch_size < 1:
        raise UserError("--shard-size and --batch-size must be positive")
    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    infos = store.datasets
    sizes = [int(i.size) for i in infos]
    units = sim.curriculum_units(infos, unit)
    samples = sim.sample_queries(units, sizes, n_task_queries, seed)
    model_key = model_key or model_fingerprint(encoder)
    tok = getattr(encoder, "tokenizer", None)
    cap = getattr(tok, "max_length", None)
    mote = getattr(encoder, "mote", None) is not None  # a MoTE reference model: each text through its task's expert

    def ekw(info, side):
        return {"task": info.task_type, "side": side} if mote else None

    # pass 1: the texts of every dataset
    per = []
    for d, info in enumerate(infos):
        indices = None
        if similarity_only:
            indices = np.unique(np.concatenate([s[s[:, 0] == d, 1] for s in samples.values()] + [np.zeros(0,
                                                                                                  np.int64)]))
        q_rows, q_texts, d_texts, pos_ids, neg_ids = _dataset_texts(store, d, indices, not similarity_only)
        per.append(dict(indices=indices, q_rows=q_rows, q_texts=q_texts, d_texts=d_texts, pos_ids=pos_ids,
                        neg_ids=neg_ids))
    total = sum(len(p["q_texts"]) + len(p["d_texts"]) for p in per)

    # pass 2: encode (cached per shard)
    cache = out / "cache"
    t1 = time.time()
    with progress_bar(total, "score: encode", progress) as bar:
        for d, (info, p) in enumerate(zip(infos, per)):
            bar.set_postfix_str(info.name)
            p["Q"] = normalize(encode_texts(
                encoder, p["q_texts"], prompt=info.query_instruction, max_length=limit(info.max_query_length, cap),
                batch_size=batch_size, cache_dir=cache, name=f"{info.name}.queries", shard_size=shard_size,
                model_key=model_key, bar=bar, encode_kw=ekw(info, "query")))
            if not similarity_only:
                p["D"] = normalize(encode_texts(
                    encoder, p["d_texts"], prompt=info.doc_instruction, max_length=limit(info.max_doc_length, cap),
                    batch_size=batch_size, cache_dir=cache, name=f"{info.name}.docs", shard_size=shard_size,
                    model_key=model_key, bar=bar, encode_kw=ekw(info, "document")))
    t_enc = time.time() - t1

    # Eq. 4 / 5 over the units
    reps, counts = [], []
    for u, members in units.items():
        s = samples[u]
        rows = []
        for d in members:
            ex = s[s[:, 0] == d, 1]
            if ex.size == 0:
                continue
            p = per[d]
            pos_in = ex if p["indices"] is None else np.searchsorted(p["indices"], ex)
            rows.append(p["Q"][p["q_rows"][pos_in]])
        emb = np.concatenate(rows)
        reps.append(sim.task_representation(emb))
        counts.append(emb.shape[0])
    S = sim.task_similarity(np.stack(reps))
    names = list(units)
    meta = {"model": model_name, "model_key": model_key, "seed": seed, "n_task_queries": n_task_queries,
            "store": str(Path(store.path).resolve())}
    sim.save_similarity(out / "task_similarity.npz", S, names, unit, counts, meta)
    renderer = sim.render_heatmap(S, names, out / "task_similarity.png",
                                  title=f"task similarity: {len(names)} {unit}s")

    # Eq. 8 per example
    datasets = []
    scores = {}
    for d, (info, p) in enumerate(zip(infos, per)):
        entry = {"name": info.name, "task": info.task, "task_type": info.task_type, "size": info.size,
                 "query_texts": len(p["q_texts"]), "doc_texts": len(p["d_texts"])}
        if not similarity_only:
            n_ex = len(p["pos_ids"])
            own = np.array([len(x) > 0 for x in p["neg_ids"]])
            neg_ids = p["neg_ids"]
            if not own.all():
                sampled = dif.sampled_negatives(p["pos_ids"], sampled_negatives, seed * 1_000_003 + d)
                neg_ids = [x if o else s for x, o, s in zip(neg_ids, own, sampled)]
            none = np.array([len(x) == 0 for x in neg_ids])
            pos_off = np.concatenate([[0], np.cumsum([len(x) for x in p["pos_ids"]])])
            neg_off = np.concatenate([[0], np.cumsum([len(x) for x in neg_ids])])
            ex_pos = np.repeat(np.arange(n_ex), np.diff(pos_off))
            ex_neg = np.repeat(np.arange(n_ex), np.diff(neg_off))
            flat_pos = np.array([i for x in p["pos_ids"] for i in x], np.int64)
            flat_neg = np.array([i for x in neg_ids for i in x], np.int64)
            ps = dif.pair_similarity(p["Q"], p["D"], p["q_rows"][ex_pos], flat_pos)
            ns = dif.pair_similarity(p["Q"], p["D"], p["q_rows"][ex_neg], flat_neg)
            if none.any():  # a one-example dataset has nothing to compare with: phi = sim(q, p) there
                pos_mean = dif.segment_reduce(ps, pos_off, "mean")
                neg_red = dif.segment_reduce(ns, neg_off, "max" if negatives == "min" else "mean")
                v = np.where(none, pos_mean, pos_mean - np.nan_to_num(neg_red))
            else:
                v = dif.phi(ps, pos_off, ns, neg_off, negatives)
            scores[info.name] = v
            entry.update(phi=dif.phi_stats(v), negatives_own=int(own.sum()),
                         negatives_sampled=int((~own & ~none).sum()), negatives_none=int(none.sum()))
        datasets.append(entry)
    if not similarity_only:
        atomic_files.write_with(out / "scores.npz", lambda t: np.savez(t, **scores), suffix=".npz")
    summary = {"model": model_name, "model_key": model_key, "store": str(Path(store.path).resolve()),
               "unit": unit, "units": {u: [infos[d].name for d in m] for u, m in units.items()},
               "n_task_queries": n_task_queries, "queries_per_unit": dict(zip(names, counts)), "seed": seed,
               "negatives": negatives, "sampled_negatives": sampled_negatives, "similarity_only": similarity_only,
               "heatmap": renderer, "datasets": datasets, "similarity": np.round(S, 5).tolist(),
               "texts_encoded": total, "seconds_encode": round(t_enc, 2), "seconds": round(time.time() - t0, 2),
               "files": [f for f in SCORE_FILES if (out / f).exists() or f == "score_summary.json"]}
    write_json(out / "score_summary.json", summary)
    return summary


def load_run_config(spec: str):
    """The run config of ``jaxembed score --config``; it needs a data section."""
    from jaxembed import config as cfglib

    config = cfglib.load_config_file(spec)
    if "data" not in config:
        raise UserError(f"--config {spec}: no data section (fix: a run config, e.g. the recipe datacube:tiny)")
    return config


def config_store(config, spec: str, out):
    """The store a run config trains on: its ``data.store``, else its data config prepared into ``OUT/store``
    (once: an existing store there is reused)."""
    from jaxembed import config as cfglib
    from jaxembed.data.store import Store

    if config.data.get("store"):
        return Store.open(config.data.store)
    sdir = Path(out) / "store"
    if not (sdir / "manifest.json").exists():
        from jaxembed.data.store import write_store

        print(f"preparing the data config of {spec} into {sdir}")
        write_store(cfglib.data_section(config), sdir)
    return Store.open(sdir)


def config_unit(config) -> str:
    """The unit a run config's plan orders (``plan.curriculum.unit``, else dataset), so that its curriculum finds
    its units."""
    cur = (config.get("plan") or {}).get("curriculum") or {} if config is not None else {}
    return str(cur.get("unit") or "dataset")


def format_score(s: dict, out, similarity_only: bool = False) -> str:
    """The terminal lines of a score summary: phi per dataset, then the files written."""
    out = Path(out)
    lines = []
    if not similarity_only:
        w = max(len(d["name"]) for d in s["datasets"])
        lines.append(f"{'dataset':<{w}}  {'size':>7}  {'phi mean':>8}  {'p10':>7}  {'median':>7}  {'< 0':>6}  "
                     "negatives")
        for d in s["datasets"]:
            ph = d["phi"]
            src = "own" if not d["negatives_sampled"] else f"sampled ({d['negatives_sampled']})"
            lines.append(f"{d['name']:<{w}}  {d['size']:>7}  {ph['mean']:>8.3f}  {ph['p10']:>7.3f}  "
                         f"{ph['median']:>7.3f}  {ph['share_below_0']:>6.1%}  {src}")
    lines.append(f"task similarity over {len(s['units'])} {s['unit']}s -> {out / 'task_similarity.npz'} "
                 f"(heat map {out / 'task_similarity.png'}: {s['heatmap']})")
    lines.append(f"wrote {', '.join(s['files'])} in {out} ({s['texts_encoded']} texts, encode "
                 f"{s['seconds_encode']:.1f}s, total {s['seconds']:.1f}s)")
    return "\n".join(lines)
