"""The GPU benchmark's measurements, each run in a process of its own by benchmarks/gpu/bench.py
(``python benchmarks/gpu/bench.py --_worker NAME JSON``): one framework's memory never counts against the other's,
and a crash or an out-of-memory error ends one measurement, not the call. Every figure is printed as soon as it
is measured, one ``RESULT {json}`` line each, so a worker stopped at its deadline still reports what it has.

  smoke       versions, devices and one bf16 train step of a tiny BERT (is jaxembed usable here?)
  prepare     the model folders and the natural data, built on the CPU beside the smoke step
  train_jax   jaxembed's train step on fixed-length batches and natural-length batches (packed, padded), with a
              profile of where the step goes
  train_st    sentence-transformers (MultipleNegativesRankingLoss, bf16 autocast) on the same batches: its own
              padding, the fixed batches, and padding-free (flattened rows, varlen attention)
  batch       the largest global batch (1 positive + 5 hard negatives, gradient cache + tiled loss)
  encode      jaxembed's encode vs sentence-transformers' on the natural texts
  long        long documents in packed rows of 512-2,048 slots, each attention kernel in the full train step
  llm_jax     a 1.5B / 7B decoder (full fine-tuning or LoRA, remat, gradient cache) at 512-token documents
  llm_st      sentence-transformers' recipe on it (PEFT LoRA, gradient checkpointing): the largest batch
  serve       the dry run's one process for every job (imports once)

This module dispatches the jobs; the measurements live by role: timing.py (RESULT lines, ahead-of-time
compilation, timed rounds, the figures of an arm), arm_jax.py (smoke, train_jax, batch, long), arm_st.py
(train_st, encode), flat.py (ST's padding-free attention), arm_llm.py (llm_jax, llm_st), with harness.py's
model folders, data and FLOP counts.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import harness as H
from arm_jax import batch, long, smoke, train_jax
from arm_llm import llm_jax, llm_st
from arm_st import encode, train_st
from flat import FLAT_ORDER, VARLEN_RAN  # noqa: F401  (read as workers.* by bench.py's help and the tests)
from flat import flex_compiled as _flex_compiled  # noqa: F401  (the names the tests call them by)
from flat import register_torch_varlen as _register_torch_varlen  # noqa: F401
from flat import cpu_varlen_reference as _varlen_reference  # noqa: F401
from timing import emit, error_text


def _prepare_one(args) -> tuple[str, float]:
    root, name = args
    t0 = time.time()
    H.model_folder(name, Path(root) / "models")
    return name, time.time() - t0


def prepare(a: dict) -> None:
    """The call's model folders (random weights of real configs, built on the CPU) and the natural data file,
    a.processes at a time: run beside the smoke step on the device machine's 16 cores, so that part 2's workers
    find them built."""
    root = Path(a["root"])
    t0 = time.time()
    H.natural_data_file(root)
    names = list(dict.fromkeys(a["models"]))
    if int(a.get("processes", 0)) > 1 and len(names) > 1:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(min(int(a["processes"]), len(names)), mp_context=mp.get_context("spawn")) as ex:
            done = dict(ex.map(_prepare_one, [(str(root), n) for n in names]))
    else:
        done = dict(_prepare_one((str(root), n)) for n in names)
    emit(kind="prepare", seconds=time.time() - t0, models=done)


def serve() -> None:
    """The dry run's one worker process (bench.py's Workers(shared=True)): jobs from stdin, one JSON line each
    ({"name", "payload", "log", "env"}); each job's output, RESULT lines included, goes to its log file, which ends
    with "JOB_END <rc>". One process instead of one per job: the imports (torch's above all) happen once."""
    import os

    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        os.environ.update(job.get("env") or {})
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        saved = os.dup(1), os.dup(2)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        rc = 0
        try:
            WORKERS[job["name"]](job["payload"])
        except BaseException as e:  # noqa: BLE001 -- the job's failure, not the server's
            emit(kind="fatal", error=error_text(e))
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            print(f"JOB_END {rc}", flush=True)
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for x in (fd, *saved):
                os.close(x)


WORKERS = {"smoke": smoke, "train_jax": train_jax, "train_st": train_st, "batch": batch, "encode": encode,
           "long": long, "llm_jax": llm_jax, "llm_st": llm_st, "prepare": prepare}


def main(name: str, payload: str) -> None:
    if name == "serve":
        return serve()
    try:
        WORKERS[name](json.loads(payload))
    except Exception as e:  # noqa: BLE001 -- the parent reads this line; the exit status says it too
        emit(kind="fatal", error=error_text(e))
        sys.exit(1)
