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
