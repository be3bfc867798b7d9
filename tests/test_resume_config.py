"""A run directory resumed with another config, and a finished run trained on (jaxembed/train/run.py
``check_workdir``, jaxembed/config/io.py ``config_differences``): the refusal names each differing key with the
run's value and the command's, and its fix is a command that works (the run's config.json, read as data); only
plan.steps may grow, and the run then continues from its last step. The end of a run: a line with the exported
step and its dev score, and a warning (stdout, summary.json, the model card) when updates were skipped."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir


def _config(data: Path):
    from jaxembed.data.config import dataset_config

    c = cfglib.default_config()
    c.model.name = "some/model"
    c.data.datasets = [dataset_config(name="wikiqa", path=str(data), task_type="retrieval", num_negatives=1)]
    c.plan.steps = 4
    c.optim.lr = 1e-3
    return c


def test_a_changed_config_is_refused_naming_each_key_with_both_values(tmp_path):
    """It named only the sections ('loss, optim differ'), and its fix ('the run's config.json') ran config.json as
    Python (NameError: name 'null' is not defined)."""
    from jaxembed.train.run import check_workdir

    wd = tmp_path / "run"
    wd.mkdir()
    cfglib.write_resolved(_config(tmp_path / "w.jsonl"), RunDir(wd))
    new = _config(tmp_path / "w.jsonl")
    new.optim.lr = 0.01
    new.loss.temperature = 0.1
    new.data.datasets[0].num_negatives = 2
    new.train.seed = 3
    new.train.log_every = 1  # not a resume's concern: no refusal for it
    with pytest.raises(UserError) as e:
        check_workdir(new, wd)
    assert str(e.value) == (
        f"{wd} holds a run with another config: data.datasets[0].num_negatives 1 -> 2; loss.temperature 0.05 -> 0.1; "
        "optim.lr 0.001 -> 0.01; train.seed 0 -> 3 (the run's value -> this command's). Resuming needs the same "
        "config; only plan.steps may grow, to train a run on (fix: use a new --workdir, or resume the run as it was: "
        f"jaxembed train --config {wd}/config.json --workdir {wd})")
    # the fix works: the run's own config.json is the same config
    assert check_workdir(cfglib.load_config_file(str(wd / "config.json")), wd) is False
    grown = cfglib.load_config_file(str(wd / "config.json"))
    grown.plan.steps = 6
    assert check_workdir(grown, wd) is True  # trained on: the plan is built again for 6 steps
    grown.plan.steps = 3
    with pytest.raises(UserError, match=r"holds a run with another config: plan.steps 4 -> 3 \(the run's value"):
        check_workdir(grown, wd)
    grown.plan.steps, grown.plan.global_batch_size = 6, 7
    with pytest.raises(UserError, match=r"plan.global_batch_size \d+ -> 7; plan.steps 4 -> 6 \(the run's"):
        check_workdir(grown, wd)


def test_long_values_and_many_differences_stay_one_line():
    from jaxembed.config.io import changed_config_message, config_differences

    old = {"data": {"datasets": [{"name": "a", "path": "x" * 200}]}, "optim": {f"k{i}": i for i in range(12)}}
    new = {"data": {"datasets": [{"name": "a", "path": "y" * 200}, {"name": "b"}]},
           "optim": {f"k{i}": i + 1 for i in range(12)}}
    diffs = config_differences(old, new, ("data", "optim"))
    assert diffs[:2] == [("data.datasets[0].path", "x" * 200, "y" * 200), ("data.datasets[1].name", diffs[1][1], "b")]
    msg = changed_config_message("w", diffs)
    assert "\n" not in msg and '"xxxxxxxx' in msg and 'xxx... -> "yyy' in msg
    assert "data.datasets[1].name (absent) -> \"b\"" in msg and "; and 6 more (the run's value" in msg


# ------------------------------------------------------------------------------- a real run, trained on

CONFIG = '''
from jaxembed.config import default_config
from jaxembed.data.config import dataset_config

def get_config(arg=None):
    c = default_config()
    c.model.name = {model!r}
    c.model.max_length = 32
    c.data.datasets = [dataset_config(name="wikiqa", path={wikiqa!r}, task_type="retrieval", num_negatives=1,
                                      max_query_length=16, max_doc_length=16)]
    c.plan.global_batch_size = 4
    c.plan.steps = 2
    c.optim.lr = 1e-3
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.train.inject_nonfinite_steps = (0,)  # the first update is skipped (the guard's testing aid)
    c.eval.tasks = ("STSBenchmark-dev",)
    c.eval.max_examples = 16
    c.eval.before = True
    c.eval.best_metric = "STSBenchmark-dev/main_score"
    return c
'''


def _main(argv: list[str]) -> tuple[int, str]:
    from jaxembed.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def trained_on(tmp_path_factory, shared_data):
    """`jaxembed train` for 2 steps (the first skipped), then the same run directory trained on to 3 steps with
    the run's own config.json as --config; the outputs and the first summary."""
    from jaxembed.models.tiny import tiny_model_dir

    folder = tmp_path_factory.mktemp("trained_on")
    cfg = folder / "two_steps.py"
    model = tiny_model_dir("bert", num_layers=1)  # what is checked here does not depend on the depth
    cfg.write_text(CONFIG.format(model=str(model), wikiqa=str(shared_data / "train/wikiqa.jsonl")))
    wd = folder / "run"
    first = _main(["train", "--config", str(cfg), "--workdir", str(wd)])
    summary = json.loads((wd / "summary.json").read_text())
    card = (wd / "export" / "README.md").read_text()
    more = _main(["train", "--config", str(wd / "config.json"), "--workdir", str(wd), "--config.plan.steps=3"])
    return wd, first, summary, card, more


def test_the_end_of_a_run_names_the_exported_step_its_dev_score_and_the_skipped_updates(trained_on):
    """The end of a run said neither which step was exported nor its dev score; skipped updates were a count in
    the last line only."""
    wd, (rc, out), summary, card, _ = trained_on
    assert rc == 0, out
    assert summary["status"] == "completed" and summary["step"] == 2 and summary["skipped"] == 1
    note = ("1 of 2 training updates were skipped (a non-finite loss or gradient), so only 1 was applied "
            "(metrics.jsonl: 'skipped' at each logged step; fix: lower optim.lr or raise loss.temperature")
    assert summary["warnings"][0].startswith(note)
    lines = out.splitlines()
    assert any(x.startswith("warning: " + note) for x in lines), out
    dev = [x for x in lines if x.startswith(f"export: step 2 in {wd / 'export'}; dev STSBenchmark-dev/main_score ")]
    assert len(dev) == 1 and " (before training " in dev[0], out
    assert "**Warning:** 1 of 2 training updates were skipped" in card


def test_a_finished_run_trains_on_to_more_steps_from_its_last_step(trained_on):
    """plan.steps grown on a finished run's directory (given its own config.json): it continues from step 2 to 3
    (a changed plan was refused: 'plan differ'), the plan saved is the 3-step one, and the export is step 3."""
    from jaxembed.data.plan import Plan

    wd, _, _, _, (rc, out) = trained_on
    assert rc == 0, out
    assert "resuming at step 2 of 3 from" in out and "training: steps 3-3;" in out, out
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 3 and summary["skipped"] == 1
    assert Plan.load(wd / "plan.npz").steps == 3 and json.loads((wd / "config.json").read_text())["plan"]["steps"] == 3
    text = (wd / "config.txt").read_text()
    assert "!!python" not in text and "plan.steps: 3" in text.splitlines()
    assert f"export: step 3 in {wd / 'export'}; dev STSBenchmark-dev/main_score " in out
    train = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in train if x["split"] == "train"] == [1, 2, 3]
    assert sorted(x["step"] for x in train if x["split"] == "eval") == [0, 2, 3]
