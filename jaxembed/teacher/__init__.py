"""The teacher-score job (``jaxembed teacher-score``, parsed in ``jaxembed/teacher/cli.py``): a teacher embedding
model's scores of each (query, candidate) pair of a triplets file, written as FlagEmbedding's ``pos_scores`` /
``neg_scores`` (what ``loss.distill`` trains on, docs/losses.md)::

    jaxembed teacher-score --model TEACHER --input train.jsonl --out train.scored.jsonl [--batch-size 64]
        [--prompt P | --prompt-name NAME] [--doc-prompt P | --doc-prompt-name NAME] [--max-length N] [--dtype D]

The input is JSON Lines triplets (``query``, ``pos`` [...], ``neg`` [...], any other fields), read and checked in
full before the model loads (a bad record is one line naming file, line and field). Each output record is the input
record with ``pos_scores`` / ``neg_scores`` (the teacher's cosine similarity of the query with each positive /
negative, in order) set, in input order.

The teacher is a bi-encoder jaxembed loads (``jaxembed.encode.Encoder``): query and candidates are encoded apart, the
score is their cosine. Scores are in [-1, 1], the student's scale: KL distillation then takes the batch's
temperature for the teacher too (``loss.distill_temperature=0``), MarginMSE compares margins directly.

Writing: records go, a chunk at a time, to ``OUT.partial`` (with ``OUT.partial.json`` naming the input, model and
settings); the complete file is renamed to OUT at the end (atomic: OUT is never half written). A killed run resumes:
the same command continues after the last complete record of the partial file (one that belongs to other settings
is started over).
"""


from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from jaxembed.errors import InputError, UserError

CHUNK_RECORDS = 512  # records scored and appended to the partial file at a time


# ---------------------------------------------------------------------------------------------------- input

def read_triplets(path: str) -> list[dict]:
    """Every record of a triplets JSON Lines file, checked: ``query`` a text, ``pos`` a non-empty list of texts,
    ``neg`` (optional) a list of texts. The first bad record is an InputError naming file, line and field."""
    from jaxembed.data.readers import Skip, iter_json_objects
    from jaxembed.data.jsonl import check_input_file

    check_input_file(path)
    out = []
    for line, obj in iter_json_objects(path):
        if isinstance(obj, Skip):
            raise obj.error()
        q = obj.get("query")
        if not isinstance(q, str) or not q.strip():
            raise InputError(path, line, "expected a non-empty text" if "query" in obj else "missing",
                             'each record needs "query": "text", "pos": ["text", ...]', field="query")
        for key, need in (("pos", 1), ("neg", 0)):
            v = obj.get(key, [] if key == "neg" else None)
            if not isinstance(v, list) or len(v) < need or not all(isinstance(t, str) and t.strip() for t in v):
                raise InputError(path, line, f"expected a list of non-empty texts{' (at least one)' if need else ''}",
                                 f'write "{key}": ["text", ...]', field=key)
        out.append(obj)
    if not out:
        raise InputError(path, None, "no records", "give a JSON Lines file of triplets")
    return out


# ---------------------------------------------------------------------------------------------------- scoring

def score_records(encoder, records: list[dict], *, query_prompt: str = "", doc_prompt: str = "",
                  batch_size: int = 64, max_length: int | None = None) -> list[tuple[list[float], list[float]]]:
    """(pos_scores, neg_scores) of each record: cosine of the query's and each candidate's embedding (each distinct
    text encoded once)."""
    queries = sorted({r["query"] for r in records})
    docs = sorted({t for r in records for t in r["pos"] + list(r.get("neg") or [])})
    kw = dict(batch_size=batch_size, max_length=max_length, progress=False)
    qe = _unit(encoder.encode(queries, prompt=query_prompt, **kw))
    de = _unit(encoder.encode(docs, prompt=doc_prompt, **kw))
    qi = {t: i for i, t in enumerate(queries)}
    di = {t: i for i, t in enumerate(docs)}
    out = []
    for r in records:
        q = qe[qi[r["query"]]]
        cos = lambda texts: [round(float(de[di[t]] @ q), 6) for t in texts]
        out.append((cos(r["pos"]), cos(list(r.get("neg") or []))))
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# ---------------------------------------------------------------------------------------------------- files

def _settings(input, max_length, dtype, model_folder: Path, query_prompt: str, doc_prompt: str) -> dict:
    st = Path(input).stat()
    return {"input": str(Path(input).resolve()), "input_size": st.st_size, "input_mtime_ns": st.st_mtime_ns,
            "model": str(Path(model_folder).resolve()), "query_prompt": query_prompt, "doc_prompt": doc_prompt,
            "max_length": max_length, "dtype": dtype}


def _resume(partial: Path, side: Path, settings: dict) -> int:
    """Complete records already in the partial file written with the same settings (a torn last line is cut);
    0 (and a fresh partial file) otherwise."""
    try:
        same = json.loads(side.read_text(encoding="utf-8")) == settings
    except (OSError, ValueError):
        same = False
    if not same or not partial.is_file():
        partial.write_bytes(b"")
        side.write_text(json.dumps(settings), encoding="utf-8")
        return 0
    data = partial.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep != len(data):
        with open(partial, "r+b") as f:
            f.truncate(keep)
    return data[:keep].count(b"\n")


def score_file(model, input, out, *, batch_size: int = 64, prompt: str | None = None, prompt_name: str | None = None,
               doc_prompt: str | None = None, doc_prompt_name: str | None = None, max_length: int | None = None,
               dtype: str = "float32", progress: bool = True) -> dict:
    """The teacher-score job (module docstring): ``input`` triplets -> ``out`` with pos_scores / neg_scores, by
    ``model``. -> {"out", "records", "resumed" (records found done), "seconds"}."""
    from tqdm import tqdm

    from jaxembed import loading
    from jaxembed.encode import Encoder
    from jaxembed.runs.outputs import check_output

    if batch_size <= 0:
        raise UserError(f"--batch-size must be positive, got {batch_size}")
    out = check_output(out, "file", "--out")
    if Path(input).resolve() == out.resolve():
        raise UserError(f"--out {out}: the same file as --input (fix: write the scores to a new file)")
    records = read_triplets(input)  # the whole input is checked before the model loads
    t0 = time.time()
    kw = {"dtype": dtype}
    if max_length:
        kw["max_length"] = max_length
    loaded = loading.load(model, **kw)
    encoder = Encoder.from_loaded(loaded)
    query_prompt = encoder.resolve_prompt(prompt, prompt_name)
    doc_prompt = encoder.resolve_prompt(doc_prompt, doc_prompt_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial, side = Path(f"{out}.partial"), Path(f"{out}.partial.json")
    done = _resume(partial, side, _settings(input, max_length, dtype, loaded.source, query_prompt, doc_prompt))
    if done > len(records):
        done = 0
        partial.write_bytes(b"")
    show = progress and sys.stderr.isatty()
    with tqdm(total=len(records), initial=done, desc="teacher-score", unit=" records", disable=not show) as bar, \
            open(partial, "a", encoding="utf-8") as f:
        for start in range(done, len(records), CHUNK_RECORDS):
            chunk = records[start:start + CHUNK_RECORDS]
            scores = score_records(encoder, chunk, query_prompt=query_prompt, doc_prompt=doc_prompt,
                                   batch_size=batch_size, max_length=max_length)
            for r, (ps, ns) in zip(chunk, scores):
                f.write(json.dumps({**r, "pos_scores": ps, "neg_scores": ns}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(chunk))
    os.replace(partial, out)
    side.unlink(missing_ok=True)
    return {"out": out, "records": len(records), "resumed": done, "seconds": time.time() - t0}
