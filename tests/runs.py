"""Helpers for tests that start real ``jaxembed`` processes (tests/test_pod.py, the fault tests of
tests/test_train.py): the environment (CPU devices, a shared JAX compilation cache, the fault injector of
tests/faults), pods of several processes started at the same moment, waiting on marker files (never on a sleep),
kill -9, and checkpoint reading."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).parent
FAULTS = HERE / "faults"  # sitecustomize.py: JAXEMBED_TEST_FAULT
JAXEMBED = str(Path(sys.executable).parent / "jaxembed")  # the console script of this environment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def xla_flags(devices: int | None = None) -> str:
    """XLA_FLAGS for a process the suite starts: the suite's own (tests/conftest.py: fast compilation of its small
    programs) and, with ``devices``, that many simulated CPU devices."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


# XLA's classic CPU emitters: the suite compiles with them (tests/conftest.py FAST_XLA), XLA's default is its MLIR
# fusion emitters
CLASSIC_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def fusion_emitter_options() -> dict:
    """compiler_options for a program that a test compares with another at float32 rounding: XLA's own CPU
    emitters where the suite compiles with its classic ones (tests/test_models_t5.py: the plain and the remat
    gradient programs are then bitwise equal; with the classic emitters at -O0 one element of gradients up to 273
    lands 1.0004 x the test's allowance apart); no options otherwise."""
    if CLASSIC_EMITTERS not in os.environ.get("XLA_FLAGS", "").split():
        return {}
    return {"xla_cpu_use_fusion_emitters": True}


def env(devices: int, fault: str = "", marker: Path | None = None, **extra) -> dict:
    """A subprocess environment: ``devices`` CPU devices, the suite's persistent compilation cache (inherited,
    tests/conftest.py: processes share compiled programs), faults from tests/faults, unbuffered output."""
    e = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(devices),
             PYTHONUNBUFFERED="1", JAXEMBED_TEST_FAULT=fault,
             PYTHONPATH=os.pathsep.join([str(FAULTS), str(HERE), os.environ.get("PYTHONPATH", "")]))
    for k in ("JAXEMBED_COORDINATOR", "JAXEMBED_NUM_PROCESSES", "JAXEMBED_PROCESS_ID", "JAXEMBED_DISTRIBUTED"):
        e.pop(k, None)
    if marker is not None:
        e["JAXEMBED_TEST_MARKER"] = str(marker)
    e.update({k: str(v) for k, v in extra.items()})
    return e


class Proc:
    """A started process whose output goes to a file (a pipe could fill up and stall it)."""

    def __init__(self, args: list[str], env: dict, log: Path):
        self.log = Path(log)
        self._f = open(self.log, "w")
        self.p = subprocess.Popen(args, env=env, stdout=self._f, stderr=subprocess.STDOUT)

    @property
    def returncode(self):
        return self.p.poll()

    def output(self) -> str:
        if not self._f.closed:
            self._f.flush()
        return self.log.read_text(errors="replace")

    def kill9(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self._f.close()

    def signal(self, sig) -> None:
        self.p.send_signal(sig)


def start(args: list[str], env: dict, log: Path) -> Proc:
    return Proc([JAXEMBED, *args], env, log)


def start_pod(n: int, devices_each: int, args: list[str], log_prefix: Path, fault: str = "",
              marker: Path | None = None, extra: dict[int, list[str]] | None = None,
              pause: tuple[int, Path] | None = None) -> list[Proc]:
    """``n`` processes of ``jaxembed ARGS`` started back to back (the same moment), each with ``devices_each`` CPU
    devices, joined by JAXEMBED_COORDINATOR / JAXEMBED_NUM_PROCESSES / JAXEMBED_PROCESS_ID. ``extra``: more
    arguments for some processes (by index); pause: (step, marker), each process pauses after logging that step
    until a SIGTERM has reached the pod (tests/signal_pause.py)."""
    coord = f"127.0.0.1:{free_port()}"
    envs = [env(devices_each, fault, marker, JAXEMBED_COORDINATOR=coord, JAXEMBED_NUM_PROCESSES=n,
                JAXEMBED_PROCESS_ID=i) for i in range(n)]
    cmd = [JAXEMBED] if pause is None else [sys.executable, str(HERE / "signal_pause.py"), str(pause[0]),
                                            str(pause[1])]
    return [Proc([*cmd, *args, *(extra or {}).get(i, [])], envs[i], Path(f"{log_prefix}.p{i}.log"))
            for i in range(n)]


def describe(procs: list[Proc]) -> str:
    return "\n".join(f"--- process {i} (exit {p.returncode}):\n{p.output()[-3000:]}" for i, p in enumerate(procs))


def wait_all(procs: list[Proc], timeout: float = 600) -> list[str]:
    """Wait until every process has ended; one that fails ends the others at once (their peers would wait for
    it). Returns the outputs; raises AssertionError with every log unless all exited 0."""
    t0 = time.time()
    while any(p.returncode is None for p in procs):
        if any(p.returncode not in (None, 0) for p in procs) or time.time() - t0 > timeout:
            for p in procs:
                p.kill9()
            raise AssertionError("a process failed or the run timed out:\n" + describe(procs))
        time.sleep(0.05)
    outs = [p.output() for p in procs]
    assert all(p.returncode == 0 for p in procs), describe(procs)
    return outs


def wait_ended(procs: list[Proc], timeout: float = 600) -> list[str]:
    """Wait until every process has ended, whatever its exit status; returns the outputs."""
    t0 = time.time()
    while any(p.returncode is None for p in procs):
        if time.time() - t0 > timeout:
            for p in procs:
                p.kill9()
            raise AssertionError("timed out:\n" + describe(procs))
        time.sleep(0.05)
    return [p.output() for p in procs]


def wait_for(path: Path, procs: list[Proc], timeout: float = 600) -> None:
    """Wait until ``path`` exists; fail (with the logs) if a process ends first."""
    t0 = time.time()
    while not Path(path).exists():
        if any(p.returncode is not None for p in procs) or time.time() - t0 > timeout:
            for p in procs:
                p.kill9()
            raise AssertionError(f"{path} never appeared:\n" + describe(procs))
        time.sleep(0.02)


def params_at(workdir: Path, step: int):
    """(params, whole state) of a run's checkpoint, as numpy arrays (also one saved on another device count)."""
    import orbax.checkpoint as ocp

    path = Path(workdir).absolute() / "checkpoints" / str(step) / "default"
    ckptr = ocp.PyTreeCheckpointer()
    tree = ckptr.metadata(path).item_metadata.tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = ckptr.restore(path, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    return restored["params"], restored


def steps_of(workdir: Path) -> list[int]:
    ck = Path(workdir) / "checkpoints"
    return sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) if ck.is_dir() else []


def assert_bitwise_equal(a, b) -> None:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def export_tensors(folder: Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(Path(folder) / "model.safetensors"))


def leftovers(folder: Path) -> list[str]:
    """Temporary files / folders left anywhere under ``folder`` (jaxembed.runs.atomic_files' and Orbax's naming)."""
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*")
                  if ".tmp" in p.name or "orbax-checkpoint-tmp" in p.name)


# ------------------------------------------------------------------------------------------- a tiny training run

CONFIG_TEMPLATE = '''
from jaxembed.config import default_config
from jaxembed.data.config import dataset_config

def get_config(arg=None):
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 64
    c.data.datasets = [
        dataset_config(name="stsb", path={stsb!r}, format="scored_pairs", task_type="sts", score_threshold=3.0,
                       num_negatives=0, max_query_length=16, max_doc_length=16),
        dataset_config(name="wikiqa", path={wikiqa!r}, task_type="retrieval", num_negatives=1,
                       query_instruction="Instruct: Given a question, retrieve answers \\n Query: ",
                       max_query_length=16, max_doc_length=16),
    ]
    c.plan.global_batch_size = 8
    c.plan.steps = 8
    c.optim.lr = 1e-3
    # Adam's epsilon well above float32 reduction noise: the runs compared here (2 processes x 2 devices against
    # 1 x 4) sum the same gradients in another order (~1e-7 relative); at the default 1e-8, an element whose
    # gradient is that noise moves by +-lr per step (m / sqrt(v) = its sign) in one run and not the other
    c.optim.eps = 1e-6
    c.train.log_every = 2
    c.train.checkpoint_every = 3
    c.train.async_checkpoints = True
    c.export.at_end = True
    return c
'''


def tiny_model(out: Path, tokenizer_dir: Path, layers: int = 2) -> Path:
    """A ``layers``-layer, 32-wide random BERT with MiniLM's tokenizer, as a sentence-transformers folder."""
    from jaxembed import export, models
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.tokenizer import Tokenizer

    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=30522, hidden_size=32, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=128,
                                     hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1))
    export.export(EmbeddingModel.init(cfg, HeadConfig("mean"), seed=0), Tokenizer.from_folder(tokenizer_dir, 64), out)
    return out


def tiny_config(path: Path, model_dir: Path, data_dir: Path) -> Path:
    """The tiny run config (2 datasets, texts cut to 16 tokens: one compiled shape; 8 steps of 8 queries;
    checkpoints every 3 steps, the last 2 kept; export at the end) written to ``path``."""
    path.write_text(CONFIG_TEMPLATE.format(model=str(model_dir), stsb=str(data_dir / "train/stsb_pairs.jsonl"),
                                           wikiqa=str(data_dir / "train/wikiqa.jsonl")))
    return path
