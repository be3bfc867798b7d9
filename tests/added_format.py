"""A record format added from outside the package, as docs/architecture.md ("A record format: one entry") adds one:
``qa_pairs``, a question and its answer per record. tests/test_add_component_backbone_format.py registers
``FORMAT`` in the format table and trains a dataset of it."""

from __future__ import annotations

from jaxembed.data.formats import RecordFormat
from jaxembed.data.parsers import Example, RecordContext, check_text, get_field


def parse_qa_pair(obj: dict, f: dict, rid: str, r: RecordContext) -> Example:
    """question / answer -> Example (the answer is the question's positive)."""
    question = check_text(get_field(obj, f["question"]), f["question"])
    answer = check_text(get_field(obj, f["answer"]), f["answer"])
    return {"id": rid, "query": question, "pos": [answer], "neg": []}


FORMAT = RecordFormat(
    "qa_pairs", "question, answer", ("id", "question", "answer"), parse_qa_pair,
    detect=("question", "answer"), detect_rank=5,
    no_task_type="qa_pairs records ({src}) have no task type (fix: set task_type, e.g. retrieval)")
