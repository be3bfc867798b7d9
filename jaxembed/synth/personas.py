"""Persona-based synthetic training data (KaLM-Embedding 2.1, following Wang et al. 2024a, "Improving Text
Embeddings with Large Language Models").

Pipeline (``run_persona_job``):
1. Read the personas file the user provides (JSON Lines with a ``persona`` field, or plain text, one per line),
   drop exact duplicates, sample ``num_personas`` of them with ``seed``.
2. Instructions: for every sampled persona and every asymmetric family, ask the LLM (the persona as the system
   prompt, as in KaLM) to brainstorm ``instructions_per_persona`` task descriptions. Exact duplicates (normalised
   text) within a family are dropped.
3. Examples: for every instruction, ``examples_per_instruction`` requests, each with its own sampled parameters
   (query length, clarity, document length, difficulty ...) and no persona (KaLM uses personas only to generate
   instructions). STS has no instruction (symmetric, KaLM Table 1): its triples are generated per persona.
4. Every answer is parsed as strict JSON and validated; a malformed answer is asked again (``attempts``), then
   reported in ``rejected.jsonl``. Examples are deduplicated by normalised query within a family.
5. Output (rewritten from the cache on every run, so a rerun of a killed job sends only the missing requests):

   OUT/data/<family>/<family>-NNNNN.jsonl   one dataset per instruction: triplets (query, pos, neg) with the
                                            instruction as the BGE ``prompt`` and the task ``type``
   OUT/data/sts/sts.jsonl                   STS triples: S1 -> S2 (high similarity) with S3 (low) as negative
   OUT/datasets.json, OUT/synth_data.py     the data config: ``jaxembed data prepare --config OUT/synth_data.py``
   OUT/instructions.jsonl                   every instruction with its persona and example count
   OUT/rejected.jsonl                       every answer rejected after all attempts, with the reasons
   OUT/report.json, OUT/report.txt          counts of everything, client traffic, tokens and cost
   OUT/cache/responses.jsonl                the LLM answers (the resume point)

The prompts, the families and the answer validators are ``jaxembed.synth.prompts``.

The six families:

============== ================= =============================================================================
family         task type         query -> positive (hard negative)
============== ================= =============================================================================
short_long     retrieval         short query -> long document (a less useful document)
long_short     retrieval         long text -> short text: title, summary, keywords (a near-miss short text)
short_short    retrieval         short query -> short text (a near-miss short text)
long_long      retrieval         long document -> long related document (a less related document)
classification classification    input text -> its label (the misleading label)
sts            sts               S1 -> S2, similarity 4-5 (S3, similarity 2.5-3.5); no instruction
============== ================= =============================================================================
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path

from jaxembed.data.config import KALM_TEMPLATE
from jaxembed.data.jsonl import iter_jsonl, iter_lines
from jaxembed.errors import InputError, UserError
from jaxembed.synth.client import ChatClient, LLMConfig, ask_json
from jaxembed.synth.prompts import (FAMILIES, FAMILY_NAMES, Family, brainstorm_messages, example_messages,
                                    normalize, sample_params, validate_example, validate_instructions)


# ------------------------------------------------------------------------------------------------ config

@dataclasses.dataclass
class PersonaJobConfig:
    """What to generate. ``sts_examples_per_persona``: STS triples per persona (STS has no instructions)."""

    personas: str
    out: str
    persona_field: str = "persona"
    num_personas: int = 100
    instructions_per_persona: int = 3
    examples_per_instruction: int = 4
    sts_examples_per_persona: int = 4
    families: tuple[str, ...] = FAMILY_NAMES
    language: str = "English"
    seed: int = 0
    attempts: int = 3          # answers asked per item before it is reported as rejected
    max_chars: int = 10000     # longest accepted text of an example (characters)
    cache: str = ""            # the answers file; '' = OUT/cache/responses.jsonl

    def validate(self) -> None:
        for k in ("num_personas", "instructions_per_persona", "attempts", "max_chars"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"synth personas: {k} = {v!r} must be an integer >= 1")
        for k in ("examples_per_instruction", "sts_examples_per_persona"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 0:
                raise UserError(f"synth personas: {k} = {v!r} must be an integer >= 0")
        bad = [f for f in self.families if f not in FAMILIES]
        if bad or not self.families:
            raise UserError(f"synth personas: families {', '.join(bad) or '(none)'}: choose from "
                            f"{', '.join(FAMILY_NAMES)}")
        if not str(self.out):
            raise UserError("synth personas: --out is required")


# ---------------------------------------------------------------------------------------------- helpers


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_personas(path: str, field: str = "persona") -> tuple[list[str], dict]:
    """(unique personas in file order, counts). JSON Lines (``field`` of each object) or plain text (one per
    line; blank lines are skipped and counted). A bad record is an InputError naming file, line and field."""
    p = Path(path)
    if not p.is_file():
        raise InputError(path, None, "no such file" if not p.exists() else "is a folder, not a file",
                         "pass a .jsonl file with a 'persona' field, or a .txt file with one persona per line")
    out, seen = [], set()
    counts = Counter()
    if p.suffix in (".jsonl", ".json"):
        for i, obj in iter_jsonl(path):
            counts["read"] += 1
            v = obj.get(field)
            if not isinstance(v, str) or not v.strip():
                keys = ", ".join(sorted(obj)) or "none"
                what = "missing" if field not in obj else ("empty" if isinstance(v, str) else
                                                           f"expected a string, got {type(v).__name__}")
                raise InputError(path, i, f"{what} (keys present: {keys})",
                                 "give every record its persona text, or name the field with --persona-field",
                                 field=field)
            _add_unique(v, out, seen, counts)
    else:
        for _, line in iter_lines(path):
            if not line.strip():
                counts["blank_lines"] += 1
                continue
            counts["read"] += 1
            _add_unique(line, out, seen, counts)
    if not out:
        raise InputError(path, None, "no personas in the file", "one persona per line (or per JSON record)")
    counts["unique"] = len(out)
    return out, dict(counts)


def _add_unique(text: str, out: list, seen: set, counts: Counter) -> None:
    n = normalize(text)
    if n in seen:
        counts["duplicates"] += 1
        return
    seen.add(n)
    out.append(text.strip())


# -------------------------------------------------------------------------------------------------- job

@dataclasses.dataclass
class _Instruction:
    family: str
    text: str
    persona: str
    name: str = ""
    examples: list = dataclasses.field(default_factory=list)


def run_persona_job(cfg: PersonaJobConfig, llm: LLMConfig, *, client: ChatClient | None = None,
                    log=print) -> dict:
    """Run (or resume) the persona job; returns the report (also written to OUT/report.json)."""
    cfg.validate()
    t0 = time.time()
    out = Path(cfg.out)
    _check_out(out)
    personas, pcounts = read_personas(cfg.personas, cfg.persona_field)
    out.mkdir(parents=True, exist_ok=True)
    (out / "synth.json").write_text(json.dumps({"job": "personas", "config": dataclasses.asdict(cfg),
                                                "llm": llm.public()}, indent=2, default=str) + "\n")
    own_client = client is None
    client = client or ChatClient(llm, cfg.cache or out / "cache" / "responses.jsonl")
    rng = random.Random(cfg.seed)
    sampled = rng.sample(personas, min(cfg.num_personas, len(personas)))
    pcounts.update(requested=cfg.num_personas, sampled=len(sampled))
    fams = [FAMILIES[f] for f in cfg.families]
    stats: dict[str, Counter] = {f.name: Counter() for f in fams}
    rejected: list[dict] = []
    try:
        # 1. instructions, one brainstorm per (persona, asymmetric family)
        jobs = [(f, p) for f in fams if f.brainstorm for p in sampled]
        if jobs:
            log(f"[1/2] instructions: {len(jobs)} requests ({len(sampled)} personas x "
                f"{sum(1 for f in fams if f.brainstorm)} families)")

        def brainstorm(job):
            f, persona = job
            return ask_json(client, brainstorm_messages(f, persona, cfg.instructions_per_persona, cfg.language),
                            validate_instructions(cfg.instructions_per_persona),
                            salt=f"{cfg.seed}|brainstorm|{f.name}", attempts=cfg.attempts)

        instructions: dict[str, list[_Instruction]] = defaultdict(list)
        seen: dict[str, set] = defaultdict(set)
        for (f, persona), res in zip(jobs, client.map(brainstorm, jobs, desc="instructions")):
            st = stats[f.name]
            st["brainstorm_requests"] += 1
            if not res.ok:
                st["brainstorm_rejected"] += 1
                st[f"rejected: {res.reason}"] += 1
                rejected.append({"stage": "instructions", "family": f.name, "persona": persona,
                                 "reasons": res.reasons, "request_error": res.request_error,
                                 "last_answer": res.last_text[:2000]})
                continue
            texts, dropped = res.value
            for reason, k in dropped.items():
                st[f"instructions left out: {reason}"] += k
            for t in texts:
                st["instructions_generated"] += 1
                key = normalize(t)
                if key in seen[f.name]:
                    st["instructions_duplicate"] += 1
                    continue
                seen[f.name].add(key)
                instructions[f.name].append(_Instruction(f.name, t, persona))

        # 2. examples: per instruction (asymmetric families) or per persona (STS)
        items = []  # (family, instruction or None, persona or None, salt)
        for f in fams:
            if f.brainstorm:
                for ins in instructions[f.name]:
                    for j in range(cfg.examples_per_instruction):
                        items.append((f, ins, None, f"{cfg.seed}|{f.name}|{_hash(ins.text)}|{j}"))
            else:
                for persona in sampled:
                    for j in range(cfg.sts_examples_per_persona):
                        items.append((f, None, persona, f"{cfg.seed}|{f.name}|{_hash(persona)}|{j}"))
        log(f"[2/2] examples: {len(items)} requests")

        def example(item):
            f, ins, persona, salt = item
            params = sample_params(f, random.Random(salt))
            msgs = example_messages(f, ins.text if ins else None, params, cfg.language, persona)
            return ask_json(client, msgs, validate_example(f, cfg.max_chars), salt=salt, attempts=cfg.attempts)

        sts_examples: list[tuple] = []
        seen_q: dict[str, set] = defaultdict(set)
        for (f, ins, persona, salt), res in zip(items, client.map(example, items, desc="examples")):
            st = stats[f.name]
            st["example_requests"] += 1
            if not res.ok:
                st["examples_rejected"] += 1
                st[f"rejected: {res.reason}"] += 1
                rejected.append({"stage": "examples", "family": f.name, "instruction": ins.text if ins else None,
                                 "persona": persona, "reasons": res.reasons, "request_error": res.request_error,
                                 "last_answer": res.last_text[:2000]})
                continue
            st["examples_valid"] += 1
            q = normalize(res.value[0])
            if q in seen_q[f.name]:
                st["examples_duplicate"] += 1
                continue
            seen_q[f.name].add(q)
            (ins.examples if ins else sts_examples).append(res.value)
    finally:
        if own_client:
            client.close()
    report = _write_outputs(out, cfg, fams, instructions, sts_examples, stats, rejected)
    report.update(personas={"file": str(cfg.personas), **pcounts}, client=client.stats.to_dict(llm),
                  model=llm.model, base_url=llm.base_url, elapsed_s=round(time.time() - t0, 2))
    report["cache"] = {"file": str(client.cache.path), "answers": len(client.cache), "torn_records_cut": client.cache.torn}
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.txt").write_text(format_report(report) + "\n")
    return report


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file (fix: give a folder)")
    if out.is_dir() and any(out.iterdir()) and not (out / "synth.json").exists():
        raise UserError(f"--out {out}: a non-empty folder that is not a synth output (fix: choose a new folder)")


def _write_outputs(out: Path, cfg: PersonaJobConfig, fams, instructions, sts_examples, stats, rejected) -> dict:
    """Write data/, datasets.json, synth_data.py, instructions.jsonl, rejected.jsonl (data/ is swapped in whole)."""
    tmp = out / ".data.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    datasets, families = [], {}
    written_total = 0
    for f in fams:
        st = stats[f.name]
        if f.brainstorm:
            k = 0
            for ins in instructions[f.name]:
                if not ins.examples:
                    st["instructions_without_examples"] += 1
                    continue
                ins.name = f"{f.name}-{k:05d}"
                k += 1
                rel = f"data/{f.name}/{ins.name}.jsonl"
                _write_jsonl(tmp / f.name / f"{ins.name}.jsonl", [
                    _record(f, ins.name, j, ex, ins.text) for j, ex in enumerate(ins.examples)])
                datasets.append(dict(name=ins.name, path=rel, task=f"synth_{f.name}", task_type=f.task_type,
                                     query_instruction=KALM_TEMPLATE.format(ins.text), num_negatives=1,
                                     batching="heterogeneous", format="triplets"))
                st["instructions_written"] += 1
                st["examples_written"] += len(ins.examples)
        elif sts_examples:
            _write_jsonl(tmp / f.name / "sts.jsonl", [_record(f, "sts", j, ex, None)
                                                      for j, ex in enumerate(sts_examples)])
            datasets.append(dict(name="synth_sts", path="data/sts/sts.jsonl", task="synth_sts", task_type="sts",
                                 query_instruction="", num_negatives=1, batching="homogeneous", format="triplets"))
            st["examples_written"] += len(sts_examples)
        written_total += st["examples_written"]
        families[f.name] = {"title": f.title, "task_type": f.task_type, **dict(sorted(st.items()))}
    tmp.mkdir(parents=True, exist_ok=True)
    data = out / "data"
    old = out / ".data.old"
    if old.exists():
        shutil.rmtree(old)
    if data.exists():
        data.rename(old)
    tmp.rename(data)
    if old.exists():
        shutil.rmtree(old)
    (out / "datasets.json").write_text(json.dumps(datasets, indent=1) + "\n")
    (out / "synth_data.py").write_text(_CONFIG_PY)
    _write_jsonl(out / "instructions.jsonl", [
        {"family": ins.family, "dataset": ins.name or None, "instruction": ins.text, "persona": ins.persona,
         "examples": len(ins.examples)} for f in fams for ins in instructions.get(f.name, [])])
    _write_jsonl(out / "rejected.jsonl", rejected)
    return {"families": families, "datasets": len(datasets), "examples_written": written_total,
            "rejected": len(rejected),
            "outputs": {"data": str(data), "data_config": str(out / "synth_data.py"),
                        "datasets": str(out / "datasets.json"), "instructions": str(out / "instructions.jsonl"),
                        "rejected": str(out / "rejected.jsonl"), "report": str(out / "report.json")}}


def _record(f: Family, name: str, j: int, ex: tuple, instruction: str | None) -> dict:
    q, p, n = ex
    r = {"id": f"{name}:{j}", "query": q, "pos": [p], "neg": [n]}
    if f.task_type == "classification":
        r["label"] = p
    if instruction is not None:
        r["prompt"] = instruction
    r["type"] = f.task_type
    return r


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    tmp.replace(path)


def format_report(r: dict) -> str:
    lines = [f"personas: {r['personas'].get('sampled', 0)} sampled of {r['personas'].get('unique', 0)} unique "
             f"({r['personas'].get('read', 0)} read, {r['personas'].get('duplicates', 0)} duplicates) from "
             f"{r['personas']['file']}"]
    for name, st in r["families"].items():
        lines.append(f"{name} ({st['title']}): " + ", ".join(f"{k} {v}" for k, v in st.items()
                                                             if k not in ("title", "task_type")))
    c = r["client"]
    lines.append(f"LLM {r['model']} at {r['base_url']}: {c['calls']} calls, {c['cache_hits']} from the cache, "
                 f"{c['requests']} requests sent, {c['retries_total']} retries {c['retries']}, "
                 f"{c['failures_total']} failed {c['failures']}, {c['prompt_tokens']} prompt + "
                 f"{c['completion_tokens']} completion tokens, cost {c.get('cost', 0):.4f}")
    lines.append(f"wrote {r['datasets']} datasets, {r['examples_written']} examples; {r['rejected']} items "
                 f"rejected after all attempts (see {r['outputs']['rejected']})")
    return "\n".join(lines)


_CONFIG_PY = '''"""The data config of the synthetic data in this folder (written by `jaxembed synth personas`).

    jaxembed data validate data/*/*.jsonl
    jaxembed data prepare --config synth_data.py --out stores/synth

In a run config, add the datasets to your own:

    import importlib.util
    spec = importlib.util.spec_from_file_location("synth_data", "PATH/synth_data.py")
    synth = importlib.util.module_from_spec(spec); spec.loader.exec_module(synth)
    c.data.datasets = list(c.data.datasets) + synth.datasets()

One dataset per generated instruction (its KaLM-style query instruction); the datasets of one family form one
task with heterogeneous batches (each batch mixes that family's instructions).
"""

import json
from pathlib import Path

import ml_collections

from jaxembed.data.config import dataset_config, default_data_config

HERE = Path(__file__).resolve().parent


def datasets():
    specs = json.loads((HERE / "datasets.json").read_text(encoding="utf-8"))
    return [dataset_config(**{**d, "path": str(HERE / d["path"])}) for d in specs]


def get_config(arg=None):
    c = ml_collections.ConfigDict()
    c.data = default_data_config()
    c.data.datasets = datasets()
    return c
'''
