"""Mutation score of the modules named in issue 23 section 4, with cosmic-ray (docs/testing.md says how to read it).

    python mutation/run.py MODULE [--before] [--sample N] [--seed S] [--scratch /tmp/mut]
    python mutation/run.py MODULE --report            # the counts and surviving mutants of the last run

MODULE: one of ``MODULES`` below. The repository's jaxembed/ and tests/ are copied to a scratch folder
(``<scratch>/<MODULE>``) and mutated there, never in the working tree. Only the functions listed per file are
mutated (the rest of each file is marked skipped in the session), and only with the operators of ``OPERATORS``.
--before: run without the module's new mutant-killing tests (the score of the suite as it was).
--sample N: a random sample of N of the in-scope mutants (the others skipped as "not sampled").

Every test run is ``nice -n 19`` with a per-mutant timeout, and shares one JAX persistent compilation cache (most
compiled programs of a mutant equal the original's): a module's runner is the smallest set of fast tests that
covers its functions.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# None: every function of the file. Nested functions: "outer.inner"; methods: "Class.method".
MODULES = {
    "losses": dict(
        files={f"jaxembed/losses/{f}.py": None
               for f in ("core", "infonce", "tiled", "objective", "distill", "scored", "gist", "matryoshka")},
        tests=["tests/test_losses.py"],
        new_tests=["tests/test_mutants_losses.py"],
        k="not sentence_transformers and not x64",
        timeout=240,
    ),
    "gradcache": dict(
        files={"jaxembed/train/gradcache.py": None},
        tests=["tests/test_gradcache.py"],
        new_tests=["tests/test_mutants_gradcache.py"],
        timeout=240,
    ),
    "train_step": dict(
        files={"jaxembed/train/step.py": ["make_train_step.step"], "jaxembed/runs/optim.py": ["keep_unless"]},
        tests=["tests/test_train.py"],
        new_tests=["tests/test_mutants_train_step.py"],
        k="nonfinite",
        timeout=300,
    ),
    "mote": dict(
        files={"jaxembed/mote/spec.py": ["mote_layers", "MoTESpec.index", "MoTESpec._route", "MoTESpec.experts_for",
                                         "MoTESpec.expert_name", "MoTESpec.expert_for", "routing_tables"],
               "jaxembed/mote/block.py": ["active_experts", "MoTEFeedForward.__call__", "make_route", "is_expert_path"],
               "jaxembed/runs/optim.py": ["_is_expert", "_num_experts", "_expert_view", "scale_by_routed_adam",
                                     "zero_idle_experts", "routed_adamw"]},
        tests=["tests/test_mote.py"],
        new_tests=["tests/test_mutants_mote.py"],
        # (test_train_step_updates_only_routed_experts, a training run, is left out: minutes per mutant)
        k="routed_adamw or spec_routing or gradients_reach_only",
        timeout=300,
    ),
    "plan": dict(
        files={"jaxembed/data/plan/curriculum.py": ["walk_order", "_compressed_batches", "build_curriculum"],
               "jaxembed/data/plan/units.py": ["check_unit_size"]},
        tests=["tests/test_plan.py"],
        new_tests=["tests/test_mutants_plan.py"],
        k="curriculum or walk",
        timeout=30,
    ),
}

# The operator set (regular expressions, full match): cosmic-ray's operators less the exhaustive cross products of
# binary and comparison operators, whose extra mutants (``a + b`` -> ``a << b``, ``x < y`` -> ``x is y`` ...) fail
# with a type error at once; each arithmetic / bitwise / comparison operator gets its usual replacements
# (mutmut's set, plus the flipped comparisons), every other operator of cosmic-ray's core set is kept.
OPERATORS = [
    r"core/ReplaceBinaryOperator_(Add_Sub|Sub_Add|Mul_Div|Div_Mul|FloorDiv_Div|Mod_FloorDiv|Pow_Mul"
    r"|BitAnd_BitOr|BitOr_BitAnd|BitXor_BitOr|LShift_RShift|RShift_LShift)",
    r"core/ReplaceComparisonOperator_(Eq_NotEq|NotEq_Eq|Lt_LtE|Lt_Gt|LtE_Lt|LtE_GtE|Gt_GtE|Gt_Lt|GtE_Gt|GtE_LtE"
    r"|Is_IsNot|IsNot_Is)",
    r"core/ReplaceUnaryOperator_(USub_UAdd|Delete_Invert|Delete_Not)",
    r"core/(AddNot|ReplaceTrueWithFalse|ReplaceFalseWithTrue|ReplaceAndWithOr|ReplaceOrWithAnd"
    r"|ReplaceBreakWithContinue|ReplaceContinueWithBreak|NumberReplacer|ZeroIterationForLoop|RemoveDecorator"
    r"|ExceptionReplacer)",
]


def function_ranges(path: Path, names) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of each function in ``names`` (None: every top-level function and
    method, nested ones included in their parent's range). Decorators count as part of the function."""
    tree = ast.parse(path.read_text())
    found = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                q = f"{prefix}{child.name}"
                first = min([child.lineno] + [d.lineno for d in getattr(child, "decorator_list", [])])
                if not isinstance(child, ast.ClassDef):
                    found[q] = (first, child.end_lineno, q)
                visit(child, q + ".")

    visit(tree, "")
    if names is None:
        return list(found.values())
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"{path}: no function {missing} (fix: MODULES in {__file__})")
    return [found[n] for n in names]


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) (line, column) of every type annotation: with ``from __future__ import annotations`` (every
    mutated module) they are never evaluated, so a mutant there (``X | None`` -> ``X & None``) is equivalent."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text())):
        anns = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            anns = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                    if x is not None and x.annotation is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            anns = [node.annotation]
        spans += [((x.lineno, x.col_offset), (x.end_lineno, x.end_col_offset)) for x in anns if x is not None]
    return spans


def _annotated(root: Path, m) -> bool:
    spans = _ANN.setdefault(str(m.module_path), annotation_spans(root / m.module_path))
    return any(a <= tuple(m.start_pos) < b for a, b in spans)


_ANN: dict = {}


def scratch_copy(dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for d in ("jaxembed", "tests", "configs"):
        if (REPO / d).exists():
            shutil.copytree(REPO / d, dest / d, ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")


def write_config(dest: Path, spec: dict, before: bool) -> Path:
    # the new tests first: they are the cheap, targeted ones (-x stops at the first failure)
    tests = ([] if before else [t for t in spec["new_tests"] if (REPO / t).exists()]) + list(spec["tests"])
    cmd = ["nice", "-n", "19", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "-o", "timeout=0", *tests]  # the timeout: cosmic-ray's (counted apart)
    if spec.get("k"):
        # new tests are always selected: the -k expression is for the existing files
        k = spec["k"] if before else f"({spec['k']}) or test_mutants"
        cmd += ["-k", k]
    import shlex

    toml = "\n".join([
        "[cosmic-ray]",
        f"module-path = {json.dumps(sorted(spec['files']))}",
        f"timeout = {float(spec['timeout'])}",
        "excluded-modules = []",
        f"test-command = {json.dumps(shlex.join(cmd))}",
        "",
        "[cosmic-ray.distributor]",
        'name = "local"',
        "",
    ])
    path = dest / "cosmic-ray.toml"
    path.write_text(toml)
    return path


def in_scope(dest: Path, spec: dict) -> dict[str, list]:
    return {f: function_ranges(dest / f, names) for f, names in spec["files"].items()}


def filter_session(db_path: Path, ranges: dict, sample: int | None, seed: int) -> tuple[int, int]:
    """Mark the out-of-scope mutants (other functions, other operators) and the unsampled ones skipped.
    -> (in scope, to run)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    ops = [re.compile(p) for p in OPERATORS]
    keep, out = [], []
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item in db.pending_work_items:
            m = item.mutations[0]
            line = m.start_pos[0]
            f = str(m.module_path)
            ok = any(o.fullmatch(m.operator_name) for o in ops) and any(
                a <= line <= b for a, b, _ in ranges.get(f, [])) and not _annotated(db_path.parent, m)
            (keep if ok else out).append(item.job_id)
        if out:
            db.set_multiple_results(out, WorkResult(output="out of scope", worker_outcome=WorkerOutcome.SKIPPED))
        n = len(keep)
        if sample is not None and sample < len(keep):
            rng = random.Random(seed)
            chosen = set(rng.sample(sorted(keep), sample))
            drop = [j for j in keep if j not in chosen]
            db.set_multiple_results(drop, WorkResult(output="not sampled", worker_outcome=WorkerOutcome.SKIPPED))
            keep = sorted(chosen)
    return n, len(keep)


def reopen_survivors(src: Path, dest: Path) -> tuple[int, int]:
    """Copy the session of ``src`` to ``dest`` and forget the results of its surviving mutants (and any not run),
    so that ``exec`` runs exactly those again. -> (mutants in the session, to run)."""
    import sqlite3

    shutil.copy(src / "session.sqlite", dest / "session.sqlite")
    con = sqlite3.connect(dest / "session.sqlite")
    with con:
        n = con.execute("SELECT COUNT(*) FROM work_results WHERE worker_outcome != 'SKIPPED'").fetchone()[0]
        con.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED'")
        todo = con.execute("SELECT COUNT(*) FROM work_items WHERE job_id NOT IN (SELECT job_id FROM work_results)"
                           ).fetchone()[0]
    con.close()
    return n + 0, todo


def report(dest: Path, ranges: dict | None = None) -> dict:
    """Counts of the session in ``dest`` and the surviving mutants (file:line, function, operator, diff)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    counts = dict(total=0, killed=0, survived=0, timeouts=0, incompetent=0, pending=0, annotations_left_out=0)
    survivors = []
    with use_db(str(dest / "session.sqlite"), WorkDB.Mode.open) as db:
        results = dict(db.results)
        for item in db.work_items:
            r = results.get(item.job_id)
            if r is not None and r.worker_outcome == WorkerOutcome.SKIPPED:
                continue
            if _annotated(dest, item.mutations[0]):  # sessions made before annotations were filtered out
                counts["annotations_left_out"] += 1
                continue
            counts["total"] += 1
            if r is None:
                counts["pending"] += 1
            elif r.test_outcome == TestOutcome.SURVIVED:
                counts["survived"] += 1
                m = item.mutations[0]
                fn = ""
                for a, b, q in (ranges or {}).get(str(m.module_path), []):
                    if a <= m.start_pos[0] <= b:
                        fn = q
                diff = [ln for ln in (r.diff or "").splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
                survivors.append(dict(where=f"{m.module_path}:{m.start_pos[0]}", function=fn,
                                      operator=m.operator_name.replace("core/", ""), occurrence=m.occurrence,
                                      diff=diff, job=item.job_id))
            elif r.test_outcome == TestOutcome.INCOMPETENT:
                counts["incompetent"] += 1
            elif r.output == "timeout":
                counts["timeouts"] += 1
            else:
                counts["killed"] += 1
    done = counts["total"] - counts["pending"]
    counts["score"] = round(100 * (done - counts["survived"]) / done, 1) if done else None
    return dict(counts=counts, survivors=sorted(survivors, key=lambda s: (s["where"], s["operator"])))


def summary(scratch: Path, record: bool, extra: Path | None = None) -> dict:
    """Every module's before / after counts (the result.json files of the runs in ``scratch``) and the mutants that
    survive after; with ``record``: a results JSON and a line in benchmarks/README.md (benchmarks/_record.py)."""
    out = {}
    for name in MODULES:
        row = {}
        for key, sub in (("before", f"{name}_before"), ("after", name)):
            f = scratch / sub / "result.json"
            if f.exists():
                r = json.loads(f.read_text())
                row[key] = dict(r["counts"], in_scope=r["in_scope"], sample=r["sample"], command=r["command"])
                if key == "after":
                    row["survivors"] = r["survivors"]
        f = None if extra is None else extra / name / "result.json"
        if f is not None and f.exists():  # a further run with every new test (a full run or a second sample)
            r = json.loads(f.read_text())
            row["extra"] = dict(r["counts"], in_scope=r["in_scope"], sample=r["sample"], seed=r.get("seed"),
                                command=r["command"], survivors=r["survivors"])
        out[name] = row
    if record:
        sys.path.insert(0, str(REPO / "benchmarks"))
        import _record

        _record.save_result("mutation_score", {"modules": out, "operators": OPERATORS,
                                               "scope": {m: s["files"] for m, s in MODULES.items()}})
        import datetime

        parts = []
        for name, row in out.items():
            b, a = row.get("before"), row.get("after")
            if a:
                n = f"{a['total']} of {a['in_scope']}" if a["sample"] else f"{a['total']}"
                more = ""
                if row.get("extra"):
                    e = row["extra"]
                    more = (f"; with every new test, {'a second sample of ' if e['sample'] else 'all '}{e['total']}: "
                            f"**{e['score']} %**")
                parts.append(f"{name} {b['score'] if b else '?'} % -> **{a['score']} %** ({n} mutants, "
                             f"{a['survived']} survive{more})")
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        _record.record_line(f"| {datetime.date.today()} | mutation_score | cpu (2 cores) | cosmic-ray 8.7, the "
                            f"functions of docs/testing.md, killed % before -> after the tests/test_mutants_*.py, "
                            f"load average {load} | {'; '.join(parts)} | `python mutation/run.py MODULE ...` "
                            f"(docs/testing.md) |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("module", choices=sorted(MODULES) + ["summary"],
                    help="a module, or summary: every module's last before / after counts (--record: save them)")
    ap.add_argument("--record", action="store_true", help="summary: a results JSON and a benchmarks/README.md line")
    ap.add_argument("--extra", default=None, metavar="SCRATCH",
                    help="summary: also the runs in this scratch folder (with every new test: full runs, samples)")
    ap.add_argument("--before", action="store_true", help="without the module's new mutant-killing tests")
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scratch", default="/tmp/mut")
    ap.add_argument("--report", action="store_true", help="only print the last run's counts and survivors")
    ap.add_argument("--count", action="store_true", help="only count the in-scope mutants")
    ap.add_argument("--survivors-of", default=None, metavar="DIR",
                    help="rerun only the mutants that survived the session in DIR (e.g. <scratch>/MODULE_before) "
                         "with the current tests; its other results are kept (tests are only ever added)")
    a = ap.parse_args(argv)
    if a.module == "summary":
        print(json.dumps(summary(Path(a.scratch), a.record, Path(a.extra) if a.extra else None), indent=1))
        return 0
    spec = MODULES[a.module]
    dest = Path(a.scratch) / (a.module + ("_before" if a.before else ""))
    if a.report:  # the counts as run.py counts them now (a session's result.json is brought up to date)
        res = report(dest, in_scope(dest, spec))
        f = dest / "result.json"
        if f.exists():
            old = json.loads(f.read_text())
            old.update(res)
            f.write_text(json.dumps(old, indent=1))
        print(json.dumps(res, indent=1))
        return 0
    if a.survivors_of:  # kept aside first: DIR may be this run's own folder (a rerun after new tests)
        import tempfile

        kept = Path(tempfile.mkdtemp()) / "session.sqlite"
        shutil.copy(Path(a.survivors_of) / "session.sqlite", kept)
        src_result = Path(a.survivors_of) / "result.json"
        src_result = json.loads(src_result.read_text()) if src_result.exists() else {}
    scratch_copy(dest)
    cfg = write_config(dest, spec, a.before)
    ranges = in_scope(dest, spec)
    sys.path.insert(0, str(REPO))
    from jaxembed import paths

    # the scratch copy has no ../shared/data: the real one, and a test that would skip without it fails instead
    env = dict(os.environ, PYTHONPATH=str(dest), PYTHONDONTWRITEBYTECODE="1",
               JAXEMBED_DATA=str(paths.shared_data_dir()), JAXEMBED_REQUIRE_SHARED_DATA="1",
               JAX_COMPILATION_CACHE_DIR=str(Path(a.scratch) / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
    cr = [str(Path(sys.executable).parent / "cosmic-ray")]
    run = lambda *args: subprocess.run([*cr, *args], cwd=dest, env=env, check=True)  # noqa: E731
    if a.survivors_of:
        n, todo = reopen_survivors(kept.parent, dest)
    else:
        run("init", str(cfg), "session.sqlite")
        n, todo = filter_session(dest / "session.sqlite", ranges, a.sample, a.seed)
    print(f"{a.module}: {n} mutants in scope, running {todo}", flush=True)
    if a.count:
        return 0
    run("baseline", str(cfg))
    run("exec", str(cfg), "session.sqlite")
    res = report(dest, ranges)
    res.update(module=a.module, before=a.before, in_scope=n, sample=a.sample, seed=a.seed,
               command=" ".join(["python mutation/run.py", *(argv or sys.argv[1:])]))
    if a.survivors_of:  # the same mutants as that session: its scope and sample
        res.update({k: src_result[k] for k in ("in_scope", "sample", "seed") if k in src_result})
        res["rerun_of"] = src_result.get("command")
    (dest / "result.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["counts"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
