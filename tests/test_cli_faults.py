"""Faults met through the commands, each ending in one line: damaged weights in a model folder (every command that
loads a model), Ctrl-C in any command (exit 130, temporary files removed), and length limits out of range (checked
before any work). The real bundled all-MiniLM-L6-v2 is copied and damaged; Ctrl-C is a real SIGINT that the
command's own process sends itself from inside the work (tests/faults/sitecustomize.py), so it always arrives
mid-work."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jaxembed.cli import main

HERE = Path(__file__).parent
JAXEMBED = str(Path(sys.executable).parent / "jaxembed")  # the console script of this environment
DAMAGED = r"\(fix: the file is damaged: download or copy it again, or export the model again\)"


def _one_line(err: str) -> str:
    """The command's stderr without the log lines: exactly one line, no traceback."""
    lines = [x for x in err.strip().splitlines() if not x.startswith(("WARNING ", "INFO "))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _copy(minilm_dir: Path, folder: Path, without: str = "model.safetensors") -> Path:
    """The model folder with links to every file but ``without`` (the test writes its own)."""
    folder.mkdir()
    for p in minilm_dir.iterdir():
        if p.name != without:
            (folder / p.name).symlink_to(p)
    return folder


def _header(path: Path) -> tuple[int, dict]:
    raw = path.read_bytes()[:8 + 100_000]
    n = int.from_bytes(raw[:8], "little")
    return n, json.loads(raw[8:8 + n])


def _damage(minilm_dir: Path, tmp_path: Path, kind: str) -> Path:
    src = minilm_dir / "model.safetensors"
    folder = _copy(minilm_dir, tmp_path / kind)
    st = folder / "model.safetensors"
    data = src.read_bytes()
    n, header = _header(src)
    if kind == "truncated":
        st.write_bytes(data[:len(data) // 2])
    elif kind == "truncated_header":
        st.write_bytes(data[:100])
    elif kind == "bad_header_json":
        st.write_bytes(data[:8] + b"x" + data[9:])
    elif kind == "offsets_beyond_file":  # the file is whole, one tensor's offsets point past its end
        end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
        info = header["embeddings.word_embeddings.weight"]
        size = info["data_offsets"][1] - info["data_offsets"][0]
        info["data_offsets"] = [end, end + size]
        text = json.dumps(header, separators=(",", ":")).encode()
        assert len(text) <= n
        st.write_bytes(data[:8] + text.ljust(n) + data[8 + n:])  # padded with spaces, as safetensors allows
    elif kind == "pickle_only":
        torch = pytest.importorskip("torch")
        st = folder / "pytorch_model.bin"
        torch.save(torch.nn.Linear(2, 2), st)  # a pickled module: torch.load(weights_only=True) refuses it
    elif kind == "missing_shard":
        weight_map = {k: ("model-00001-of-00002.safetensors" if i % 2 else "model-00002-of-00002.safetensors")
                      for i, k in enumerate(k for k in header if k != "__metadata__")}
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        (folder / "model-00001-of-00002.safetensors").symlink_to(src)
    return folder


DAMAGES = [
    ("truncated", r"model\.safetensors: truncated: its header says 90868376 bytes, the file has 45434188 \(tensor "
                  r"'[\w.]+' at data bytes \d+\.\.\d+ lies beyond the end\) " + DAMAGED),
    ("truncated_header", r"model\.safetensors: truncated: its header alone says \d+ bytes, the file has 100 "
                         + DAMAGED),
    ("bad_header_json", r"model\.safetensors: bad header JSON: Expecting value at byte 0 of the \d+-byte header "
                        + DAMAGED),
    ("offsets_beyond_file", r"model\.safetensors: truncated: its header says \d+ bytes, the file has 90868376 "
                            r"\(tensor 'embeddings.word_embeddings.weight' at data bytes \d+\.\.\d+ lies beyond the "
                            r"end\) " + DAMAGED),
    ("pickle_only", r"pytorch_model\.bin: a PyTorch pickle that torch\.load\(weights_only=True\) refuses \(Unsupported "
                    r"global: GLOBAL torch\.nn\.modules\.linear\.Linear was not an allowed global by default\); "
                    r"jaxembed reads safetensors, and PyTorch pickles only when they hold plain tensors \(fix: "
                    r"convert the folder to safetensors, e\.g\. transformers\.AutoModel\.from_pretrained\(FOLDER\)"
                    r"\.save_pretrained\(OUT, safe_serialization=True\)"),
    ("missing_shard", r"model\.safetensors\.index\.json: names shard model-00002-of-00002\.safetensors, which is "
                      r"missing from .*missing_shard \(fix: download or copy every shard the index names, or the "
                      r"whole folder again\)"),
]


@pytest.mark.parametrize("kind,match", DAMAGES, ids=[d[0] for d in DAMAGES])
def test_damaged_weights_are_one_line(minilm_dir, tmp_path, capsys, kind, match):
    """`jaxembed encode` on a copy of the real model with damaged weights: one line naming the file and what is
    wrong, exit 2, no output written."""
    folder = _damage(minilm_dir, tmp_path, kind)
    (tmp_path / "in.txt").write_text("a man plays a guitar\n")
    assert main(["encode", "--model", str(folder), "--input", str(tmp_path / "in.txt"), "--out",
                 str(tmp_path / "o.npy"), "-q"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {folder}/"), line
    assert re.search(match, line), line
    assert not (tmp_path / "o.npy").exists()


def test_damaged_weights_in_export_eval_and_train(minilm_dir, shared_data, tmp_path, capsys):
    """The same line from every command that loads a model: `export`, `eval` and `train` (model.name)."""
    folder = _damage(minilm_dir, tmp_path, "truncated")
    want = f"error: {folder}/model.safetensors: truncated: its header says 90868376 bytes, the file has 45434188 ("
    sts = tmp_path / "sts.jsonl"
    sts.write_text("".join(json.dumps({"sentence1": f"a {i}", "sentence2": f"b {i}", "score": i % 5}) + "\n"
                           for i in range(6)))
    cfg = tmp_path / "train.py"
    cfg.write_text("from jaxembed.config import default_config\nfrom jaxembed.data.config import dataset_config\n\n\n"
                   "def get_config(arg=None):\n    c = default_config()\n"
                   f"    c.model.name = {str(folder)!r}\n    c.model.max_length = 32\n"
                   f"    c.data.datasets = [dataset_config(name='w', path={str(shared_data / 'train/wikiqa.jsonl')!r},"
                   " task_type='retrieval', num_negatives=1)]\n"
                   "    c.plan.global_batch_size = 4\n    c.plan.steps = 2\n    return c\n")
    for args in (["export", "--model", str(folder), "--out", str(tmp_path / "exported")],
                 ["eval", "--model", str(folder), "--task", f"name=my-sts,type=sts,path={sts}", "-q"],
                 ["train", "--config", str(cfg), "--workdir", str(tmp_path / "run")]):
        assert main(args) == 2, args
        line = _one_line(capsys.readouterr().err)
        assert line.startswith(want), (args, line)
    assert not (tmp_path / "exported").exists()


# --------------------------------------------------------------------------------------------------- Ctrl-C


def _ctrl_c(tmp_path: Path, args: list[str], at: str) -> tuple[int, str]:
    """The real console script, with SIGINT sent from inside the work: right after the first call of ``at``
    (MODULE:FUNCTION) returns. Returns (exit status, stderr) once the fault was reached."""
    import runs

    marker = tmp_path / "marker"
    r = subprocess.run([JAXEMBED, *args], env=runs.env(1, fault=f"sigint_after={at}", marker=marker),
                       capture_output=True, text=True, timeout=600)
    assert marker.exists() and f"sigint_after {at}" in marker.read_text(), (r.returncode, r.stderr[-3000:])
    return r.returncode, r.stderr


def test_ctrl_c_in_data_prepare_is_one_line(tmp_path):
    """SIGINT after the first of two datasets is written: exit 130, one line, no store and no temporary folder."""
    paths = []
    for k in range(2):
        p = tmp_path / f"d{k}.jsonl"
        p.write_text("".join(json.dumps({"query": f"q{k} {i}", "pos": [f"p{k} {i}"]}) + "\n" for i in range(20)))
        paths.append(p)
    cfg = tmp_path / "data.py"
    cfg.write_text("from jaxembed.data.config import dataset_config, default_data_config\n\n\n"
                   "def get_config(arg=None):\n    c = default_data_config()\n"
                   f"    c.datasets = [dataset_config(name='d{0}', path={str(paths[0])!r}, task_type='retrieval'), "
                   f"dataset_config(name='d1', path={str(paths[1])!r}, task_type='retrieval')]\n    return c\n")
    out = tmp_path / "out" / "store"
    rc, err = _ctrl_c(tmp_path, ["data", "prepare", "--config", str(cfg), "--out", str(out), "-q"],
                      "jaxembed.data.store:_write_dataset")
    assert rc == 130, err
    assert _one_line(err) == ("error: interrupted (Ctrl-C): `jaxembed data prepare` stopped before it finished (run "
                              "the same command again to do the work)")
    assert not out.exists() and os.listdir(out.parent) == []  # the temporary folder is removed


def test_ctrl_c_in_export_is_one_line(minilm_dir, tmp_path):
    """SIGINT once model.safetensors is written into the export's temporary folder: exit 130, one line, no export
    and no temporary folder."""
    out = tmp_path / "out" / "exported"
    rc, err = _ctrl_c(tmp_path, ["export", "--model", str(minilm_dir), "--out", str(out)],
                      "jaxembed.export:write_safetensors")
    assert rc == 130, err
    assert _one_line(err) == ("error: interrupted (Ctrl-C): `jaxembed export` stopped before it finished (run the "
                              "same command again to do the work)")
    assert not out.exists() and os.listdir(out.parent) == []


def test_second_ctrl_c_in_train_is_one_line(shared_data, tmp_path):
    """`jaxembed train`: the first Ctrl-C asks for a checkpoint at the next step boundary; a second one, before
    that boundary, stops at once: exit 130, one line (the process sends itself both right after it logs step 1)."""
    from jaxembed.models.tiny import tiny_model_dir

    model = tiny_model_dir("bert", num_layers=1, max_length=32)
    cfg = tmp_path / "train.py"
    cfg.write_text("from jaxembed.config import default_config\nfrom jaxembed.data.config import dataset_config\n\n\n"
                   "def get_config(arg=None):\n    c = default_config()\n"
                   f"    c.model.name = {str(model)!r}\n    c.model.max_length = 32\n"
                   f"    c.data.datasets = [dataset_config(name='w', path={str(shared_data / 'train/wikiqa.jsonl')!r},"
                   " task_type='retrieval', num_negatives=1, max_query_length=16, max_doc_length=16)]\n"
                   "    c.plan.global_batch_size = 4\n    c.plan.steps = 50\n    c.train.log_every = 1\n"
                   "    c.export.at_end = False\n    return c\n")
    wd = tmp_path / "run"
    import runs

    marker = tmp_path / "marker"
    r = subprocess.run([JAXEMBED, "train", "--config", str(cfg), "--workdir", str(wd)],
                       env=runs.env(1, fault="sigint_after=jaxembed.runs.monitor:Monitor.log,sigints=2", marker=marker),
                       capture_output=True, text=True, timeout=600)
    assert marker.exists(), r.stderr[-3000:]
    assert r.returncode == 130, r.stderr[-3000:]
    assert _one_line(r.stderr) == ("error: interrupted (Ctrl-C): `jaxembed train` stopped before it finished (run "
                                   "the same command again to do the work)")
    assert not (wd / "summary.json").exists()


# --------------------------------------------------------------------------------------------------- length limits


def _train_config(tmp_path: Path, model: Path, shared_data: Path, max_length: int, query: int | None = 16,
                  doc: int | None = 16, steps: int = 2) -> Path:
    cfg = tmp_path / "train.py"
    cfg.write_text("from jaxembed.config import default_config\nfrom jaxembed.data.config import dataset_config\n\n\n"
                   "def get_config(arg=None):\n    c = default_config()\n"
                   f"    c.model.name = {str(model)!r}\n    c.model.max_length = {max_length}\n"
                   f"    c.data.datasets = [dataset_config(name='w', path={str(shared_data / 'train/wikiqa.jsonl')!r},"
                   f" task_type='retrieval', num_negatives=1, max_query_length={query}, max_doc_length={doc})]\n"
                   f"    c.plan.global_batch_size = 4\n    c.plan.steps = {steps}\n    c.train.log_every = 1\n"
                   "    return c\n")
    return cfg


LENGTHS = [  # (id, --config overrides, the error line after "error: ")
    ("model_max_length_1", ["--config.model.max_length=1"],
     r"config\.model\.max_length = 1 is too short: a max length counts the special tokens the tokenizer adds around "
     r"each text \(\[CLS\] \.\.\. \[SEP\], <s> \.\.\. </s>\), so it is at least 2 \(fix: a length in tokens such as "
     r"128, 256 or 512\)"),
    ("model_max_length_above_table", ["--config.model.max_length=600"],
     r"config\.model\.max_length = 600 is longer than the model's position table: 512 positions \(.*/config\.json: "
     r"max_position_embeddings 512\) \(fix: config\.model\.max_length at most 512\)"),
    ("dataset_limit_1", ["--config.model.max_length=128"],  # max_doc_length=1 in the config file (below)
     r"config\.data\.datasets\[0\]\.max_doc_length = 1 is too short: .* so it is at least 2 \(fix: .*\)"),
    ("dataset_limit_above_table", ["--config.model.max_length=128"],  # max_doc_length=1000 in the config file
     r"config\.data\.datasets\[0\]\.max_doc_length = 1000 is longer than the model's position table: 512 positions "
     r"\(.*/config\.json: max_position_embeddings 512\) \(fix: config\.data\.datasets\[0\]\.max_doc_length at most "
     r"512\)"),
    ("roberta_positions", ["--config.model.max_length=513"],  # a RoBERTa-style config.json (below)
     r"config\.model\.max_length = 513 is longer than the model's position table: 512 positions \(.*/config\.json: "
     r"max_position_embeddings 514 minus 2 \(RoBERTa-style positions start after pad_token_id 1\)\) \(fix: "
     r"config\.model\.max_length at most 512\)"),
]


@pytest.mark.parametrize("kind,overrides,match", LENGTHS, ids=[x[0] for x in LENGTHS])
def test_max_lengths_out_of_range_stop_train_before_any_work(minilm_dir, shared_data, tmp_path, capsys, kind,
                                                              overrides, match):
    """`jaxembed train` with a max length below 2 or above the position table (model.max_length or a dataset's):
    one line naming the key, the value, the limit and the fix, exit 2, and no run directory."""
    model, doc = minilm_dir, {"dataset_limit_1": 1, "dataset_limit_above_table": 1000}.get(kind, 16)
    if kind == "roberta_positions":
        model = _copy(minilm_dir, tmp_path / "roberta", without="config.json")
        hf_cfg = json.loads((minilm_dir / "config.json").read_text())
        hf_cfg.update(model_type="roberta", pad_token_id=1, max_position_embeddings=514)
        (model / "config.json").write_text(json.dumps(hf_cfg))
    cfg = _train_config(tmp_path, model, shared_data, 128, doc=doc)
    wd = tmp_path / "run"
    assert main(["train", "--config", str(cfg), "--workdir", str(wd), *overrides]) == 2
    line = _one_line(capsys.readouterr().err)
    assert re.fullmatch("error: " + match, line), line
    assert not wd.exists()


def test_max_lengths_out_of_range_stop_encode(minilm_dir, tmp_path, capsys, caplog):
    """`jaxembed encode --max-length` below 2 (the tokenizer could not cut at all: a 700-token text went through
    whole, past the 512 positions) or above the position table: one line, no output. A folder whose own
    max_seq_length is above the table is cut at the table, said in one log line (a 1-layer random BERT with
    MiniLM's tokenizer and 512 positions: the cap reads the folder's files, not its weights)."""
    from jaxembed.models.tiny import tiny_model_dir

    (tmp_path / "in.txt").write_text("word " * 700 + "\n")
    args = ["encode", "--model", str(minilm_dir), "--input", str(tmp_path / "in.txt"), "--out", str(tmp_path / "o.npy"),
            "-q"]
    assert main([*args, "--max-length", "1"]) == 2
    assert _one_line(capsys.readouterr().err).startswith(
        "error: --max-length / model.max_length = 1 is too short: a max length counts the special tokens")
    assert main([*args, "--max-length", "513"]) == 2
    assert re.fullmatch(r"error: --max-length / model\.max_length = 513 is longer than the model's position table: 512 "
                        r"positions \(.*/config\.json: max_position_embeddings 512\) \(fix: --max-length / "
                        r"model\.max_length at most 512\)", _one_line(capsys.readouterr().err))
    assert not (tmp_path / "o.npy").exists()
    long = _copy(tiny_model_dir("bert", num_layers=1, max_length=32), tmp_path / "long",
                 without="sentence_bert_config.json")
    assert json.loads((long / "config.json").read_text())["max_position_embeddings"] == 512
    (long / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1000, "do_lower_case": False}))
    with caplog.at_level("WARNING", logger="jaxembed.loading"):
        assert main(["encode", "--model", str(long), *args[3:]]) == 0
    said = [r.getMessage() for r in caplog.records if "position table" in r.getMessage()]
    assert said == [f"{long}: the folder's max length 1000 is longer than the position table: 512 positions "
                    f"({long}/config.json: max_position_embeddings 512); texts are cut at 512 tokens"], said


def test_dataset_limits_above_the_run_max_length_are_capped_and_said_once(shared_data, tmp_path, caplog):
    """A dataset's max_doc_length above model.max_length is capped at it (model.max_length caps every dataset's
    limits), said in one log line before the run starts; the export's max_seq_length is model.max_length. (In this
    process: what is checked is the config's log record and the export, not the process.)"""
    from jaxembed.models.tiny import tiny_model_dir

    model = tiny_model_dir("bert", num_layers=1, max_length=32)
    cfg = _train_config(tmp_path, model, shared_data, 24, query=16, doc=48, steps=1)
    wd = tmp_path / "run"
    with caplog.at_level("WARNING"):
        assert main(["train", "--config", str(cfg), "--workdir", str(wd)]) == 0
    said = [f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records
            if "capped at the run's max length" in r.getMessage()]
    assert said == ["WARNING jaxembed.config: config.data.datasets[0].max_doc_length = 48: capped at the run's max "
                    "length 24 (config.model.max_length), which caps every dataset's limits and is the export's "
                    "max_seq_length"], said
    assert json.loads((wd / "export" / "sentence_bert_config.json").read_text())["max_seq_length"] == 24


def test_gist_guide_with_a_shorter_position_table_is_named(minilm_dir, shared_data, tmp_path, capsys):
    """A GIST guide reads the run's token ids: one whose position table is shorter than model.max_length is named as
    the guide (the rule for the run's own model does not apply to it)."""
    from jaxembed.models.tiny import tiny_model_dir

    model = tiny_model_dir("bert", num_layers=1, max_length=600)  # MiniLM's tokenizer, 600 positions
    cfg = _train_config(tmp_path, model, shared_data, 600)
    with cfg.open("a") as f:
        f.write(f"\n\ndef _guide(c):\n    c.loss.gist_guide = {str(minilm_dir)!r}\n    return c\n\n\n"
                "_plain = get_config\nget_config = lambda arg=None: _guide(_plain(arg))\n")
    assert main(["train", "--config", str(cfg), "--workdir", str(tmp_path / "run")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (f"error: config.loss.gist_guide = {str(minilm_dir)!r} reads at most 512 tokens but the run's texts "
                    "reach 600 (fix: --config.model.max_length=512 or a guide with longer positions)"), line
