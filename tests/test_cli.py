"""`jaxembed encode` / `export` / `demo`: outputs, and one-line errors naming file, line, field and fix."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxembed.cli import main
from jaxembed.encode import Encoder


def _card(folder: Path) -> tuple[dict, str]:
    """(front matter, body) of an export's README.md; the front matter passes the hub's checks
    (tests/fake_hub_server.py) and huggingface_hub's parser."""
    import re

    import yaml
    from huggingface_hub import ModelCard

    from fake_hub_server import front_matter_errors

    text = (folder / "README.md").read_text(encoding="utf-8")
    assert front_matter_errors(text) == []
    ModelCard(text)
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    return yaml.safe_load(m.group(1)), m.group(2)


def _write(path: Path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The market fell sharply.",
         "It is raining in the city today and tomorrow as well."]


def test_encode_jsonl_and_text_in_input_order(minilm_dir, minilm, tmp_path, capsys):
    src = _write(tmp_path / "in.jsonl", [json.dumps({"id": i, "sentence": t}) for i, t in enumerate(TEXTS)])
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--field", "sentence",
                 "--out", str(tmp_path / "a.npy"), "-q"]) == 0
    assert "4 x 384" in capsys.readouterr().out
    txt = _write(tmp_path / "in.txt", TEXTS)
    assert main(["encode", "--model", str(minilm_dir), "--input", str(txt), "--out", str(tmp_path / "b.npy"),
                 "--dim", "128", "--prompt", "query: ", "--batch-size", "3", "-q"]) == 0
    a, b = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert a.dtype == np.float32 and a.shape == (4, 384) and b.shape == (4, 128)
    ref = Encoder.from_loaded(minilm).encode(TEXTS)
    np.testing.assert_allclose(a, ref, atol=1e-6)
    ref_b = Encoder.from_loaded(minilm).encode(TEXTS, prompt="query: ", dim=128)
    np.testing.assert_allclose(b, ref_b, atol=1e-6)


def test_encode_that_fails_while_writing_keeps_the_earlier_output(minilm_dir, tmp_path, monkeypatch, capsys):
    """A write cut off (disk full, Ctrl-C) leaves --out as it was: the matrix goes to a temporary file in the same
    folder, which replaces --out only when complete, and is removed on failure."""
    src = _write(tmp_path / "in.txt", TEXTS)
    out = tmp_path / "emb.npy"
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(out), "-q"]) == 0
    before = out.read_bytes()

    def half_then_full(f, parts, width):  # writes part of the file, then the disk is full
        f.write(b"\x93NUMPY" + b"\0" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("jaxembed.encode.write_npy_rows", half_then_full)
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(out), "--dim", "64",
                 "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: No space left on device: `jaxembed encode` stopped before it finished (fix: free "
                          "some space") and err.count("\n") == 1, err
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["emb.npy", "in.txt"]

    def denied(f, parts, width):
        raise PermissionError(13, "Permission denied", f.name)

    monkeypatch.setattr("jaxembed.encode.write_npy_rows", denied)
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(out), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Permission denied (") and "(fix: check that you may read or write that path" in err
    assert out.read_bytes() == before


@pytest.mark.parametrize("lines,match", [
    (['{"text": "ok"}', '{"text": "broken'], r"in\.jsonl:2: invalid JSON"),
    (['{"text": "ok"}', '{"body": "x"}'], r"in\.jsonl:2: field 'text': missing \(keys present: body\)"),
    (['{"text": "   "}'], r"in\.jsonl:1: field 'text': empty text"),
    (['{"text": 5}'], r"in\.jsonl:1: field 'text': expected a string, got int"),
    (['["a list"]'], r"in\.jsonl:1: expected a JSON object"),
    (['{"text": "a"}', '', '{"text": "b"}'], r"in\.jsonl:2: empty line"),
])
def test_bad_input_lines_are_named(minilm_dir, tmp_path, capsys, lines, match):
    src = _write(tmp_path / "in.jsonl", lines)
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "fix:" in err
    import re

    assert re.search(match, err), err
    assert not (tmp_path / "o.npy").exists()


def test_bad_model_folders_are_named(minilm_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.txt", TEXTS)
    assert main(["encode", "--model", str(tmp_path / "nope"), "--input", str(src), "--out",
                 str(tmp_path / "o.npy")]) == 2
    assert "no such folder" in capsys.readouterr().err
    bad = tmp_path / "gpt"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert main(["encode", "--model", str(bad), "--input", str(src), "--out", str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert "config.json: model_type='gpt2' is not supported" in err and "bert" in err
    empty = tmp_path / "empty"
    shutil.copytree(minilm_dir, empty)
    (empty / "model.safetensors").unlink()
    assert main(["encode", "--model", str(empty), "--input", str(src), "--out", str(tmp_path / "o.npy")]) == 2
    assert "no weights found" in capsys.readouterr().err


def test_bad_arguments(minilm_dir, tmp_path, capsys):
    src = _write(tmp_path / "in.txt", TEXTS)
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "o.txt")]) == 2
    assert "must end in .npy" in capsys.readouterr().err
    assert main(["encode", "--model", str(minilm_dir), "--input", str(tmp_path / "none.jsonl"),
                 "--out", str(tmp_path / "o.npy")]) == 2
    assert "none.jsonl: no such file" in capsys.readouterr().err
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "o.npy"),
                 "--dim", "999", "-q"]) == 2
    assert "--dim must be between 1 and the model's dimension 384" in capsys.readouterr().err
    assert main(["encode", "--model", str(minilm_dir), "--input", str(src), "--out", str(tmp_path / "o.npy"),
                 "--prompt-name", "nope", "-q"]) == 2
    assert "unknown prompt_name 'nope'" in capsys.readouterr().err


def test_export_command_and_console_script(minilm_dir, minilm, tmp_path):
    """The console script exports a folder that loads back to the same parameters, prompts and embeddings."""
    import jax
    from flax import nnx

    from jaxembed import loading

    out = tmp_path / "exported"
    r = subprocess.run([str(Path(sys.executable).parent / "jaxembed"), "export", "--model", str(minilm_dir),
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert {"config.json", "model.safetensors", "modules.json", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    meta, body = _card(out)  # the bundled all-MiniLM-L6-v2 is named by its hub id, with its license
    assert (meta["base_model"], meta["license"]) == ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")
    assert body.startswith("\n# sentence-transformers/all-MiniLM-L6-v2 (jaxembed export)\n")
    assert f"SentenceTransformer({str(out.resolve())!r})" in body
    again = loading.load(str(out))
    src, exp = (jax.tree_util.tree_leaves_with_path(nnx.state(m.model, nnx.Param)) for m in (minilm, again))
    assert [p for p, _ in src] == [p for p, _ in exp]
    for (path, a), (_, b) in zip(src, exp):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=jax.tree_util.keystr(path))
    assert again.st.prompts == minilm.st.prompts and again.st.similarity_fn_name == minilm.st.similarity_fn_name
    np.testing.assert_array_equal(Encoder.from_loaded(again).encode(TEXTS, progress=False),
                                  Encoder.from_loaded(minilm).encode(TEXTS, progress=False))


def test_demo_trains_evaluates_and_exports(shared_data, minilm, tmp_path, capsys):
    """`make demo`'s job, on the :tiny variant with subsampled evaluation sets (30 examples: WikiQA's 30 queries
    hold ~290 candidates, encoded before and after); rerun, it resumes."""
    assert main(["demo", "--tiny", "--workdir", str(tmp_path / "demo"), "--tasks", "STSBenchmark,WikiQA",
                 "--max-examples", "30", "-q", "--config.plan.steps=2", "--config.model.max_length=32"]) == 0
    out = capsys.readouterr().out
    assert "nearest neighbours by cosine similarity" in out
    assert "sentence-transformers loads the export: max |difference|" in out
    diff = float(out.split("max |difference| to jaxembed's embeddings ")[1].split()[0])
    assert diff <= 1e-5
    table = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("STSBenchmark", "WikiQA"))}
    assert set(table) == {"STSBenchmark", "WikiQA"}
    assert 60 < float(table["STSBenchmark"][2]) <= 100  # the real model's score before training
    results = json.loads((tmp_path / "demo" / "demo_results.json").read_text())
    assert set(results["before"]) == set(results["after"]) == {"STSBenchmark", "WikiQA"}
    # the trained result: 2 finite, applied steps; the export is the trained model (it moved off the base model,
    # a little: 2 steps at lr 2e-5), and "after" is the export's own score
    wd = tmp_path / "demo"
    summary = json.loads((wd / "summary.json").read_text())
    assert (summary["status"], summary["step"], summary["skipped"]) == ("completed", 2, 0)
    meta, body = _card(wd / "export")  # the card of a run on the bundled all-MiniLM-L6-v2
    assert (meta["base_model"], meta["license"]) == ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0")
    assert (meta["library_name"], meta["pipeline_tag"]) == ("sentence-transformers", "sentence-similarity")
    assert "site-packages" not in body.split("<details>")[0]  # no local path stands for the base model
    assert body.startswith("\n# all-MiniLM-L6-v2 fine-tuned on 4 datasets\n") and "4 datasets, " in body
    assert f"SentenceTransformer({str((wd / 'export').resolve())!r})" in body and "'PATH'" not in body
    train_lines = [x for x in map(json.loads, (wd / "metrics.jsonl").read_text().splitlines()) if x["split"] == "train"]
    assert [x["step"] for x in train_lines] == [2] and np.isfinite(train_lines[0]["loss"])
    # demo:tiny's own plan on this store (the run above overrides its 4 steps): a batch of each of its 4 datasets
    from jaxembed import config as cfglib
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store

    cfg = cfglib.load_config_file("demo:tiny")
    plan = build_plan(Store.open(wd / "store"), cfg.plan, data_config=cfglib.data_section(cfg))
    assert sorted(plan.dataset_names[int(d)] for d in plan.dataset_ids[:, 0]) == ["snli", "stsb", "trec", "wikiqa"]
    from jaxembed import evaluate as evallib
    from jaxembed.encode import load_encoder

    trained, base = load_encoder(str(wd / "export")), Encoder.from_loaded(minilm)  # minilm: the demo's base model
    a, b = trained.encode(TEXTS, progress=False), base.encode(TEXTS, progress=False)
    assert 1e-6 < np.abs(a - b).max() and np.sum(a * b, axis=1).min() > 0.99
    again = evallib.evaluate(trained, ["STSBenchmark"], max_examples=30, progress=False)
    assert again["STSBenchmark"]["main_score"] == pytest.approx(results["after"]["STSBenchmark"]["main_score"],
                                                                abs=1e-9)
    # rerunning the demo resumes the run: nothing is trained again, the same weights are exported and score the same
    exported = (wd / "export" / "model.safetensors").read_bytes()
    assert main(["demo", "--tiny", "--workdir", str(wd), "--tasks", "STSBenchmark", "--max-examples", "30", "-q",
                 "--config.plan.steps=2", "--config.model.max_length=32"]) == 0
    out = capsys.readouterr().out
    assert "resuming at step 2 of 2" in out and "[train step" not in out
    assert (wd / "export" / "model.safetensors").read_bytes() == exported
    rerun = json.loads((wd / "demo_results.json").read_text())
    assert rerun["after"]["STSBenchmark"]["main_score"] == pytest.approx(
        results["after"]["STSBenchmark"]["main_score"], abs=1e-9)
    assert float(table["STSBenchmark"][3]) == pytest.approx(results["after"]["STSBenchmark"]["main_score"], abs=0.006)


def test_a_closed_pipe_ends_the_command_quietly(monkeypatch):
    """`jaxembed eval --list | head -1`: the reader closes the pipe before the command writes; the command ends with
    128 + SIGPIPE and writes nothing to stderr (no traceback). A broken pipe that is not standard output's is still
    an error. (`jaxembed.cli.main` handles it for every command; `eval --list` is the cheapest that prints.)"""
    import os

    read, write = os.pipe()
    p = subprocess.Popen([str(Path(sys.executable).parent / "jaxembed"), "eval", "--list"], stdout=write,
                         stderr=subprocess.PIPE)
    os.close(write)
    os.close(read)  # before the command has imported what it needs, let alone written
    err = p.stderr.read()
    assert (p.wait(timeout=120), err) == (141, b"")

    from jaxembed import cli

    def broken(args):
        raise BrokenPipeError("a socket of the command's own")

    monkeypatch.setattr(cli, "cmd_recipes", broken)
    with pytest.raises(BrokenPipeError, match="a socket"):
        main(["recipes"])


def _options(parser, command: str) -> dict:
    """{subcommand path: sorted option strings} of ``command`` in ``parser`` (its actions' flags, recursively)."""
    import argparse

    out = {}

    def walk(p, path):
        out[path] = sorted(s for a in p._actions for s in a.option_strings)
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    walk(child, f"{path} {name}")

    walk(next(a for a in parser._actions if a.dest == "command").choices[command], command)
    return out


def test_a_command_imports_the_parsers_of_its_own_module_alone():
    """`jaxembed <command>` builds the parsers of its command's module only (the others' modules stay unimported: a
    start of the console script costs less), and each command parses as in the full parser of `jaxembed --help`."""
    from jaxembed import cli

    full = cli.build_parser()
    commands = next(a for a in full._actions if a.dest == "command").choices
    assert set(commands) == set(cli._COMMAND_MODULES) | set(cli._OWN_COMMANDS)
    for command in commands:
        assert _options(cli.build_parser(command), command) == _options(full, command), command
    assert cli._command_of(["-v", "data", "validate", "x"]) == "data" and cli._command_of(["--help"]) is None
    code = ("import sys\nfrom jaxembed.cli import main\nrc = main(['eval', '--list'])\n"
            "print(rc, sorted(m for m in sys.modules if m.endswith('.cli') or m in ('jax', 'jaxembed.config')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.splitlines()[-1] == "0 ['jaxembed.cli', 'jaxembed.evaluate.cli']", r.stdout[-2000:] + r.stderr
