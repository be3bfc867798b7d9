"""``jaxembed teacher-score``: a teacher embedding model's scores of each (query, candidate) pair of a triplets file,
written as FlagEmbedding's ``pos_scores`` / ``neg_scores`` (what ``loss.distill`` trains on, docs/losses.md)::

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

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from jaxembed.errors import InputError, UserError

CHUNK_RECORDS = 512  # records scored and appended to the partial file at a time


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "teacher-score", help="a teacher embedding model's pos_scores / neg_scores for a triplets file (distillation)",
        description="Score each query against its positives and negatives with a teacher bi-encoder (cosine) and "
                    "write the records with pos_scores / neg_scores, for loss.distill. Resumable: rerun the same "
                    "command after a stop.")
    p.add_argument("--model", required=True, help="teacher model folder (HF / sentence-transformers / jaxembed "
                                                  "export) or hub id")
    p.add_argument("--input", required=True, help="triplets, JSON Lines (query, pos [...], neg [...])")
    p.add_argument("--out", required=True, help="output JSON Lines: the records with pos_scores / neg_scores")
    p.add_argument("--batch-size", type=int, default=64, help="texts per forward pass (default 64)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--prompt", default=None, help="instruction prefixed to every query")
    g.add_argument("--prompt-name", default=None, help="a named prompt of the teacher for the queries")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--doc-prompt", default=None, help="instruction prefixed to every positive and negative")
    g.add_argument("--doc-prompt-name", default=None, help="a named prompt of the teacher for the documents")
    p.add_argument("--max-length", type=int, default=None, help="truncate texts to N tokens (default: the model's)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="computation dtype")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_teacher_score)


# ---------------------------------------------------------------------------------------------------- input

def read_triplets(path: str) -> list[dict]:
    """Every record of a triplets JSON Lines file, checked: ``query`` a text, ``pos`` a non-empty list of texts,
    ``neg`` (optional) a list of texts. The first bad record is an InputError naming file, line and field."""
    from jaxembed.data.formats import Skip, iter_json_objects
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

def _settings(args, model_folder: Path, query_prompt: str, doc_prompt: str) -> dict:
    st = Path(args.input).stat()
    return {"input": str(Path(args.input).resolve()), "input_size": st.st_size, "input_mtime_ns": st.st_mtime_ns,
            "model": str(Path(model_folder).resolve()), "query_prompt": query_prompt, "doc_prompt": doc_prompt,
            "max_length": args.max_length, "dtype": args.dtype}


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


def cmd_teacher_score(args) -> int:
    from tqdm import tqdm

    from jaxembed import hf
    from jaxembed.encode import Encoder
    from jaxembed.outputs import check_output

    if args.batch_size <= 0:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    out = check_output(args.out, "file", "--out")
    if Path(args.input).resolve() == out.resolve():
        raise UserError(f"--out {out}: the same file as --input (fix: write the scores to a new file)")
    records = read_triplets(args.input)  # the whole input is checked before the model loads
    t0 = time.time()
    kw = {"dtype": args.dtype}
    if args.max_length:
        kw["max_length"] = args.max_length
    loaded = hf.load(args.model, **kw)
    encoder = Encoder.from_loaded(loaded)
    query_prompt = encoder.resolve_prompt(args.prompt, args.prompt_name)
    doc_prompt = encoder.resolve_prompt(args.doc_prompt, args.doc_prompt_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial, side = Path(f"{out}.partial"), Path(f"{out}.partial.json")
    done = _resume(partial, side, _settings(args, loaded.source, query_prompt, doc_prompt))
    if done > len(records):
        done = 0
        partial.write_bytes(b"")
    show = not args.quiet and sys.stderr.isatty()
    with tqdm(total=len(records), initial=done, desc="teacher-score", unit=" records", disable=not show) as bar, \
            open(partial, "a", encoding="utf-8") as f:
        for start in range(done, len(records), CHUNK_RECORDS):
            chunk = records[start:start + CHUNK_RECORDS]
            scores = score_records(encoder, chunk, query_prompt=query_prompt, doc_prompt=doc_prompt,
                                   batch_size=args.batch_size, max_length=args.max_length)
            for r, (ps, ns) in zip(chunk, scores):
                f.write(json.dumps({**r, "pos_scores": ps, "neg_scores": ns}, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            bar.update(len(chunk))
    os.replace(partial, out)
    side.unlink(missing_ok=True)
    resumed = f", resumed after {done} records" if done else ""
    print(f"wrote {out}: {len(records)} records with pos_scores / neg_scores (teacher {args.model}, cosine) in "
          f"{time.time() - t0:.1f}s{resumed}")
    return 0
