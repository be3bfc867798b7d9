"""The suite's own policy (tests/conftest.py): in CI (JAXEMBED_CI=1) a skip -- in a test, in a fixture, or of a whole
module at import -- is a failure naming the test, except a `gpu` test without an accelerator, a `tpu` test
without a TPU and an allow-listed one; outside CI a skip stays a skip; pytest-timeout fails a hung test by name.
Runs a small suite in a subprocess under the real conftest, with .ci/run's --continue-on-collection-errors."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

SUITE = {
    "test_a.py": '''
        import time
        import pytest

        @pytest.fixture
        def needs_x():
            pytest.skip("x is missing")

        def test_passes():
            pass

        def test_body_skip():
            pytest.importorskip("no_such_module_xyz")

        def test_fixture_skip(needs_x):
            pass

        @pytest.mark.gpu
        def test_on_gpu():
            pass

        @pytest.mark.tpu
        def test_on_tpu():
            pass

        @pytest.mark.tpu
        def test_on_tpu_skips_itself():  # on a TPU: an unexpected skip like any other
            import jax

            pytest.skip("own reason" if jax.default_backend() == "tpu" else "unreachable: skipped before")

        @pytest.mark.parametrize("k", [1, 2])
        def test_allowed(k):
            pytest.skip("allowed here")

        @pytest.mark.xfail(reason="known", strict=True)
        def test_xfail():
            assert False

        @pytest.mark.timeout(2)
        def test_hangs():
            time.sleep(60)
    ''',
    "test_b.py": '''
        import pytest
        pytest.importorskip("no_such_module_xyz")

        def test_never():
            pass
    ''',
}


def _run(tmp_path, ci: bool):
    d = tmp_path / ("ci" if ci else "local")
    d.mkdir()
    # the real conftest, plus one allow-listed test of this small suite
    (d / "conftest.py").write_text(CONFTEST.read_text() + '\nALLOWED_SKIPS["test_a.py::test_allowed"] = "test"\n')
    for helper in ("slow_tests.py", "runs.py"):  # the conftest's list of slow tests (none here), its XLA flag
        shutil.copy(CONFTEST.parent / helper, d)
    for name, src in SUITE.items():
        (d / name).write_text(textwrap.dedent(src))
    (d / "pytest.ini").write_text("[pytest]\nmarkers =\n  gpu: needs an accelerator\n  tpu: needs a TPU\n")
    env = {k: v for k, v in os.environ.items() if k not in ("JAXEMBED_CI", "PYTEST_ADDOPTS")}
    env["JAX_PLATFORMS"] = "cpu"
    if ci:
        env["JAXEMBED_CI"] = "1"
    p = subprocess.run([sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider", "--timeout", "120",
                        "--continue-on-collection-errors", str(d)],
                       cwd=d, env=env, capture_output=True, text=True, timeout=240)
    return p.returncode, p.stdout + p.stderr


def _lines(out, word):
    """The -v lines (``test_a.py::test_x SKIPPED (reason)``) and -rA summary lines of one outcome."""
    return [line for line in out.splitlines() if line.startswith(word + " ") or f" {word}" in line.split("[")[0]
            or f" {word} (" in line]


def test_skips_fail_in_ci_except_gpu_tpu_and_allowed_and_timeouts_name_the_test(tmp_path):
    rc, out = _run(tmp_path, ci=True)
    assert rc == 1, out
    failed = " ".join(_lines(out, "FAILED") + _lines(out, "ERROR"))
    for name in ("test_a.py::test_body_skip", "test_a.py::test_fixture_skip", "test_b.py", "test_a.py::test_hangs"):
        assert name in failed, (name, out)
    assert "unexpected skip in CI (JAXEMBED_CI=1): test_a.py::test_body_skip" in out
    assert "no_such_module_xyz" in out and "x is missing" in out
    assert "Timeout" in out  # pytest-timeout, named by the test
    skipped = " ".join(_lines(out, "SKIPPED"))
    assert "test_on_gpu" in skipped and "needs an accelerator" in skipped
    assert "test_on_tpu" in skipped and "needs a TPU (marked tpu); JAX's backend is cpu" in skipped
    assert "test_on_tpu" not in failed and "unreachable" not in out
    assert "test_allowed[1] SKIPPED" in out and "test_allowed[2] SKIPPED" in out  # both parameters, allow-listed
    passed = " ".join(_lines(out, "PASSED"))
    assert "test_a.py::test_passes" in passed and "test_allowed" not in failed and "test_on_gpu" not in failed
    assert "test_xfail" in " ".join(_lines(out, "XFAIL"))

    rc, out = _run(tmp_path, ci=False)  # outside CI: skips are skips; only the hung test fails
    failed = " ".join(_lines(out, "FAILED") + _lines(out, "ERROR"))
    assert rc == 1 and "test_hangs" in failed and "test_body_skip" not in failed and "test_b.py" not in failed, out
    assert "unexpected skip" not in out


def test_the_slow_list_names_tests_that_exist():
    """tests/slow_tests.txt (left out by `make test-fast`) names files and test functions of the suite."""
    import slow_tests

    entries = slow_tests.read()
    assert entries
    root = CONFTEST.parent.parent
    for entry in entries:
        file, _, name = entry.partition("::")
        assert (root / file).is_file(), entry
        assert not name or f"def {name}(" in (root / file).read_text(encoding="utf-8"), entry
