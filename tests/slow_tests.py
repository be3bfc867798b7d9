"""The suite's slow tests, for `make test-fast` (tests/conftest.py marks them ``slow``; the inner loop deselects
them with ``-m "not slow"``).

    python tests/slow_tests.py .venv/ci-junit.xml [fast-junit.xml ...] [--over 2.0] [--keep]

reads the JUnit XML of a whole-suite run (`.ci/run` writes .venv/ci-junit.xml) and rewrites tests/slow_tests.txt:
every test whose setup, call and teardown took more than ``--over`` seconds (parameterised cases summed under one
name) in any of the given runs, slowest first, with its time as a comment. A module fixture is timed in the first
test that uses it, so a fast test that shares a slow test's fixture pays for it in `make test-fast`: give that
run's report too (`make test-fast PYTEST_ARGS=--junitxml=fast.xml`), with ``--keep`` (the current entries stay).
Entries may also name a whole file, or a module fixture (``tests/file.py::fixture``: every test that uses it).
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path

LIST = Path(__file__).resolve().parent / "slow_tests.txt"
HEADER = """\
# Tests marked `slow` (tests/conftest.py): `make test-fast` leaves them out, `make test` runs them.
# One node id per line (a test without its parameters, a whole file, or a module fixture: the tests that use it);
# the figure is its seconds in the run the list was made from. Regenerate after a whole-suite run:
# python tests/slow_tests.py .venv/ci-junit.xml (tests/slow_tests.py says how)
"""


def read(path: Path = LIST) -> dict[str, float]:
    """The list's node ids -> their seconds (the comment's figure, 0 without one); empty when the file is absent."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.is_file() else ():
        node, _, figure = line.partition("#")
        if node.strip():
            out[node.strip()] = float(figure.split()[0]) if figure.strip() else 0.0
    return out


def times_from_junit(xml: Path) -> dict[str, float]:
    """Seconds per test name (``tests/file.py::name``, parameters summed) of a JUnit XML report."""
    out: dict[str, float] = collections.defaultdict(float)
    for case in ET.parse(xml).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_file[.TestClass]
        i = next(k for k, x in enumerate(parts) if x.startswith("test_"))
        node = "::".join(["/".join(parts[:i + 1]) + ".py", *parts[i + 1:], case.get("name", "").split("[")[0]])
        out[node] += float(case.get("time", 0))
    return dict(out)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("junit", type=Path, nargs="+")
    p.add_argument("--over", type=float, default=2.0, help="seconds above which a test is slow")
    p.add_argument("--keep", action="store_true", help="keep the current entries")
    a = p.parse_args(argv)
    seconds = read() if a.keep else {}
    for report in a.junit:
        for node, t in times_from_junit(report).items():
            if t > a.over:
                seconds[node] = max(t, seconds.get(node, 0.0))
    slow = sorted(((t, n) for n, t in seconds.items()), reverse=True)
    LIST.write_text(HEADER + "".join(f"{n}  # {t:.1f} s\n" for t, n in slow), encoding="utf-8")
    print(f"{len(slow)} slow tests ({sum(t for t, _ in slow):.0f} s) written to {LIST}")


if __name__ == "__main__":
    main()
