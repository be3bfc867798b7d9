"""The ``jaxembed mine`` job: its input (a dataset file, or a dataset of a store), ``run_mine`` (mine, then write the
triplets file with the BGE prompt / type that restore the dataset's instruction and task type, and the report),
and the report's terminal lines."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Sequence

from jaxembed.errors import UserError
from jaxembed.mining.negatives import MineConfig, mine


def instruction_prompt(instruction: str) -> str | None:
    """The BGE ``prompt`` whose KaLM form (``Instruct: {prompt} \\n Query: ``) is ``instruction`` ('' for no
    instruction), or None when the instruction is not of that form."""
    from jaxembed.data.readers import kalm_instruction

    if instruction == "":
        return ""
    head, tail = "Instruct: ", " \n Query: "
    if instruction.startswith(head) and instruction.endswith(tail):
        p = instruction[len(head):len(instruction) - len(tail)]
        if p.strip() and kalm_instruction(p) == instruction:
            return p
    return None



def write_jsonl(path: str | os.PathLike, records: Sequence[dict]) -> None:
    """Write records as JSON Lines atomically (a temporary file renamed into place)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, p)



def annotate_records(records: list[dict], *, query_instruction: str, task_type: str | None) -> list[str]:
    """Give every mined record the BGE ``prompt`` (and ``type``) that make ``jaxembed data prepare`` restore the
    dataset's query instruction and task type. -> notes (e.g. when the instruction has no BGE form)."""
    notes = []
    prompt = instruction_prompt(query_instruction)
    for r in records:
        if prompt is not None:
            r["prompt"] = prompt
        if task_type:
            r["type"] = task_type
    if prompt is None:
        notes.append(f"the query instruction {query_instruction!r} is not of the form 'Instruct: ... \\n Query: ': "
                     "set query_instruction in the data config (see data_config in this report)")
    return notes



def data_config_entry(name: str, path: str, *, task_type: str | None, query_instruction: str,
                      doc_instruction: str, num_negatives: int, info=None) -> dict:
    """The ``dataset_config(...)`` fields that read the mined file as the dataset it came from."""
    d = {"name": name, "path": str(path), "format": "triplets", "task_type": task_type,
         "query_instruction": query_instruction, "doc_instruction": doc_instruction,
         "num_negatives": int(num_negatives)}
    if info is not None:
        for k in ("task", "temperature", "batching", "max_query_length", "max_doc_length", "weight", "epochs"):
            v = getattr(info, k, None)
            if v is not None:
                d[k] = v
    return d



def write_report(path: str | os.PathLike, report: dict) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(report, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")



def format_report(report: dict) -> str:
    """A few lines for the terminal."""
    r = report
    lines = [f"examples {r['examples']}: kept {r['kept']}, filtered {sum(r['filtered'].values())} "
             f"({'; '.join(f'{k}: {v}' for k, v in r['filtered'].items())})",
             f"positives {r['positives']['total']}: kept {r['positives']['kept']}",
             "negatives: " + ", ".join(f"{k} {v}" for k, v in r["negatives"].items()),
             "window candidates excluded: " + ", ".join(f"{k} {v}" for k, v in r["window_candidates_excluded"].items()),
             "rank of the best positive: " + ", ".join(f"{k}: {v}" for k, v in
                                                       r["rank_histogram_best_positive"].items() if v)]
    if "mote_experts" in r:
        m = r["mote_experts"]
        lines.append(f"MoTE experts (task {m['task']!r}): queries {m['query']}, documents {m['document']}")
    return "\n".join(lines)



@dataclasses.dataclass
class MineInput:
    """What ``jaxembed mine`` mines: the examples, the dataset's instructions, task type and name, where they came
    from (for the report), and for a store dataset its info and token limits."""

    examples: Sequence[dict]
    query_instruction: str
    doc_instruction: str
    task_type: str | None
    name: str
    source: dict
    info: Any = None
    max_query_length: int | None = None
    max_doc_length: int | None = None


def read_input(path, *, format: str = "auto", score_threshold: float | None = None, on_error: str = "stop"):
    """The examples of a dataset file (any jaxembed record format). -> (examples, ReadInfo, Tally)."""
    from jaxembed.data.readers import ReadInfo, ReadOptions, Tally, apply_policy, read_jsonl

    info = ReadInfo()
    opts = ReadOptions(name=Path(path).stem, format=format, score_threshold=score_threshold)
    tally = Tally(Path(path).stem)
    examples = list(apply_policy(read_jsonl(path, opts, info), on_error, tally))
    if not examples:
        reasons = "; ".join(f"{r}: {n}" for r, n in tally.reasons().items()) or "no records"
        raise UserError(f"{path}: no examples to mine ({reasons})")
    return examples, info, tally


def input_from_file(path, *, format: str = "auto", score_threshold: float | None = None, on_error: str = "stop",
                    query_instruction: str | None = None, doc_instruction: str | None = None,
                    task_type: str | None = None) -> MineInput:
    """A dataset file to mine; instructions not given: the KaLM form of the records' BGE prompt (else none), and
    none for documents; the task type not given: the records' BGE type."""
    examples, rinfo, tally = read_input(path, format=format, score_threshold=score_threshold, on_error=on_error)
    from jaxembed.data.readers import kalm_instruction

    qi = query_instruction if query_instruction is not None else (
        kalm_instruction(rinfo.prompt) if rinfo.prompt is not None else "")
    di = doc_instruction if doc_instruction is not None else ""
    source = {"input": str(path), "format": rinfo.format, "read": tally.read, "examples": tally.written,
              "skipped": tally.reasons()}
    return MineInput(examples, qi, di, task_type or rinfo.task_type, Path(path).stem, source)


def input_from_store(store_dir, dataset: str, *, query_instruction: str | None = None,
                     doc_instruction: str | None = None) -> MineInput:
    """A dataset of a store to mine, with the store's instructions (unless given), task type and token limits."""
    from jaxembed.data.store import Store

    store = Store.open(store_dir)
    info = store.dataset(dataset)
    examples = store.examples(info.name, range(info.size))
    qi = query_instruction if query_instruction is not None else info.query_instruction
    di = doc_instruction if doc_instruction is not None else info.doc_instruction
    source = {"store": str(store_dir), "dataset": info.name, "examples": info.size}
    return MineInput(examples, qi, di, info.task_type, info.name, source, info, info.max_query_length,
                     info.max_doc_length)


def run_mine(encoder, examples, out, report_path=None, *, config=None, query_instruction: str = "",
             doc_instruction: str = "", corpus=None, task_type: str | None = None, dataset_name: str = "mined",
             info=None, max_query_length=None, max_doc_length=None, batch_size: int = 64,
             progress: bool | None = None, source: dict | None = None) -> dict:
    """The ``jaxembed mine`` job on examples (``{"id", "query", "pos", "neg", ...}``): mine, write the triplets file
    ``out`` (with the BGE prompt / type that restore the instruction and task type) and the report. -> report."""
    cfg = config or MineConfig()
    res = mine(encoder, examples, cfg, query_instruction=query_instruction, doc_instruction=doc_instruction,
                      corpus=corpus, max_query_length=max_query_length, max_doc_length=max_doc_length,
                      batch_size=batch_size, progress=progress, task=task_type)
    notes = annotate_records(res.records, query_instruction=query_instruction, task_type=task_type)
    out = Path(out)
    write_jsonl(out, res.records)
    report = dict(res.report)
    report["source"] = source or {}
    report["output"] = str(out)
    report["notes"] = notes
    report["data_config"] = data_config_entry(
        dataset_name, str(out.resolve()), task_type=task_type, query_instruction=query_instruction,
        doc_instruction=doc_instruction, num_negatives=cfg.num_negatives, info=info)
    rp = Path(report_path) if report_path else out.with_suffix(".report.json")
    write_report(rp, report)
    report["report_path"] = str(rp)
    return report
