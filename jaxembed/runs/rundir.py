"""The run directory (``--workdir``) of ``jaxembed train`` and ``jaxembed pretrain retromae``: its layout, declared
once. Every file and folder of it is an attribute of ``RunDir`` (``RunDir(workdir).summary_json``); no other module
spells a run file's name (tests/test_rundir.py checks that).

``LAYOUT`` lists them, in the order a run makes them: the attribute, the name in the folder, who writes it and how
(whole, locked, read back by whom). docs/architecture.md ("The run directory") is its table, checked against it.

On a pod every process opens the same run directory; each file has one writer (process 0, unless the row says
otherwise) and the other processes wait for its outcome (jaxembed.pod). Files are written whole
(jaxembed.runs.atomic_files: a temporary name, then a rename) unless the row says otherwise, so a reader never sees half
a file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """One file or folder of the run directory: ``attr`` of ``RunDir``, ``name`` in the folder (a folder's ends
    with '/'), ``written``: who writes it and how, ``read``: who reads it back."""
    attr: str
    name: str
    written: str
    read: str

    @property
    def folder(self) -> bool:
        return self.name.endswith("/")


LAYOUT: tuple[Entry, ...] = (
    Entry("lock", "run.lock", "process 0, an exclusive flock held for the whole run; the holder's pid, host and "
          "command inside (jaxembed.runs.workdir_lock)", "a second run on the same folder, which stops"),
    Entry("config_json", "config.json", "process 0 at the start: the resolved config, written whole "
          "(jaxembed.config.io.write_resolved)", "a resumed run (its config must match), jaxembed export, sweeps, the "
          "model card"),
    Entry("config_txt", "config.txt", "with config.json: the same config as Python text", "people"),
    Entry("lora_base_json", "lora_base.json", "process 0 at the first start of a LoRA run: the base model's "
          "fingerprint and source, written whole (jaxembed.lora.check_base)", "a resumed run, jaxembed export (the "
          "base weights must not have changed)"),
    Entry("store", "store/", "process 0, when data.store is unset: the dataset store, a folder written whole "
          "(jaxembed.data.store)", "every process (the loader)"),
    Entry("data_report_json", "data_report.json", "pretrain retromae, process 0: what its data reader kept and "
          "left out", "people"),
    Entry("plan", "plan.npz", "process 0: the batch plan, built in blocks, each file written whole "
          "(jaxembed.data.plan.Plan.save)", "every process, memory-mapped; a resumed run checks it against its "
          "config (jaxembed.train.saved_plan)"),
    Entry("plan_json", "plan.json", "with plan.npz: its names, config, seed and summary", "sweep reports, "
          "jaxembed plan show"),
    Entry("step_tables", "./", "process 0, in the folder itself: the loader's table of step shapes, in windows, "
          "each written whole (the file names are jaxembed.data's: pipeline.STEP_TABLE_FILE)",
          "every process (the loader)"),
    Entry("init_from", "init_from/", "process 0, once, when model.init_from names a run without an export: that "
          "run's latest checkpoint exported (a folder written whole)", "step 0 of this run"),
    Entry("jax_cache", "jax_cache/", "JAX's persistent compilation cache, when train.compile_cache is on "
          "(jaxembed.runs.compile_cache)", "JAX, in a resumed run"),
    Entry("metrics_jsonl", "metrics.jsonl", "process 0 (jaxembed.runs.monitor): one JSON line per log step, "
          "appended and flushed; a line torn by a kill is cut when the run resumes", "sweep reports, the model "
          "card (jaxembed.runs.facts)"),
    Entry("tensorboard", "tensorboard/", "process 0 (jaxembed.runs.monitor): TensorBoard event files",
          "TensorBoard"),
    Entry("wandb_json", "wandb.json", "process 0 (jaxembed.runs.monitor): the W&B run id, written whole",
          "a resumed run (the same W&B run)"),
    Entry("wandb", "wandb/", "W&B's own files, unless WANDB_DIR is set", "wandb sync"),
    Entry("checkpoints", "checkpoints/", "Orbax (jaxembed.runs.checkpoints): <step>/ each, every process its "
          "shards, process 0 the rest; a step is committed by Orbax's rename", "a resumed run, jaxembed export, "
          "a later stage's model.init_from"),
    Entry("checkpoints_unreadable", "checkpoints_unreadable/", "process 0: unreadable checkpoints moved out of "
          "Orbax's way on resume", "people"),
    Entry("export", "export/", "process 0 at the end, when export.dir is unset: the model folder, written whole "
          "with its manifest (jaxembed.export)", "jaxembed eval, a later stage's model.init_from"),
    Entry("summary_json", "summary.json", "process 0 at the end: the run's summary, written whole",
          "sweeps (status), the model card, the next segment of a resumed run (its time)"),
    Entry("demo_results_json", "demo_results.json", "jaxembed demo: the scores before and after, written whole",
          "people"),
    Entry("train_log", "train.log", "a sweep's local runner: the run's output, appended", "people"),
    Entry("status_json", "status.json", "a sweep's runner: the run's state (running, done, failed), written "
          "whole", "jaxembed sweep status"),
)


#: each entry's name in the folder, by attribute (a folder's without its "/")
NAMES: dict[str, str] = {e.attr: e.name.rstrip("/") for e in LAYOUT}


def rundir(workdir: "str | os.PathLike | RunDir") -> "RunDir":
    """``workdir`` as a RunDir: itself when it is one already (what a caller inside a run passes), else the
    layout of that folder (a path from the command line, a sweep or a test)."""
    return workdir if isinstance(workdir, RunDir) else RunDir(workdir)


def _path(entry: Entry) -> property:
    name = entry.name.rstrip("/")

    def get(self) -> Path:
        return self.root / name if name != "." else self.root

    get.__doc__ = f"``{entry.name}``: written by {entry.written}; read by {entry.read}."
    return property(get)


class RunDir:
    """A run directory: ``RunDir(workdir)``; each file and folder of ``LAYOUT`` is an attribute (a Path)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __fspath__(self) -> str:
        return str(self.root)

    def __str__(self) -> str:
        return str(self.root)

    def export_dir(self, configured: str | os.PathLike | None = None) -> Path:
        """Where the run's export goes: ``configured`` (``export.dir``), or ``export/`` in the run directory."""
        return Path(os.path.expanduser(str(configured))) if configured else self.export

    def store_dir(self, configured: str | os.PathLike | None = None) -> Path:
        """The run's dataset store: ``configured`` (``data.store``), or ``store/`` in the run directory."""
        return Path(os.path.expanduser(str(configured))) if configured else self.store

    def has_checkpoints(self) -> bool:
        """Whether a checkpoint folder exists (a run that has saved, or is saving, a step)."""
        return self.checkpoints.is_dir()

    def is_run(self) -> bool:
        """Whether the folder holds a run (checkpoints, an export or a config), rather than a model folder."""
        return self.checkpoints.is_dir() or self.export.is_dir() or self.config_json.is_file()

    def __eq__(self, other) -> bool:
        return isinstance(other, RunDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)


for _entry in LAYOUT:
    setattr(RunDir, _entry.attr, _path(_entry))
del _entry
