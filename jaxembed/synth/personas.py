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
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from jaxembed.data.config import KALM_TEMPLATE
from jaxembed.data.jsonl import iter_jsonl, iter_lines
from jaxembed.errors import InputError, UserError
from jaxembed.synth.client import AnswerError, ChatClient, LLMConfig, ask_json

_JSON_ONLY = ("Your output must always be a JSON object only, do not explain yourself or output anything else. "
              "Be creative!")


@dataclasses.dataclass(frozen=True)
class Family:
    """A task family: the brainstorm prompt (None: no instructions), the example prompt, the answer's keys as
    (query, positive, negative) and the parameters sampled for each example."""

    name: str
    title: str
    task_type: str
    brainstorm: str | None
    example: str
    keys: tuple[str, str, str]
    params: tuple[tuple[str, tuple[str, ...]], ...]


_BRAINSTORM = """Brainstorm a list of potentially useful {what}.
Here are a few examples for your reference:
{examples}
Please adhere to the following guidelines:
{guidelines}- Each task should cover a wide range of inputs, and should not be too specific.
- Write each task as one sentence in {language} that starts with a verb or "Given", e.g. "Given a ..., retrieve ...".
Your output must be a JSON list of {n} strings only, each string a distinct task. Do not explain yourself or \
output anything else. Be creative!"""

_DOC_PARAMS = (("query_type", ("extremely long-tail", "long-tail", "common")),
               ("query_length", ("less than 5 words", "5 to 15 words", "at least 10 words")),
               ("clarity", ("clear", "understandable with some effort", "ambiguous")),
               ("num_words", ("50", "100", "200", "300")),
               ("difficulty", ("high school", "college", "PhD")))

FAMILIES: dict[str, Family] = {
    "short_long": Family(
        "short_long", "short-long retrieval", "retrieval",
        _BRAINSTORM.replace("{what}", "text retrieval tasks").replace("{examples}", (
            "- Provided a scientific claim as query, retrieve documents that help verify or refute the claim.\n"
            "- Search for documents that answer a FAQ-style query on children's nutrition.")).replace(
            "{guidelines}", "- Specify what the query is, and what the desired documents are.\n"),
        """You have been assigned a retrieval task: {task}
Your mission is to write one text retrieval example for this task in JSON format. The JSON object must contain \
the following keys:
- "user_query": a string, a random user search query specified by the retrieval task.
- "positive_document": a string, a relevant document for the user query.
- "hard_negative_document": a string, a hard negative document that only appears relevant to the query.
Please adhere to the following guidelines:
- The "user_query" should be {query_type}, {query_length}, {clarity}, and diverse in topic.
- All documents must be created independent of the query. Avoid copying the query verbatim. It's acceptable if \
some parts of the "positive_document" are not topically related to the query.
- All documents should be at least {num_words} words long.
- The "hard_negative_document" contains some useful information, but it should be less useful or comprehensive \
compared to the "positive_document".
- Both the query and documents should be in {language}.
- Do not provide any explanation in any document on why it is relevant or not relevant to the query.
- Both the query and documents require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("user_query", "positive_document", "hard_negative_document"), _DOC_PARAMS),
    "long_short": Family(
        "long_short", "long-short retrieval", "retrieval",
        _BRAINSTORM.replace("{what}", "text matching tasks where the query is a long text and the matching "
                                      "text is short (a title, a headline, a summary sentence, a keyword list)")
        .replace("{examples}", (
            "- Given a news article, retrieve its headline.\n"
            "- Given a product review, retrieve the one-sentence summary of the reviewer's complaint.")).replace(
            "{guidelines}", "- Specify what the long input is, and what the desired short text is.\n"),
        """You have been assigned a text matching task: {task}
Your mission is to write one example for this task in JSON format. The JSON object must contain the following keys:
- "input_text": a string, a long input text specified by the task.
- "positive_short_text": a string, the short text that matches the input.
- "hard_negative_short_text": a string, a short text that looks like a match but is wrong or less fitting.
Please adhere to the following guidelines:
- The "input_text" should be about {num_words} words long, {clarity}, and diverse in topic.
- The short texts should be {short_length}.
- Avoid copying sentences of the "input_text" into the short texts verbatim.
- All texts should be in {language} and require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("input_text", "positive_short_text", "hard_negative_short_text"),
        (("num_words", ("100", "200", "300")), ("clarity", ("clear", "understandable with some effort")),
         ("short_length", ("less than 10 words", "one sentence", "a short phrase")),
         ("difficulty", ("high school", "college", "PhD")))),
    "short_short": Family(
        "short_short", "short-short matching", "retrieval",
        _BRAINSTORM.replace("{what}", "text matching tasks where both the queries and the documents are "
                                      "extremely short (less than 10 words)").replace("{examples}", (
            "- Given a city name, retrieve the name of the country it is in.\n"
            "- Given a product name, retrieve its typical product category.")).replace(
            "{guidelines}", "- Specify what the query is, and what the desired documents are.\n"),
        """You have been assigned a text matching task: {task}
Your mission is to write one example for this task in JSON format. The JSON object must contain the following keys:
- "input": a string, a random input specified by the task.
- "positive_document": a string, a relevant document for the "input" according to the task.
- "hard_negative_document": a string, a document that looks relevant but does not match according to the task.
Please adhere to the following guidelines:
- All values must be extremely short, less than 10 words.
- The values should be {clarity} and in {language}.
- The "input" and documents require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("input", "positive_document", "hard_negative_document"),
        (("clarity", ("clear", "understandable with some effort")),
         ("difficulty", ("elementary school", "high school", "college")))),
    "long_long": Family(
        "long_long", "long-long matching", "retrieval",
        _BRAINSTORM.replace("{what}", "text matching tasks where both the queries and the documents are long "
                                      "passages").replace("{examples}", (
            "- Given a research paper abstract, retrieve abstracts of papers that build on its findings.\n"
            "- Given a legal case summary, retrieve summaries of precedent cases.")).replace(
            "{guidelines}", "- Specify what the query document is, and what the desired documents are.\n"),
        """You have been assigned a text matching task: {task}
Your mission is to write one example for this task in JSON format. The JSON object must contain the following keys:
- "input": a string, a long query document specified by the task.
- "positive_document": a string, a long document that matches the "input" according to the task.
- "hard_negative_document": a string, a long document on a similar topic that does not match according to the \
task.
Please adhere to the following guidelines:
- Every value should be at least {num_words} words long, {clarity}, and in {language}.
- Avoid copying sentences between the "input" and the documents.
- All texts require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("input", "positive_document", "hard_negative_document"),
        (("num_words", ("100", "200", "300")), ("clarity", ("clear", "understandable with some effort")),
         ("difficulty", ("high school", "college", "PhD")))),
    "classification": Family(
        "classification", "classification", "classification",
        _BRAINSTORM.replace("{what}", "text classification tasks").replace("{examples}", (
            "- Classify the sentiment of a restaurant review as positive, negative or mixed.\n"
            "- Identify the main topic of a customer support ticket.")).replace(
            "{guidelines}", "- Specify what the input text is and what the labels are.\n"),
        """You have been assigned a text classification task: {task}
Your mission is to write one text classification example for this task in JSON format. The JSON object must \
contain the following keys:
- "input_text": a string, the input text specified by the classification task.
- "label": a string, the correct label of the input text.
- "misleading_label": a string, a valid label for the given task, but not as appropriate as the "label" for the \
"input_text".
Please adhere to the following guidelines:
- The "input_text" should be {num_words} words and diverse in expression.
- Avoid including the values of the "label" and "misleading_label" fields in the "input_text", that would make \
the task too easy.
- The values for all fields should be in {language}.
- The "input_text" is {clarity} and requires {difficulty} level education to comprehend.
""" + _JSON_ONLY,
        ("input_text", "label", "misleading_label"),
        (("num_words", ("less than 10", "at least 10", "at least 50", "at least 100")),
         ("clarity", ("clear", "understandable with some effort", "ambiguous")),
         ("difficulty", ("high school", "college", "PhD")))),
    "sts": Family(
        "sts", "semantic textual similarity", "sts", None,
        """Write a {unit} triple with varying semantic similarity scores in JSON format. The semantic similarity \
score ranges from 1 to 5, with 1 denotes least similar and 5 denotes most similar. The JSON object must contain \
the following keys:
- "S1": a string, the reference {unit}.
- "S2": a string, a {unit} whose similarity score to S1 is {high_score}.
- "S3": a string, a {unit} whose similarity score to S1 is {low_score}.
Please adhere to the following guidelines:
- The values are all strings in {language}, do not add any other keys.
- There should be some word overlaps between all three strings.
- The strings should be diverse in topic and length, and draw on what you know and care about.
- The strings should require {difficulty} level education to understand.
""" + _JSON_ONLY,
        ("S1", "S2", "S3"),
        (("unit", ("sentence", "phrase", "passage")), ("high_score", ("4", "4.5", "5")),
         ("low_score", ("2.5", "3", "3.5")), ("difficulty", ("elementary school", "high school", "college")))),
}
FAMILY_NAMES = tuple(FAMILIES)


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

def normalize(text: str) -> str:
    """The text compared for exact deduplication: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


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


def persona_system_prompt(persona: str) -> str:
    return (f"You are the following persona: {persona}\n"
            "Think as this person would, drawing on their knowledge, work, needs and interests.")


def brainstorm_messages(family: Family, persona: str, n: int, language: str) -> list[dict]:
    return [{"role": "system", "content": persona_system_prompt(persona)},
            {"role": "user", "content": family.brainstorm.replace("{n}", str(n)).replace("{language}", language)}]


def sample_params(family: Family, rng: random.Random) -> dict[str, str]:
    return {k: rng.choice(v) for k, v in family.params}


def example_messages(family: Family, task: str | None, params: dict, language: str,
                     persona: str | None = None) -> list[dict]:
    text = family.example
    for k, v in {**params, "language": language, "task": task or ""}.items():  # the LLM's task text last
        text = text.replace("{" + k + "}", v)
    msgs = [{"role": "user", "content": text}]
    if persona is not None:
        msgs.insert(0, {"role": "system", "content": persona_system_prompt(persona)})
    return msgs


def validate_instructions(n: int, max_chars: int = 500):
    """A validator of a brainstorm answer: a JSON list of non-empty strings -> (the first n, counts of
    items left out)."""

    def check(value: Any):
        if not isinstance(value, list):
            raise AnswerError("not a JSON list", type(value).__name__)
        good, dropped = [], Counter()
        for x in value:
            if not isinstance(x, str):
                dropped["instruction not a string"] += 1
            elif not x.strip():
                dropped["empty instruction"] += 1
            elif len(x) > max_chars:
                dropped["instruction too long"] += 1
            else:
                good.append(" ".join(x.split()))
        if not good:
            raise AnswerError("no usable instruction in the list")
        if len(good) > n:
            dropped["more instructions than asked (ignored)"] += len(good) - n
        return good[:n], dropped

    return check


def validate_example(family: Family, max_chars: int):
    """A validator of an example answer: a JSON object with the family's three keys holding distinct, non-empty
    strings -> (query, positive, negative)."""

    def check(value: Any):
        if not isinstance(value, dict):
            raise AnswerError("not a JSON object", type(value).__name__)
        vals = []
        for k in family.keys:
            if k not in value:
                raise AnswerError(f"missing key '{k}'")
            v = value[k]
            if not isinstance(v, str):
                raise AnswerError(f"key '{k}' is not a string")
            if not v.strip():
                raise AnswerError(f"key '{k}' is empty")
            if len(v) > max_chars:
                raise AnswerError(f"key '{k}' is too long")
            vals.append(v.strip())
        q, p, n = (normalize(v) for v in vals)
        if p == n:
            raise AnswerError(f"'{family.keys[1]}' equals '{family.keys[2]}'")
        if q == p:
            raise AnswerError(f"'{family.keys[0]}' equals '{family.keys[1]}'")
        return tuple(vals)

    return check


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
