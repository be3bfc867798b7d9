"""The one loader of config files (``jaxembed.config.io.load_config_file``): ``PATH[:VARIANT]`` as every ``--config``
reads it. Two loaders with different rules existed before (``jaxembed.config.io`` for train / score / sweep /
pretrain, ``jaxembed.data.config_file`` for ``data prepare`` / ``plan build``); each case below failed on one of
them (or on both: the file as a module, None returned, a syntax error).

The recipes by name (``demo:tiny``, ``kalm:tiny,lora``) from any folder, through the CLI: ``jaxembed recipes``, the
``--config`` of every command, a file winning over a recipe of its name, one line for an unknown name; and an
installed package (the recipes inside it, no repository around it) finding them, with JAXEMBED_DATA named when
the shared data is not known."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError
from jaxembed.runs.rundir import RunDir

HEAD = "import ml_collections as mc\n\n\n"
RETURNS_ARG = "    return mc.ConfigDict({'arg': repr(arg), 'datasets': []})\n"


@pytest.fixture()
def files(tmp_path, monkeypatch):
    """Config files in ``tmp_path`` (the working folder: specs are relative, as typed)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a:b").mkdir()
    bodies = {
        "v.py": "def get_config(arg=None):\n" + RETURNS_ARG,
        "a:b/v.py": "def get_config(arg=None):\n" + RETURNS_ARG,
        "base.py": "def get_config(arg='base'):\n" + RETURNS_ARG,
        "required.py": "def get_config(arg):\n" + RETURNS_ARG,
        "noarg.py": "def get_config():\n    return mc.ConfigDict({'arg': 'none', 'datasets': []})\n",
        "v.cfg": "def get_config(arg=None):\n" + RETURNS_ARG,
        "dc.py": "from __future__ import annotations\n\nimport dataclasses\n\n" + HEAD + "@dataclasses.dataclass\nclass X:\n"
                 "    a: int = 1\n\n\ndef get_config(arg=None):\n    return mc.ConfigDict({'arg': repr(X().a)})\n",
        "noget.py": "x = 1\n",
        "none.py": "def get_config(arg=None):\n    c = mc.ConfigDict()\n",
        "syntax.py": "def get_config(arg=None)\n    return 1\n",
    }
    for name, body in bodies.items():
        (tmp_path / name).write_text(body if body.startswith("from __future__") else HEAD + body)
    return tmp_path


@pytest.mark.parametrize("spec,arg", [
    ("v.py", None), ("v.py:tiny", "tiny"),
    ("a:b/v.py", None), ("a:b/v.py:tiny", "tiny"),  # a ':' in a folder name (a Windows drive)
    ("v.py:a:b", "a:b"),           # after the first ':' of the file, as ml_collections
    ("v.py:", None),               # an empty variant is none
    ("base.py", "base"),           # no variant: get_config() with its own default
    ("required.py", None),         # get_config(arg) with no default: get_config(None)
    ("noarg.py", "none"),          # ml_collections' def get_config():
    ("dc.py", "1"),                # a @dataclass in the file: it runs as a module in sys.modules
])
def test_spec_rules(files, spec, arg):
    assert cfglib.load_config_file(spec).arg == (repr(arg) if arg not in ("none", "1") else arg)
    assert cfglib.load_config_file(str(files / spec)).arg == cfglib.load_config_file(spec).arg  # absolute too


@pytest.mark.parametrize("spec,message", [
    ("noarg.py:tiny", "--config noarg.py:tiny: get_config() takes no argument, so the variant 'tiny' cannot be "
                      "passed (fix: define get_config(arg=None) in noarg.py, or drop ':tiny')"),
    ("missing.py:tiny", "--config missing.py:tiny: no such file missing.py (fix: give a Python config file as PATH "
                        "or PATH:VARIANT, or a recipe by name as NAME or NAME:VARIANT (datacube, demo, kalm, mote, peg, "
                        "retromae; e.g. demo:tiny)"),
    ("demoo:tiny", "--config demoo:tiny: no recipe or file named 'demoo' (fix: did you mean demo? recipes: datacube, "
                   "demo, kalm, mote, peg, retromae (`jaxembed recipes` lists their variants); a config file is given "
                   "by its path, e.g. ./my_config.py"),
    # the repository's path typed in another folder: the fix is the recipe's name, not another relative path
    ("configs/kalm.py:tiny,lora", "--config configs/kalm.py:tiny,lora: no such file configs/kalm.py (fix: the recipe "
                                  "'kalm' ships with jaxembed: --config kalm:tiny,lora works from any folder; else "),
    ("a:b", "--config a:b: is a folder, not a config file (fix: give a Python config file as PATH"),
    ("https://example.com/c.py:tiny", "--config https://example.com/c.py:tiny: is a URL, config files are read "
                                      "from a local path (fix: download it and give its local path"),
    ("noget.py", "--config noget.py: defines no get_config() (fix: define get_config(arg=None) returning a "
                 "ConfigDict)"),
    ("none.py", "--config none.py: get_config() returned None (fix: end get_config with 'return config')"),
    ("syntax.py", "syntax.py:4: not valid Python"),  # an error in the file: PATH:LINE, as an editor reads it
    # only .py files run: any other file name is one line, never executed
    ("v.cfg:x", "--config v.cfg:x: v.cfg is not a Python file (.cfg); a config file is Python and runs as code, so "
                "only .py files run (fix: give a .py file with get_config(), a recipe by name (e.g. demo:tiny), or to "
                "resume a run from its own config: jaxembed train --config WORKDIR/config.json --workdir WORKDIR"),
])
def test_errors_are_one_line_naming_the_file_and_the_fix(files, spec, message):
    """The same message from ``jaxembed train`` and ``jaxembed data prepare`` (which also takes 'shared')."""
    with pytest.raises(UserError) as e:
        cfglib.load_config_file(spec)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(UserError) as e:
        cfglib.load_data_config(spec)
    assert str(e.value).startswith(message), str(e.value)
    if "no such file" in message or "no recipe" in message:
        assert str(e.value).endswith(", or 'shared')")


def test_a_config_file_runs_again_at_every_load(files):
    """No cache: each load is a fresh ConfigDict (callers apply overrides to the one they get)."""
    a = cfglib.load_config_file("v.py:x")
    a.arg = "changed"
    assert cfglib.load_config_file("v.py:x").arg == "'x'"


def test_get_hyper_is_read_by_the_same_rules(files):
    """``jaxembed sweep``'s get_hyper() reads the file as get_config() does (its old loader split at the first ':')."""
    from jaxembed.sweep.expand import load_hyper

    (files / "a:b" / "h.py").write_text(HEAD + "def get_config(arg=None):\n" + RETURNS_ARG +
                                        "\n\ndef get_hyper(arg=None):\n    return [{'optim.lr': 1e-3}]\n")
    assert load_hyper("a:b/h.py:tiny") == [{"optim.lr": 1e-3}]


# --------------------------------------------------------------------------------------------- recipes by name

ROOT = Path(__file__).resolve().parent.parent
RECIPES = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))


def _recipe_variants(name):
    from jaxembed.config.io import load_config_module

    module, _, _ = load_config_module(str(ROOT / "configs" / f"{name}.py"))
    return module.VARIANTS


def test_recipes_by_name_from_any_folder(files, capsys):
    """From a folder outside the repository: `jaxembed recipes` lists every recipe with the variants its file
    declares; train / sweep / data prepare / score take NAME[:VARIANTS]; a file of the same name wins, a folder does
    not; an unknown name and a recipe's own error are one line each."""
    from jaxembed.cli import build_parser, main
    from jaxembed.config.io import portable_spec
    from jaxembed.sweep.expand import load_hyper

    assert RECIPES == ["datacube", "demo", "kalm", "mote", "peg", "retromae"]
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in RECIPES:
        assert f"variants: {', '.join(_recipe_variants(name))}" in out and f"\n  {name} " in out, (name, out)
    assert f"files: {ROOT / 'configs'}" in out
    assert main(["recipes", "kalm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"kalm: {ROOT / 'configs' / 'kalm.py'}\nvariants: tiny, stage1, ") and "semiNN" in out
    assert "KaLM-Embedding: a Qwen2-0.5B embedder in two stages" in out
    helps = [a.help for a in build_parser()._subparsers._group_actions[0].choices["train"]._actions
             if "--config" in a.option_strings]
    assert all(n in helps[0] for n in RECIPES) and "jaxembed recipes" in helps[0]

    by_name = cfglib.load_config_file("kalm:tiny,lora")
    assert by_name.model.lora.enabled and by_name.model.lora.rank == 4
    assert cfglib.to_json(by_name) == cfglib.to_json(cfglib.load_config_file(str(ROOT / "configs/kalm.py:tiny,lora")))
    assert load_hyper("kalm:tiny") == load_hyper(str(ROOT / "configs/kalm.py:tiny"))  # jaxembed sweep's get_hyper()
    assert len(cfglib.load_data_config("demo:tiny")[0].datasets) == 4                 # jaxembed data prepare
    (files / "kalm").mkdir()                       # a folder of a recipe's name: still the recipe
    assert cfglib.load_config_file("kalm:tiny").stage1_dir == "runs/kalm_tiny/stage1"
    # a file of a recipe's name that is no .py file never runs, and does not hide the recipe; demo.py is a file
    (files / "demo").write_text("raise SystemExit('ran')\n")
    assert len(cfglib.load_config_file("demo:tiny").data.datasets) == 4
    (files / "demo.py").write_text(HEAD + "def get_config(arg=None):\n" + RETURNS_ARG)
    assert cfglib.load_config_file("demo.py:tiny").arg == "'tiny'"
    # a sweep runs, and a SLURM job reads, the recipe by name; a file by its absolute path
    assert main(["sweep", "--config", "peg:tiny", "--root", "r", "--mode", "slurm", "--dry-run", "--no-hyper",
                 "--sweep", "optim.lr=1e-3,2e-3"]) == 0
    assert f"{ROOT / 'launch' / 'slurm_gpu.sh'} peg:tiny \"$WORKDIR\"" in capsys.readouterr().out
    assert portable_spec("peg:tiny") == "peg:tiny" and portable_spec("a:b/v.py:tiny") == f"{files}/a:b/v.py:tiny"
    for argv in (["train", "--config", "kalm:tiny,stage3", "--workdir", "w"], ["score", "--config", "pegg:tiny",
                                                                               "--out", "s"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and not (files / "w").exists(), err
        assert err.startswith(("error: kalm: unknown variant(s) 'stage3' (variants: tiny, stage1, stage2",
                               "error: --config pegg:tiny: no recipe or file named 'pegg' (fix: did you mean peg?")
                              ), err


INSTALLED = textwrap.dedent("""
    import os, sys
    import jaxembed
    from jaxembed import paths
    from jaxembed.cli import main

    print("package:", jaxembed.__file__, paths.recipes_dir(), paths.source_checkout(), flush=True)
    assert main(["recipes"]) == 0
    assert main(["train", "--config", "demo:tiny", "--workdir", "w"]) == 2  # no JAXEMBED_DATA, no repository
    os.environ["JAXEMBED_DATA"] = sys.argv[1]
    assert main(["sweep", "--config", "kalm:tiny", "--root", "r", "--dry-run"]) == 0
""")


def test_an_installed_package_ships_and_finds_the_recipes(tmp_path, shared_data, monkeypatch):
    """A non-editable install: setup.py ships configs/ as the package jaxembed.recipes (every jaxembed package too,
    which pyproject.toml's own package list would override); a package laid out so, with no repository around it,
    finds the recipes by name from any folder, and without JAXEMBED_DATA says in one line that the shared data
    needs it."""
    import setuptools  # noqa: F401 (before distutils: setuptools' own)
    from distutils.core import run_setup

    monkeypatch.chdir(ROOT)
    dist = run_setup(str(ROOT / "setup.py"), stop_after="config")
    assert dist.package_dir == {"jaxembed.recipes": "configs"} and "jaxembed.recipes" in dist.packages
    assert set(setuptools.find_packages(str(ROOT), include=["jaxembed", "jaxembed.*"])) < set(dist.packages)

    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "jaxembed", site / "jaxembed", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", site / "jaxembed" / "recipes", ignore=shutil.ignore_patterns("*.md"))
    (tmp_path / "elsewhere").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAXEMBED_DATA"}
    p = subprocess.run([sys.executable, "-c", INSTALLED, str(shared_data)], cwd=tmp_path / "elsewhere",
                       env=dict(env, PYTHONPATH=str(site)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"package: {site / 'jaxembed' / '__init__.py'} {site / 'jaxembed' / 'recipes'} False" in p.stdout
    assert f"files: {site / 'jaxembed' / 'recipes'}" in p.stdout and "\n  kalm " in p.stdout
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: demo: the shared data folder is not known: jaxembed runs as an installed package, "
                      "outside its repository (fix: export JAXEMBED_DATA=DIR, the folder that holds train/, dev/ and "
                      "eval/ -- the repository's ../shared/data)"], p.stderr
    assert "-m jaxembed.cli train --config kalm:tiny --workdir r/semi_homogeneous_proportion=0.5 " in p.stdout


# ---------------------------------------------------------------------- data files, a run's config.json as a config

RAN = "open('ran.txt', 'w').write('the file ran')\n"


@pytest.mark.parametrize("name,message", [
    ("data.jsonl", "data.jsonl is not a Python file (.jsonl); a config file is Python and runs as code"),
    ("data.json", "not a run config: a JSON config is the config.json of a run directory, with the sections model, "
                  "data, plan, loss, optim, train (missing: model, data, plan, loss, optim, train)"),
    ("notes", "notes is not a Python file (no suffix)"),
])
def test_a_data_file_given_as_config_is_never_run(files, capsys, name, message):
    """`jaxembed train --config data.jsonl`: one line, and nothing in the file runs (it used to run as Python, then
    end in 'defines no get_config()')."""
    from jaxembed.cli import main

    body = '{"query": "q", "pos": ["p"]}\n' + RAN  # JSON Lines, then code the old loader ran
    (files / name).write_text('[{"query": "q", "pos": ["p"]}]\n' if name.endswith(".json") else body)
    assert main(["train", "--config", name, "--workdir", "w"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --config {name}: ") and message in err and "\n" not in err, err
    assert not (files / "ran.txt").exists() and not (files / "w").exists()


def _run_config_json(folder: Path) -> Path:
    """A run's config.json, as jaxembed train writes it (write_resolved)."""
    from jaxembed.data.config import dataset_config

    c = cfglib.default_config()
    c.model.name = "some/model"
    c.data.datasets = [dataset_config(name="a", path="a.jsonl", task_type="retrieval", temperature=0.02)]
    c.plan.steps = 7
    with c.unlocked():
        c.curriculum_dir = "runs/x/curriculum"  # a recipe's own top-level key
    folder.mkdir(exist_ok=True)
    cfglib.write_resolved(c, RunDir(folder))
    return folder / "config.json"


def test_a_runs_config_json_is_a_config_read_as_data(files):
    """``--config WORKDIR/config.json`` (the documented way to resume a run as it was) is read as JSON, never run
    (it used to run as Python: NameError 'null'); the config it gives writes the same config.json again, and a key
    this version lacks, a variant, broken JSON are one line each."""
    path = _run_config_json(files / "run")
    c = cfglib.load_config_file(str(path))
    assert cfglib.to_json(c) + "\n" == path.read_text()
    assert c.plan.steps == 7 and c.data.datasets[0].temperature == 0.02 and c.curriculum_dir == "runs/x/curriculum"
    assert cfglib.apply_overrides(c, ["plan.steps=9"]).plan.steps == 9
    assert cfglib.load_data_config(str(path))[0].datasets[0].name == "a"  # data prepare takes it too
    text = path.read_text()
    cases = {
        "run/config.json:tiny": "--config run/config.json:tiny: a JSON run config takes no variant (fix: --config "
                                "run/config.json, with --config.KEY=VALUE overrides)",
        "unknown.json": "unknown.json: unknown key(s) optim.lrr: this version of jaxembed has no such key (fix: "
                        "remove them from the file",
        "broken.json": "broken.json:2: not valid JSON (",
        "ds.json": "ds.json: data.datasets: dataset_config: unknown key(s) tempreature",
    }
    (files / "unknown.json").write_text(text.replace('"optim": {', '"optim": {"lrr": 1, ', 1))
    (files / "broken.json").write_text('{"model":\n')
    (files / "ds.json").write_text(text.replace('"temperature": 0.02', '"tempreature": 0.02', 1))
    for spec, message in cases.items():
        with pytest.raises(UserError) as e:
            cfglib.load_config_file(spec)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    assert not (files / "ran.txt").exists()


def test_config_txt_is_plain_key_value_lines(files):
    """config.txt: one ``key: value`` line per value (it was ml_collections' YAML with !!python/object tags)."""
    import yaml

    _run_config_json(files / "run")
    text = (files / "run" / "config.txt").read_text()
    lines = text.splitlines()
    assert "!!python" not in text and all(": " in x and not x.startswith(" ") for x in lines[1:]), text[:500]
    assert "optim.lr: 2e-05" in lines and 'data.datasets[0].name: "a"' in lines and "plan.steps: 7" in lines
    assert yaml.safe_load(text)["data.datasets[0].temperature"] == 0.02  # plain YAML too
