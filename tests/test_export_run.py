"""`jaxembed export`: it reads a run directory without writing in it (a finished run on read-only storage exports
to a writable --out), and it removes the temporary folders that killed exports left beside --out."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxembed import config as cfglib


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, shared_data):
    """2 LoRA steps on a tiny random 1-layer BERT, a checkpoint at each step, exported at the end."""
    from jaxembed.data.config import dataset_config
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import train

    c = cfglib.default_config()
    c.model.name = str(tiny_model_dir("bert", num_layers=1))
    c.model.max_length = 32
    c.model.lora.enabled = True
    c.model.lora.rank = 2
    c.data.datasets = [dataset_config(name="wikiqa", path=str(shared_data / "train/wikiqa.jsonl"),
                                      task_type="retrieval", num_negatives=1, max_query_length=16,
                                      max_doc_length=16)]
    c.plan.global_batch_size = 4
    c.plan.steps = 2
    c.train.checkpoint_every = 1
    c.train.progress = False
    wd = tmp_path_factory.mktemp("export_run") / "run"
    summary = train(c, wd)
    assert summary["status"] == "completed" and summary["step"] == 2
    return wd


def _snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: its bytes (files) and modification time; equal before and after = nothing
    was written, replaced or removed there."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))} | {".": (None, folder.stat().st_mtime_ns)}


def test_export_from_a_run_writes_nothing_in_it(lora_run, tmp_path, capsys):
    """The run's config.json / config.txt, its plan, its LoRA base file and its checkpoints (an unfinished save
    of a stopped run included) are read, never rewritten or cleaned: the run may be on read-only storage."""
    from jaxembed.cli import main
    from jaxembed.runs.checkpoints import TMP_MARK

    (lora_run / "checkpoints" / f"3{TMP_MARK}-1234").mkdir()  # a save that a kill -9 interrupted
    before = _snapshot(lora_run)
    for step in ("latest", "1"):
        out = tmp_path / f"out_{step}"
        assert main(["export", "--workdir", str(lora_run), "--out", str(out), "--step", step]) == 0, \
            capsys.readouterr().err
        assert (out / "model.safetensors").is_file()
    changed = sorted(k for k in set(before) | set(_snapshot(lora_run)) if before.get(k) != _snapshot(lora_run).get(k))
    assert changed == [], changed


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_next_export_removes_the_folders_of_killed_exports(tmp_path, caplog):
    """kill -9 during an export leaves its temporary folder (partial weights) beside --out; the next export there
    removes it in one log line (the rule of jaxembed.data.leftovers: this host, a pid that is gone, no lock) and
    leaves a live writer's folder alone."""
    from jaxembed.runs import atomic_files
    from jaxembed.cli import main
    from jaxembed.models.tiny import tiny_model_dir

    out = tmp_path / "exp"
    host_part = atomic_files.unique_tmp(out).name.rsplit("-", 2)[0]  # .exp.tmp-{this host}
    dead = f"{host_part}-{_dead_pid()}-0123456789ab"
    live = f"{host_part}-{os.getpid()}-0123456789ab"  # this process: a writer that still runs
    for name in (dead, live, dead + ".old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"\0" * 100)  # partial weights
    with caplog.at_level(logging.WARNING, logger="jaxembed.data.leftovers"):
        assert main(["export", "--model", str(tiny_model_dir("bert", num_layers=1)), "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, "exp"])
    (line,) = [r.getMessage() for r in caplog.records if r.name == "jaxembed.data.leftovers"]
    assert line == (f"{tmp_path}: removed 2 temporary folders left by export processes of this host that are no "
                    f"longer running: {dead}, {dead}.old")
