"""The one loader of config files (``jaxembed.config_io.load_config_file``): ``PATH[:VARIANT]`` as every ``--config``
reads it. Two loaders with different rules existed before (``jaxembed.config_io`` for train / score / sweep /
pretrain, ``jaxembed.data.config_file`` for ``data prepare`` / ``plan build``); each case below failed on one of
them (or on both: the file as a module, None returned, a syntax error)."""

from __future__ import annotations

import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError

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
    ("a:b/v.py", None), ("a:b/v.py:tiny", "tiny"),  # a ':' in a folder name (a Windows drive): the old train loader
    ("v.py:a:b", "a:b"),           # after the first ':' of the file, as ml_collections: the old data loader failed
    ("v.py:", None),               # an empty variant is none (the data loader passed '')
    ("base.py", "base"),           # no variant: get_config() with its own default (the train loader passed None)
    ("required.py", None),         # get_config(arg) with no default: get_config(None) (the data loader failed)
    ("noarg.py", "none"),          # ml_collections' def get_config():
    ("v.cfg:x", "x"),              # any file name, as ml_collections loads it (both failed: no .py loader)
    ("dc.py", "1"),                # a @dataclass in the file: it runs as a module in sys.modules (both failed)
])
def test_spec_rules(files, spec, arg):
    assert cfglib.load_config_file(spec).arg == (repr(arg) if arg not in ("none", "1") else arg)
    assert cfglib.load_config_file(str(files / spec)).arg == cfglib.load_config_file(spec).arg  # absolute too


@pytest.mark.parametrize("spec,message", [
    ("noarg.py:tiny", "--config noarg.py:tiny: get_config() takes no argument, so the variant 'tiny' cannot be "
                      "passed (fix: define get_config(arg=None) in noarg.py, or drop ':tiny')"),
    ("missing.py:tiny", "--config missing.py:tiny: no such file missing.py (fix: give a Python config file as PATH "
                        "or PATH:VARIANT, e.g. configs/demo.py:tiny"),
    ("a:b", "--config a:b: is a folder, not a config file (fix: give a Python config file as PATH"),
    ("https://example.com/c.py:tiny", "--config https://example.com/c.py:tiny: is a URL, config files are read "
                                      "from a local path (fix: download it and give its local path"),
    ("noget.py", "--config noget.py: defines no get_config() (fix: define get_config(arg=None) returning a "
                 "ConfigDict)"),
    ("none.py", "--config none.py: get_config() returned None (fix: end get_config with 'return config')"),
    ("syntax.py", "syntax.py:4: not valid Python"),  # an error in the file: PATH:LINE, as an editor reads it
])
def test_errors_are_one_line_naming_the_file_and_the_fix(files, spec, message):
    """The same message from ``jaxembed train`` and ``jaxembed data prepare`` (which also takes 'shared')."""
    with pytest.raises(UserError) as e:
        cfglib.load_config_file(spec)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(UserError) as e:
        cfglib.load_data_config(spec)
    assert str(e.value).startswith(message), str(e.value)
    if "no such file" in message:
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
