"""False-negative judge (PEG, "Data": after mining the top-k hard negatives of each query with a retrieval model,
an LLM decides whether each negative is in fact relevant to the query; the relevant ones are removed).

``run_judge(JudgeConfig(input=..., out=...), llm)``:
- reads a mined dataset file (JSON Lines triplets: ``query``, ``pos``, ``neg``; field names configurable) and
  checks every record before any request is sent (a bad record is an InputError naming file, line and field);
- asks the LLM once per distinct (query, negative) pair (optionally showing a known positive as a reference):
  ``{"answers_query": true | false}``; a malformed verdict is asked again (``attempts``), then the pair is
  "undecided" and kept (``on_undecided='keep'``, the default) or dropped;
- writes the same records with the accepted negatives removed (every other field untouched; per-negative lists
  of the same length as ``neg``, such as BGE ``neg_scores``, are filtered alike), ``OUT.dropped.jsonl`` (every
  removed negative with its file line) and ``OUT.report.json`` (counts, client traffic, tokens, cost).
Rerunning the same command takes every verdict from the cache (``OUT.cache/responses.jsonl``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from jaxembed.data.jsonl import iter_jsonl
from jaxembed.errors import InputError, UserError
from jaxembed.synth.client import AnswerError, ChatClient, LLMConfig, ask_json

SYSTEM = "You are a careful relevance assessor for a search engine."

PROMPT = """Decide whether the passage answers the query, that is, whether a user who searched for the query \
would accept the passage as a correct result.
{instruction}
Query: {query}
{reference}
Passage: {passage}

Answer with a JSON object only, {{"answers_query": true}} or {{"answers_query": false}}. Do not explain."""


@dataclasses.dataclass
class JudgeConfig:
    input: str
    out: str
    query_field: str = "query"
    pos_field: str = "pos"
    neg_field: str = "neg"
    instruction_field: str = "prompt"   # a BGE task instruction, shown to the judge when present
    with_positive: bool = False         # show the record's first positive as a reference answer
    on_undecided: str = "keep"          # keep | drop a negative whose verdict could not be obtained
    attempts: int = 3
    drop_empty: bool = False            # remove records left with no negative
    cache: str = ""                     # '' = OUT.cache/responses.jsonl
    report: str = ""                    # '' = OUT with suffix .report.json

    def validate(self) -> None:
        if self.on_undecided not in ("keep", "drop"):
            raise UserError(f"judge: on_undecided = {self.on_undecided!r} is not one of keep, drop")
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise UserError(f"judge: attempts = {self.attempts!r} must be an integer >= 1")
        if Path(self.out).resolve() == Path(self.input).resolve():
            raise UserError(f"judge: --out {self.out} is the input file (fix: write to a new file)")

    def paths(self) -> dict[str, Path]:
        out = Path(self.out)
        stem = out.with_suffix("") if out.suffix == ".jsonl" else out
        return {"out": out, "dropped": Path(f"{stem}.dropped.jsonl"),
                "report": Path(self.report) if self.report else Path(f"{stem}.report.json"),
                "cache": Path(self.cache) if self.cache else Path(f"{stem}.cache") / "responses.jsonl"}


def _text(path: str, line: int, obj: dict, field: str, required: bool = True) -> str | None:
    if field not in obj:
        if not required:
            return None
        raise InputError(path, line, f"missing (keys present: {', '.join(sorted(obj)) or 'none'})",
                         "add the field or name it with --query-field / --neg-field", field=field)
    v = obj[field]
    if not isinstance(v, str) or not v.strip():
        raise InputError(path, line, "expected a non-empty string", "store the text as a JSON string", field=field)
    return v


def _text_list(path: str, line: int, obj: dict, field: str) -> list[str]:
    v = obj.get(field, [])
    if not isinstance(v, list) or not all(isinstance(x, str) and x.strip() for x in v):
        raise InputError(path, line, "expected a list of non-empty strings", f'write "{field}": ["text", ...]',
                         field=field)
    return v


def read_records(cfg: JudgeConfig) -> list[tuple[int, dict, str, list[str], str | None, str | None]]:
    """(line, record, query, negatives, first positive or None, instruction or None) of every record."""
    rows = []
    for i, obj in iter_jsonl(cfg.input):
        q = _text(cfg.input, i, obj, cfg.query_field)
        negs = _text_list(cfg.input, i, obj, cfg.neg_field)
        pos = _text_list(cfg.input, i, obj, cfg.pos_field) if cfg.pos_field in obj else []
        ins = obj.get(cfg.instruction_field)
        rows.append((i, obj, q, negs, pos[0] if pos else None, ins if isinstance(ins, str) and ins.strip() else None))
    return rows


def judge_messages(query: str, passage: str, reference: str | None = None,
                   instruction: str | None = None) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": PROMPT.format(
                query=query, passage=passage,
                instruction=f"The search task: {instruction}\n" if instruction else "",
                reference=f"A passage known to answer the query, for reference: {reference}\n" if reference else "")}]


def validate_verdict(value: Any) -> bool:
    if not isinstance(value, dict):
        raise AnswerError("not a JSON object", type(value).__name__)
    if "answers_query" not in value:
        raise AnswerError("missing key 'answers_query'")
    v = value["answers_query"]
    if not isinstance(v, bool):
        raise AnswerError("'answers_query' is not true or false")
    return v


def run_judge(cfg: JudgeConfig, llm: LLMConfig, *, client: ChatClient | None = None, log=print) -> dict:
    """Judge every (query, hard negative) pair, write the filtered file; returns the report."""
    cfg.validate()
    t0 = time.time()
    paths = cfg.paths()
    rows = read_records(cfg)  # every record checked before any request
    pairs: dict[tuple, tuple] = {}
    for _, _, q, negs, pos, ins in rows:
        for n in negs:
            pairs.setdefault((q, n, pos if cfg.with_positive else None, ins), None)
    keys = list(pairs)
    n_total = sum(len(r[3]) for r in rows)
    log(f"judging {len(keys)} distinct (query, negative) pairs ({n_total} negatives in {len(rows)} records)")
    own = client is None
    client = client or ChatClient(llm, paths["cache"])
    try:
        def ask(key):
            q, n, ref, ins = key
            return ask_json(client, judge_messages(q, n, ref, ins), validate_verdict, salt="judge",
                            attempts=cfg.attempts)

        verdicts = dict(zip(keys, client.map(ask, keys, desc="judge")))
    finally:
        if own:
            client.close()
    counts = Counter(records=len(rows), negatives=n_total, pairs_judged=len(keys))
    reasons = Counter()
    out_rows, dropped = [], []
    for line, obj, q, negs, pos, ins in rows:
        keep_idx = []
        for j, n in enumerate(negs):
            res = verdicts[(q, n, pos if cfg.with_positive else None, ins)]
            if res.ok:
                if res.value:
                    counts["accepted_dropped"] += 1
                    dropped.append({"line": line, "query": q, "negative": n, "verdict": "answers the query"})
                    continue
                counts["rejected_kept"] += 1
            else:
                reasons[res.reason] += 1
                if cfg.on_undecided == "drop":
                    counts["undecided_dropped"] += 1
                    dropped.append({"line": line, "query": q, "negative": n, "verdict": f"undecided: {res.reason}"})
                    continue
                counts["undecided_kept"] += 1
            keep_idx.append(j)
        new = dict(obj)
        new[cfg.neg_field] = [negs[j] for j in keep_idx]
        for k, v in obj.items():  # per-negative side lists (BGE neg_scores) follow the negatives
            if k != cfg.neg_field and isinstance(v, list) and len(v) == len(negs) and k.startswith(
                    cfg.neg_field + "_"):
                new[k] = [v[j] for j in keep_idx]
        if len(keep_idx) < len(negs):
            counts["records_changed"] += 1
        if not keep_idx and negs:
            counts["records_without_negatives"] += 1
            if cfg.drop_empty:
                counts["records_dropped"] += 1
                continue
        out_rows.append(new)
    counts["records_written"] = len(out_rows)
    for p in (paths["out"], paths["dropped"], paths["report"]):
        p.parent.mkdir(parents=True, exist_ok=True)
    _write(paths["out"], out_rows)
    _write(paths["dropped"], dropped)
    report = {"input": str(cfg.input), "counts": dict(counts), "undecided_reasons": dict(reasons.most_common()),
              "on_undecided": cfg.on_undecided, "client": client.stats.to_dict(llm), "model": llm.model,
              "base_url": llm.base_url, "elapsed_s": round(time.time() - t0, 2),
              "outputs": {k: str(v) for k, v in paths.items()}}
    paths["report"].write_text(json.dumps(report, indent=2) + "\n")
    return report


def _write(path: Path, rows: list[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def format_report(r: dict) -> str:
    c, s = r["counts"], r["client"]
    undecided = c.get("undecided_kept", 0) + c.get("undecided_dropped", 0)
    return (f"{c.get('negatives', 0)} negatives in {c.get('records', 0)} records ({c.get('pairs_judged', 0)} distinct "
            f"pairs): {c.get('accepted_dropped', 0)} judged to answer the query and dropped, "
            f"{c.get('rejected_kept', 0)} kept, {undecided} undecided ({r['on_undecided']})"
            + (f" {r['undecided_reasons']}" if r["undecided_reasons"] else "")
            + f"; {c.get('records_changed', 0)} records changed, {c.get('records_without_negatives', 0)} left without "
            f"negatives\nLLM {r['model']}: {s['calls']} calls, {s['cache_hits']} from the cache, {s['requests']} "
            f"requests sent, {s['retries_total']} retries, {s['failures_total']} failed, "
            f"{s['prompt_tokens']} + {s['completion_tokens']} tokens, cost {s.get('cost', 0):.4f}")
