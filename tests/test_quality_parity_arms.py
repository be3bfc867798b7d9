"""benchmarks/quality_parity.py's ablation arms and their comparison, without training (fast): the curriculum arms
(Algorithm 1's cyclic walk, the balanced walk, Vanilla on the same data mix, one unit per batch), MoTE with the
clustering sets, the STS average and per-task-type averages with the seeds' spread, and --summarize over a workdir
of finished runs."""

import json
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import quality_parity as qp  # noqa: E402

TASKS = ("STSBenchmark", "SICK-R", "MRPC", "TREC", "SST2", "Newsgroups")


def _args(tmp_path, *extra):
    return qp.parse_args(["--workdir", str(tmp_path / "wd"), "--steps", "400", *extra])


def test_curriculum_and_clustering_arms(tmp_path, shared_data):
    order = tmp_path / "order.json"
    order.write_text(json.dumps({"order": ["a"], "unit": "dataset"}))
    args = _args(tmp_path, "--curriculum-task-order", str(order), "--curriculum-scores", str(tmp_path / "s.npz"))
    store = tmp_path / "wd" / "store"
    cyc, bal, van = (qp.arm_config(args, a, 1, store) for a in ("curriculum", "curriculum_balanced",
                                                                "curriculum_vanilla"))
    assert (cyc.plan.curriculum.walk, bal.plan.curriculum.walk) == ("cyclic", "balanced")
    assert cyc.plan.curriculum.unit == bal.plan.curriculum.unit == "dataset" and cyc.plan.steps == 400
    assert (van.plan.strategy, van.plan.sampling, van.plan.curriculum.enabled) == ("homogeneous", "size", False)
    order.write_text(json.dumps({"order": ["a"], "unit": "task"}))  # the unit follows the order file
    assert qp.arm_config(args, "curriculum_vanilla", 1, store).plan.strategy == "heterogeneous"
    assert qp.arm_config(args, "curriculum", 1, store).plan.curriculum.unit == "task"
    ic, mo = (qp.arm_config(args, a, 1, store) for a in ("ic_clustering", "mote_clustering"))
    base = qp.arm_config(args, "base", 1, store)
    added = [d for d in mo.data.datasets if d.task_type == "clustering"]
    assert [d.name for d in added] == ["trec_clustering", "sst5_clustering"]
    assert {(d.batching, d.temperature, d.num_negatives) for d in added} == {("heterogeneous", 0.06, 1)}
    assert len(ic.data.datasets) == len(base.data.datasets) + 2 and not any(
        d.task_type == "clustering" for d in base.data.datasets)
    assert mo.model.mote.enabled and not ic.model.mote.enabled
    assert ic.data.store == mo.data.store == str(tmp_path / "wd" / "clustering" / "store") != base.data.store
    assert qp.run_record(ic, "jaxembed", args) == qp.run_record(qp.arm_config(args, "ic_clustering", 1, store),
                                                                 "jaxembed", args)  # the same files each time


def test_padded_arm_differs_from_the_base_by_packing_only(tmp_path):
    """The 'padded' arm is the recipe with data.packing=False (the base keeps the recipe's packed rows)."""
    from jaxembed.config import to_json

    args = _args(tmp_path)
    base, padded = (json.loads(to_json(qp.arm_config(args, a, 0, None))) for a in ("base", "padded"))
    assert base["data"]["packing"] is True and padded["data"]["packing"] is False
    assert qp.record_differences({"config": base, "st_loss": None}, {"config": padded, "st_loss": None}) == [
        "data.packing"]
    assert "padded" in qp.ARMS and "padded" in qp.ABLATIONS


def _run(avg: float, seed: int, sts_shift: float = 0.0):
    """A fake finished run: every task scores avg (+ sts_shift on the STS tasks) + seed."""
    ev = {}
    for t in TASKS:
        v = avg + seed + (sts_shift if t in qp.STS_TASKS else 0.0)
        ev[t] = {"main_score": v, "dims": {str(d): {"main_score": v - 1} for d in qp.DIMS}}
    return {"eval": ev, "train_s": 10.0, "plan": "x", "model_dir": "m", "log": []}


def test_comparisons_sts_average_types_and_spread():
    runs = {}
    for s in (0, 1, 2):
        runs[("jaxembed", "base", s)] = _run(60, s)
        runs[("jaxembed", "curriculum_vanilla", s)] = _run(61, s)
        runs[("jaxembed", "curriculum", s)] = _run(59, s, sts_shift=-2.0 * s)  # STS worse on later seeds
        runs[("jaxembed", "curriculum_balanced", s)] = _run(61.5, s)
    runs[("jaxembed", "mote_clustering", 0)] = _run(62, 0)  # its reference has no run: left out
    rows = qp.ablation_rows(runs, ["curriculum", "curriculum_balanced", "mote_clustering"], [0, 1, 2])
    cyc = rows["curriculum"]
    n_sts = len(qp.STS_TASKS)
    d_seeds = [-1 - 2.0 * s * n_sts / len(TASKS) for s in (0, 1, 2)]
    assert cyc["difference_seeds"] == pytest.approx(d_seeds) and cyc["difference"] == pytest.approx(
        statistics.mean(d_seeds))
    assert cyc["difference_spread"] == pytest.approx(max(d_seeds) - min(d_seeds))
    sts = cyc["vs_vanilla"]["groups"]["sts_average"]
    assert sts["tasks"] == list(qp.STS_TASKS) and sts["difference_seeds"] == pytest.approx([-2, -4, -6])
    assert cyc["difference_vs_vanilla"] == pytest.approx(statistics.mean(d_seeds) - 1)
    types = {k for k in cyc["groups"] if k.startswith("type:")}
    assert types == {"type:STS", "type:PairClassification", "type:Classification", "type:Clustering"}
    assert cyc["groups"]["type:Classification"]["tasks"] == ["TREC", "SST2"]
    assert cyc["dim64"]["difference"] == pytest.approx(cyc["difference"])
    bal = rows["curriculum_balanced"]
    assert bal["difference_vs_cyclic_seeds"] == pytest.approx([2.5 - d - 1 for d in d_seeds])
    assert bal["vs_vanilla"]["difference"] == pytest.approx(0.5) and bal["vs_cyclic"]["reference"] == "curriculum"
    assert "vs_ic_clustering" not in rows["mote_clustering"] and rows["mote_clustering"]["seeds"] == [0]
    table = qp.markdown_table(rows)
    assert "| curriculum_balanced | curriculum | 3 |" in table and "sts_average" in table.splitlines()[0]
    assert any(p.startswith("curriculum_balanced vs base") and "vs curriculum " in p
               for p in qp.ablation_parts(rows))


def test_summarize_a_workdir_of_finished_jobs(tmp_path, monkeypatch, capsys):
    args = _args(tmp_path, "--summarize", "--eval-max-examples", "50", "--no-readme")
    wd = Path(args.workdir)
    key = f"{args.eval_tasks}|{args.eval_max_examples}|{qp.DIMS}|None"
    for arm, avg in (("base", 60), ("curriculum_vanilla", 61), ("curriculum_balanced", 62)):
        for s in (0, 1, 2):
            d = wd / f"jaxembed_{arm}_s{s}"
            d.mkdir(parents=True)
            r = _run(avg, s)
            (d / "eval.json").write_text(json.dumps({"key": key, "results": r.pop("eval")}))
            (d / "train.json").write_text(json.dumps(r))
    old = wd / "jaxembed_peg_s0"  # evaluated with other settings: left out, said so
    old.mkdir()
    (old / "eval.json").write_text(json.dumps({"key": "eval|0|x", "results": {}}))
    (old / "train.json").write_text("{}")
    (wd / "jaxembed_mrl_s0").mkdir()  # unfinished (no train.json): ignored
    saved = {}
    monkeypatch.setattr(qp, "save_result", lambda name, res: saved.setdefault(name, res) and tmp_path / "r.json")
    qp.summarize_workdir(args)
    res = saved["quality_parity_cpu"]
    assert set(res["ablations"]) == {"curriculum_vanilla", "curriculum_balanced"}
    assert res["ablations"]["curriculum_balanced"]["difference_vs_vanilla_seeds"] == pytest.approx([1, 1, 1])
    assert res["arms"]["base"]["groups"]["sts_average"]["spread"] == pytest.approx(2.0)
    out = capsys.readouterr().out
    assert "left out (evaluated with other settings): jaxembed_peg_s0" in out and "| curriculum_balanced |" in out


def test_summarize_from_committed_result_files(tmp_path, monkeypatch, capsys):
    """--results-dir: the per-run result.json copies (no workdir runs) give the same comparisons, at full width."""
    rdir = tmp_path / "committed"
    rdir.mkdir()
    args = _args(tmp_path, "--summarize", "--eval-max-examples", "50", "--no-readme", "--results-dir", str(rdir))
    for arm, avg in (("base", 60), ("curriculum_balanced", 62)):
        for s in (0, 1, 2):
            scores = {t: v["main_score"] for t, v in _run(avg, s)["eval"].items()}
            res = {"arm": arm, "seed": s, "steps": 400, "global_batch_size": 16, "scores": scores, "train_s": 5.0,
                   "eval": {"tasks": "eval", "max_examples": 50}, "plan": "x"}
            (rdir / f"jaxembed_{arm}_s{s}.json").write_text(json.dumps(res))
    other = dict(res, steps=200)  # other settings: left out, said so
    (rdir / "jaxembed_curriculum_s0.json").write_text(json.dumps(other))
    saved = {}
    monkeypatch.setattr(qp, "save_result", lambda name, res: saved.setdefault(name, res) and tmp_path / "r.json")
    qp.summarize_workdir(args)
    res = saved["quality_parity_cpu"]
    row = res["ablations"]["curriculum_balanced"]
    assert row["difference_seeds"] == pytest.approx([2, 2, 2]) and row["seeds"] == [0, 1, 2]
    assert not any(k.startswith("dim") for k in row)  # a result.json has no Matryoshka views
    assert res["arms"]["base"]["groups"]["sts_average"]["average"] == pytest.approx(61)
    assert res["train_s_total"] == pytest.approx(30.0)
    out = capsys.readouterr().out
    assert "left out (evaluated with other settings): jaxembed_curriculum_s0.json" in out
    assert "| curriculum_balanced | base | 3 | +2.00 (0.00) |" in out
