"""The per-format parsers of one record: a record of a dataset -> an ``Example`` or the reason it is not one
(``Skip``): the checks of each field and the parsers of the formats (triplets / BGE, scored pairs, labelled pairs,
classification, sentence-transformers rows), each ``parse_*(obj, fields, id, RecordContext) -> Example``. A parser's contract, in public names (a format
added outside this module uses the same): ``get_field`` (a required key), ``check_text`` / ``check_text_list``,
``label_str``, ``keep_by_score`` / ``keep_by_label`` (a pair kept or ``FilteredRecord``), raising ``BadRecord``
(the record is invalid), ``FilteredRecord`` (a rule leaves it out) or ``BadConfig`` (the dataset config cannot read
it). The table of the formats (their fields, parsers, detection and help) is ``jaxembed.data.formats``; the
formats are described in ``jaxembed.data.readers``, which reads files with them and re-exports every name here."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Union

from jaxembed.data.jsonl import EMPTY_TEXT_FIX, empty_text
from jaxembed.data.task_types import KALM_TEMPLATE, TASK_TYPES
from jaxembed.errors import InputError
from jaxembed.losses.table import SCORED_LOSSES, titles

Example = dict  # {"id", "query", "pos": list[str], "neg": list[str], "label"?, "score"?, "pos_scores"?, "neg_scores"?}


BGE_TYPES = {
    "normal": "retrieval",
    "only_1neg": "retrieval",
    "symmetric_sts": "sts",
    "symmetric_class": "classification",
    "symmetric_clustering": "clustering",
    **{t: t for t in TASK_TYPES},
}


TEACHER_FIELDS = ("pos_scores", "neg_scores")


BGE_IGNORED = TEACHER_FIELDS  # the same fields under a second name (re-exported by jaxembed.data.readers)


DEFAULT_FIELDS = {
    "id": "id", "query": "query", "pos": "pos", "neg": "neg", "prompt": "prompt", "type": "type",
    "category": "category", "sentence1": "sentence1", "sentence2": "sentence2", "score": "score",
    "text": "text", "label": "label",
}


@dataclass(frozen=True)
class Skip:
    """A record that is not written: ``invalid`` (a bad record: an error under on_error='stop') or a valid record
    left out by a rule (``invalid=False``: score below threshold, negative pair)."""

    path: str
    line: int | None
    field: str | None
    reason: str
    fix: str | None = None
    invalid: bool = True
    detail: str | None = None  # e.g. the score of a pair below the threshold; not part of the reason counts

    def error(self) -> InputError:
        return InputError(self.path, self.line, self.reason, self.fix, field=self.field)

    def __str__(self) -> str:
        if self.invalid:
            return str(self.error())
        where = self.path + (f":{self.line}" if self.line is not None else "")
        what = f"field '{self.field}': " if self.field else ""
        return f"{where}: skipped: {what}{self.reason}" + (f" ({self.detail})" if self.detail else "")

    def to_dict(self) -> dict:
        return {"file": self.path, "line": self.line, "field": self.field, "reason": self.reason, "fix": self.fix,
                "invalid": self.invalid, "detail": self.detail}


Item = Union[Example, Skip]


class BadRecord(Exception):
    """Raised by record parsers: the record is invalid (field, reason, fix)."""

    def __init__(self, field: str | None, reason: str, fix: str | None = None):
        super().__init__(reason)
        self.field, self.reason, self.fix = field, reason, fix


class BadConfig(BadRecord):
    """Raised by record parsers: the dataset config cannot read this data (an error for the whole dataset, under
    either on_error policy)."""


class FilteredRecord(Exception):
    """Raised by record parsers: a valid record that a rule leaves out."""

    def __init__(self, field: str | None, reason: str, detail: str | None = None):
        super().__init__(reason)
        self.field, self.reason, self.detail = field, reason, detail


# ------------------------------------------------------------------------------------------------ field checks

def check_text(v: Any, key: str) -> str:
    """``v`` when it is a text with something to tokenise, else BadRecord naming ``key``."""
    if not isinstance(v, str):
        raise BadRecord(key, f"expected a string, got {_type(v)}", "store the text as a JSON string")
    empty = empty_text(v)
    if empty:  # whitespace, control, zero-width characters and byte-order marks only: tokenised to nothing
        raise BadRecord(key, empty, EMPTY_TEXT_FIX)
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRecord(key, f"contains an unpaired surrogate {v[e.start]!r} at character {e.start}",
                        "fix the text's encoding (a \\ud8xx escape without its pair)") from None
    return v


def check_text_list(v: Any, key: str, min_len: int, one_text: bool = False) -> list[str]:
    """A list of non-empty texts; ``one_text``: a single string is accepted as a list of one (a renamed column of a
    sentence-transformers / Hugging Face dataset holds one text per row)."""
    if one_text and isinstance(v, str):
        v = [v]
    if not isinstance(v, list):
        raise BadRecord(key, f"expected a list of strings, got {_type(v)}", f'write "{key}": ["text", ...]')
    if len(v) < min_len:
        raise BadRecord(key, "empty list: at least one positive is needed", "give the query a positive or remove it")
    return [check_text(x, f"{key}[{j}]") for j, x in enumerate(v)]


def _type(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return f"{v!r} (a NaN / Infinity literal, which is not standard JSON)".replace("nan", "NaN").replace(
            "inf", "Infinity")
    return "null" if v is None else {"bool": "boolean", "dict": "object", "list": "list"}.get(type(v).__name__,
                                                                                             type(v).__name__)


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def closest(key: str, known) -> str | None:
    """The known name closest to ``key`` (a likely typo), or None."""
    import difflib

    m = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    if not m and key.lower() in {k.lower() for k in known}:
        m = [k for k in known if k.lower() == key.lower()]
    return m[0] if m else None


def get_field(obj: dict, key: str):
    """``obj[key]``; a missing key is BadRecord listing the keys present (and the likely typo)."""
    if key not in obj:
        keys = ", ".join(sorted(obj)) or "none"
        typo = closest(key, obj)
        raise BadRecord(key, f"missing (keys present: {keys})",
                        (f"rename '{typo}' to '{key}', or " if typo else "") +
                        "add the field, or map it with columns / text_field / label_field in the data config")
    return obj[key]


def label_str(v: Any, key: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise BadRecord(key, f"expected a string (or an integer) label, got {_type(v)}", "write the label as a string")
    s = str(v)
    if not s.strip():
        raise BadRecord(key, "empty label", "give the record its label")
    return s


# ---------------------------------------------------------------------------------------------- read options

@dataclass
class ReadOptions:
    """How to read one dataset.

    name: dataset name (default ids are ``<name>:<line>``); format: a record format or 'auto'; fields: our field
    name -> source key; score_threshold: scored pairs (None: every valid pair is a positive, for validation only);
    label_descriptions: classification, list of (label, description) or None (labels taken from the data, sorted);
    use_type: infer the task type from BGE ``type`` fields; use_prompt: take the query instruction from BGE
    ``prompt`` fields (each record must then agree with the first); extra_fields: record keys that are not
    fields of the format but are expected (read and ignored); any other unknown key is an error."""

    name: str = "data"
    format: str = "auto"
    fields: dict = field(default_factory=lambda: dict(DEFAULT_FIELDS))
    score_threshold: float | None = None
    label_descriptions: list | None = None
    use_type: bool = True
    use_prompt: bool = True
    extra_fields: frozenset = frozenset()
    need_threshold: bool = False  # scored pairs (also st score columns) without score_threshold are an error
    keep_scores: bool = False  # a scored-pair loss: every pair is kept, with its score (no threshold)


def _renamed(f: dict, key: str) -> bool:
    """Whether our field ``key`` is read from another source key (``columns``): then pos / neg may be one text."""
    return f[key] != DEFAULT_FIELDS[key]


@dataclass
class ReadInfo:
    """What reading a dataset found out: the record format (when auto), the task type and prompt of BGE records,
    the labels of classification data (in negative order)."""

    format: str | None = None
    task_type: str | None = None
    task_type_line: str | None = None
    prompt: str | None = None
    prompt_line: str | None = None
    labels: list[str] | None = None


@dataclass
class RecordContext:
    """What a record parser reads besides the record: the dataset's options, what reading has found so far (filled
    by the parsers: BGE task type and prompt), where the record is (``file:line``) and, for classification data,
    the description of each label and the labels in order."""

    opts: ReadOptions
    info: ReadInfo
    where: str = ""
    desc: dict = field(default_factory=dict)
    order: list = field(default_factory=list)


# ------------------------------------------------------------------------------------------------ record parsers

def record_id(obj: dict, f: dict, default: str) -> str:
    key = f["id"]
    if key not in obj:
        return default
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise BadRecord(key, f"expected a string or integer id, got {_type(v)}", "write the id as a string")
    v = str(v)
    if not v.strip():
        raise BadRecord(key, "empty id", "give the record an id or remove the field")
    return v


def parse_triplet(obj: dict, f: dict, rid: str, r: RecordContext) -> Example:
    """query / pos / neg (+ BGE prompt / type / category) -> Example."""
    opts, info, where = r.opts, r.info, r.where
    ex = {"id": rid, "query": check_text(get_field(obj, f["query"]), f["query"]),
          "pos": check_text_list(get_field(obj, f["pos"]), f["pos"], 1, one_text=_renamed(f, "pos")),
          "neg": check_text_list(obj[f["neg"]], f["neg"], 0, one_text=_renamed(f, "neg")) if f["neg"] in obj
          else []}
    if opts.use_type and f["type"] in obj:
        t = obj[f["type"]]
        if not isinstance(t, str) or t not in BGE_TYPES:
            raise BadRecord(f["type"], f"{t!r} is not a known type (BGE: {', '.join(list(BGE_TYPES)[:5])}; or one of "
                                  f"{', '.join(TASK_TYPES)})", "fix the type or set task_type in the data config")
        tt = BGE_TYPES[t]
        if info.task_type is None:
            info.task_type, info.task_type_line = tt, where
        elif tt != info.task_type:
            raise BadRecord(f["type"], f"{t!r} means task type {tt}, but {info.task_type_line} set {info.task_type}",
                            "one task type per dataset: split the file, or set task_type in the data config")
    if opts.use_prompt and f["prompt"] in obj:
        p = obj[f["prompt"]]
        if p is not None:
            if not isinstance(p, str):
                raise BadRecord(f["prompt"], f"expected a string, got {_type(p)}", "write the prompt as a string")
            if info.prompt is None:
                info.prompt, info.prompt_line = p, where
            elif p != info.prompt:
                raise BadRecord(f["prompt"], f"{_short(p)} differs from the prompt {_short(info.prompt)} of "
                                        f"{info.prompt_line}",
                                "one prompt per dataset: split the file, or set query_instruction in the data config")
    for key in (f["label"], f["category"]):
        if key in obj:
            ex["label"] = label_str(obj[key], key)
            break
    for key, texts in (("pos_scores", "pos"), ("neg_scores", "neg")):
        if key in obj and obj[key] is not None:
            ex[key] = _teacher_scores(obj[key], key, len(ex[texts]), texts)
    if obj.get(f["type"]) == "only_1neg":  # FlagEmbedding trains such a query with one hard negative: its first
        ex["neg"] = ex["neg"][:1]
        if "neg_scores" in ex:
            ex["neg_scores"] = ex["neg_scores"][:1]
    return ex


def _teacher_scores(v: Any, key: str, n: int, texts: str) -> list[float]:
    """A list of ``n`` finite numbers (one teacher score per text of ``texts``); a single number for one text."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and n == 1:
        v = [v]
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise BadRecord(key, f"expected a list of numbers, got {_type(v)}", f'write "{key}": [0.9, ...], one score per '
                                                                      f"text of {texts}")
    if len(v) != n:
        raise BadRecord(key, f"{len(v)} scores for {n} {texts} texts", f"one teacher score per text of {texts}, in "
                                                                  "order (jaxembed teacher-score writes them)")
    if not all(math.isfinite(x) for x in v):
        raise BadRecord(key, "a score is not a finite number", "give every text a real score")
    return [float(x) for x in v]


def _short(s: str, n: int = 40) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")


def parse_scored_pair(obj: dict, f: dict, rid: str, r: RecordContext) -> Example:
    """sentence1 / sentence2 / score -> Example when score >= threshold (else FilteredRecord)."""
    opts = r.opts
    s1 = check_text(get_field(obj, f["sentence1"]), f["sentence1"])
    s2 = check_text(get_field(obj, f["sentence2"]), f["sentence2"])
    sc = get_field(obj, f["score"])
    keep_by_score(sc, f["score"], opts)
    ex = {"id": rid, "query": s1, "pos": [s2], "neg": []}
    if opts.keep_scores:
        ex["score"] = float(sc)
    return ex


def keep_by_score(sc: Any, key: str, opts: ReadOptions) -> None:
    """A pair's score: a finite number (else BadRecord); below ``score_threshold``: FilteredRecord."""
    if isinstance(sc, bool) or not isinstance(sc, (int, float)):
        eg = f" ({sc}, not {json.dumps(sc)})" if isinstance(sc, str) and _is_number(sc) else ""
        raise BadRecord(key, f"expected a number, got {_type(sc)}", f"write the score as a JSON number{eg}")
    if not math.isfinite(sc):
        raise BadRecord(key, f"{_type(sc)} is not a finite number", "give the pair a real score")
    if opts.score_threshold is not None and sc < opts.score_threshold:
        raise FilteredRecord(key, f"score below threshold {opts.score_threshold:g}", f"score {sc:g}")


_POSITIVE_LABELS = {1: True, 0: False, "1": True, "0": False}


def parse_labelled_pair(obj: dict, f: dict, rid: str, r: RecordContext) -> Example:
    """sentence1 / sentence2 / label -> Example for label 1 (label 0: FilteredRecord 'negative pair')."""
    s1 = check_text(get_field(obj, f["sentence1"]), f["sentence1"])
    s2 = check_text(get_field(obj, f["sentence2"]), f["sentence2"])
    keep_by_label(get_field(obj, f["label"]), f["label"])
    return {"id": rid, "query": s1, "pos": [s2], "neg": []}


def keep_by_label(lab: Any, key: str, st: bool = False) -> None:
    """A pair's label: 1 (kept) or 0 (FilteredRecord 'negative pair'); anything else is BadRecord."""
    if isinstance(lab, float) and lab in (0.0, 1.0):
        lab = int(lab)
    pos = lab if isinstance(lab, bool) else _POSITIVE_LABELS.get(lab) if isinstance(lab, (int, str)) else None
    if pos is None:
        fix = "write 1 or 0"
        if st:
            fix += ("; a similarity score: set score_threshold in the dataset config (pairs with label >= it are "
                    "positives); 3-way NLI labels: use the (anchor, positive, negative) triplets instead")
        raise BadRecord(key, f"{lab!r} is not a pair label (1 = positive, 0 = negative)", fix)
    if not pos:
        raise FilteredRecord(key, "negative pair", f"label {lab!r}")


def parse_st(obj: dict, f: dict, rid: str, r: RecordContext) -> Example:
    """A sentence-transformers row -> Example. Texts are the columns in order (the id column, the label / score
    column and ``extra_fields`` aside); sentence-transformers reads them by position, whatever their names.

    No label column: (anchor, positive, negative_1, ..., negative_n) -> query, [positive], [negatives]. A label
    column (``label`` or ``score``, or what ``columns`` maps them to) with two texts: a pair, positive by its
    score (``score`` column, or any label column with ``score_threshold``) or by its 1 / 0 label."""
    opts = r.opts
    label_keys = [k for k in (f["label"], f["score"]) if k in obj]
    if len(label_keys) > 1:
        raise BadRecord(label_keys[1], f"both a {label_keys[0]!r} and a {label_keys[1]!r} column "
                                       "(sentence-transformers reads one label column)",
                        f"ignore one of them: extra_fields=[{label_keys[1]!r}] in the dataset config")
    skip = {f["id"], *label_keys, *opts.extra_fields}
    texts = [(k, v) for k, v in obj.items() if k not in skip]
    for k, v in texts:
        check_text(v, k)
    if not label_keys:
        if opts.keep_scores:
            raise BadConfig(None, f"a scored-pair loss ({titles(SCORED_LOSSES)}) needs a score column, these rows have "
                                "none",
                            "give the dataset a score / label column, or train it with loss='infonce'")
        if len(texts) < 2:
            raise BadRecord(texts[0][0] if texts else None,
                            f"{len(texts)} text column{'s' if len(texts) != 1 else ''}: an (anchor, positive, "
                            "negatives...) row needs at least two",
                            "give each row an anchor and a positive (single-sentence data such as denoising "
                            "auto-encoder sets is not contrastive training data)")
        return {"id": rid, "query": texts[0][1], "pos": [texts[1][1]], "neg": [v for _, v in texts[2:]]}
    key = label_keys[0]
    if len(texts) != 2:
        names = ", ".join(k for k, _ in texts)
        raise BadRecord(key, f"a {key!r} column with {len(texts)} text columns ({names}): a labelled row is a pair "
                        f"(sentence1, sentence2, {key})",
                        f"for (anchor, positive, negatives) rows, ignore the column: extra_fields=[{key!r}]")
    if key == f["score"] or opts.score_threshold is not None or opts.keep_scores:
        if opts.score_threshold is None and opts.need_threshold and not opts.keep_scores:
            raise BadConfig(key, f"scored pairs need score_threshold (pairs with {key} >= threshold are positives)",
                            "set score_threshold in the dataset config, e.g. 0.8 for scores in [0, 1]")
        keep_by_score(obj[key], key, opts)
        ex = {"id": rid, "query": texts[0][1], "pos": [texts[1][1]], "neg": []}
        if opts.keep_scores:
            ex["score"] = float(obj[key])
        return ex
    keep_by_label(obj[key], key, st=True)
    return {"id": rid, "query": texts[0][1], "pos": [texts[1][1]], "neg": []}


def parse_classification(obj: dict, f: dict, rid: str, r: RecordContext) -> Example:
    """text / label -> Example(query=text, pos=[desc(label)], neg=[desc(other labels)], label)."""
    desc, order = r.desc, r.order
    text = check_text(get_field(obj, f["text"]), f["text"])
    lab = label_str(get_field(obj, f["label"]), f["label"])
    if lab not in desc:
        known = ", ".join(repr(x) for x in order[:20]) + (", ..." if len(order) > 20 else "")
        raise BadRecord(f["label"], f"{lab!r} is not in label_descriptions (known: {known})",
                        "add the label to label_descriptions in the data config, or fix the record")
    return {"id": rid, "query": text, "pos": [desc[lab]], "neg": [desc[x] for x in order if x != lab],
            "label": lab}


def check_unknown_keys(obj: dict, known: frozenset, fmt: str) -> None:
    """BadRecord naming the first unknown key of ``obj`` (with the closest known key, a likely typo)."""
    unknown = [k for k in obj if k not in known]
    if not unknown:
        return
    key = sorted(unknown)[0]
    typo = closest(key, known)
    also = f"; also unknown: {', '.join(repr(k) for k in sorted(unknown)[1:])}" if len(unknown) > 1 else ""
    reads = ", ".join(sorted(known))
    if typo:
        raise BadRecord(key, f"unknown key (did you mean '{typo}'?{also})",
                        f"rename it to '{typo}', or list it in extra_fields of the dataset config to ignore it "
                        f"(data validate: --extra-field {key})")
    raise BadRecord(key, f"unknown key (a {fmt} record has: {reads}{also})",
                    f"list it in extra_fields of the dataset config to ignore it (data validate: --extra-field {key}), "
                    "map it with columns, or remove it")


def kalm_instruction(prompt: str) -> str:
    """A BGE prompt as a KaLM-style query prefix (empty prompt: no instruction)."""
    return KALM_TEMPLATE.format(prompt.strip()) if prompt.strip() else ""
