"""Adding a backbone is one folder, adding a record format one entry and its parser (docs/architecture.md, "A
backbone: one folder" and "A record format: one entry"): tests/added_backbone/ declares ``tiny_encoder`` (its model,
mapping table, facts and the tokenizer of its tiny models) and tests/added_format.py ``qa_pairs`` (question /
answer records); the test registers both, and the checks, the command line, the tiny model folder and a two-step
training run of the one on the other follow, with no other file changed."""

from __future__ import annotations

import json

import pytest

from jaxembed.errors import UserError


@pytest.fixture
def added():
    from added_format import FORMAT

    from jaxembed import models
    from jaxembed.data import formats

    arch = models.register("added_backbone")  # the folder
    formats.register(FORMAT)  # the one table entry
    try:
        yield arch, FORMAT
    finally:
        models.unregister("added_backbone")
        formats.unregister(FORMAT.name)


def _qa_file(path, n: int = 16, shared=None, extra: str = "") -> None:
    """``n`` question / answer records (WikiQA's questions and answers, or made up), one with ``extra`` keys."""
    if shared is not None:
        rows = [json.loads(x) for x in (shared / "train" / "wikiqa.jsonl").read_text().splitlines()[:n]]
        recs = [{"question": r["query"], "answer": r["pos"][0]} for r in rows]
    else:
        recs = [{"question": f"what is {i}?", "answer": f"{i} is a number"} for i in range(n)]
    lines = [json.dumps(r) for r in recs]
    if extra:
        lines[1] = lines[1][:-1] + ", " + extra + "}"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_an_added_record_format_is_read_detected_and_checked(added, tmp_path):
    """The table's users see the entry: auto-detection, the parser, the unknown-key and missing-field errors (file,
    line, field, fix), the data config's format check and ``data validate --format``'s choices; unregistered, the
    format is gone again."""
    from jaxembed.cli import build_parser
    from jaxembed.data import config as data_config
    from jaxembed.data import formats
    from jaxembed.data.readers import ReadInfo, read_files
    from jaxembed.data.parsers import DEFAULT_FIELDS

    _, fmt = added
    p = tmp_path / "qa.jsonl"
    _qa_file(p, 3, extra='"answr": "x"')
    info = ReadInfo()
    items = list(read_files(p, info=info))
    assert info.format == "qa_pairs" and items[0] == {"id": "data:1", "query": "what is 0?", "pos": ["0 is a number"],
                                                      "neg": []}
    assert str(items[1]) == ("qa.jsonl:2: field 'answr': unknown key (did you mean 'answer'?) (fix: rename it to "
                             "'answer', or list it in extra_fields of the dataset config to ignore it (data "
                             "validate: --extra-field answr))").replace("qa.jsonl", str(p))
    p.write_text('{"question": "why?", "answer": "because"}\n{"question": "how?"}\n')
    bad = list(read_files(p))[1]
    assert (bad.line, bad.field, bad.reason) == (2, "answer", "missing (keys present: question)")
    assert "qa_pairs" in formats.FORMAT_CHOICES and "qa_pairs (question, answer)" in formats.format_help()
    assert "qa_pairs" in data_config.FORMATS and DEFAULT_FIELDS["question"] == "question"
    data = data_config.default_data_config()
    data.datasets = [data_config.dataset_config(name="qa", path=str(p), format="qa_pairs", task_type="retrieval")]
    data_config.validate_data_config(data, "data")
    parser = build_parser()
    assert parser.parse_args(["data", "validate", str(p), "--format", "qa_pairs"]).format == "qa_pairs"
    formats.unregister(fmt.name)
    assert "qa_pairs" not in formats.FORMAT_CHOICES and "question" not in DEFAULT_FIELDS
    with pytest.raises(UserError, match=r"^data\.datasets\[0\]\.format: 'qa_pairs' is not one of auto, triplets, "):
        data_config.validate_data_config(data, "data")
    formats.register(fmt)


def test_an_added_backbone_has_all_its_facts(added):
    """The registered folder's ARCH, on its tiny model: the model type loads through it, the mapping table covers
    every parameter, the FLOP formula, the packing cost and the LoRA target apply."""
    import re

    from jaxembed import flops, lora, models
    from jaxembed.models import mapping, tiny

    arch, _ = added
    assert "tiny_encoder" in tiny.ARCHS and models.ARCHITECTURES["tiny_encoder"] is arch
    cfg = models.config_from_hf(tiny.tiny_hf_config("tiny_encoder"))
    assert isinstance(cfg, arch.config) and cfg.to_hf()["model_type"] == "tiny_encoder"
    model = models.abstract_model(cfg)
    params = set(models.param_shapes(model))
    mapped = {tuple(path) for _, path, _ in mapping.expand(arch.rules(cfg), cfg.num_layers)}
    assert isinstance(model, arch.model) and params and params <= mapped
    assert flops.layer_matrix_params(cfg) > 0 and flops.attention_width(cfg) > 0 and 0 < arch.packing_cost(cfg) < 1
    kernels = [".".join(map(str, p[:-1])) for p in params if p[-1] == "kernel"]
    assert lora.select(kernels, "", "tiny_encoder") == [k for k in kernels if re.search(arch.lora_target, k)]
    with pytest.raises(ValueError, match="already registered"):
        models.register("added_backbone")


def test_the_added_backbone_trains_on_the_added_format(added, tmp_path, shared_data):
    """One tiny run: the tiny_encoder's tiny folder (its own WordPiece tokenizer) trains two steps on a qa_pairs
    dataset named by its format."""
    from jaxembed import config as cfglib
    from jaxembed.data.config import dataset_config
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import train

    folder = tiny_model_dir("tiny_encoder", num_layers=1)
    assert json.loads((folder / "config.json").read_text())["model_type"] == "tiny_encoder"
    assert len(json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]) == 8000
    assert json.loads((folder / "jaxembed_tiny.json").read_text())["tokenizer"]["vocab"] == 8000
    _qa_file(tmp_path / "qa.jsonl", 16, shared_data)
    c = cfglib.default_config()
    c.model.name = str(folder)
    c.model.max_length = 16
    c.data.packing = False
    c.data.datasets = [dataset_config(name="qa", path=str(tmp_path / "qa.jsonl"), format="qa_pairs",
                                      task_type="retrieval", num_negatives=0, query_instruction="")]
    c.plan.global_batch_size = 8
    c.plan.steps = 2
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.export.at_end = False
    summary = train(c, tmp_path / "run")
    assert summary["status"] == "completed" and summary["skipped"] == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2]
    manifest = json.loads((tmp_path / "run" / "store" / "manifest.json").read_text())
    assert [(d["format"], d["counts"]["written"]) for d in manifest["datasets"]] == [("qa_pairs", 16)]
