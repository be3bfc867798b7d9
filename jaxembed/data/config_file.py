"""The ``--config`` of ``jaxembed data prepare`` (and ``plan build``): ``get_config()`` / ``get_config(VARIANT)`` of a
Python file given as ``PATH[:VARIANT]`` (``load_config_file``), and the data config in it, or ``shared``: every
file of the shared training data (``load_data_config``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from jaxembed.errors import UserError, in_file, with_file


def load_config_file(spec: str):
    """``get_config()`` / ``get_config(variant)`` of a Python config file given as ``PATH[:VARIANT]``."""
    from jaxembed.config import override_error  # one line for a value of the wrong type (a dict to datasets)

    path, variant = spec, None
    if not Path(spec).exists() and ":" in spec:
        path, variant = spec.rsplit(":", 1)
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a config file" if p.is_dir() else f"no such file {path}"
        raise UserError(f"--config {spec}: {what} (fix: give a Python config file, PATH:VARIANT, or 'shared')")
    try:
        mod_spec = importlib.util.spec_from_file_location(f"_jaxembed_config_{p.stem}", p)
        mod = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(mod)
    except UserError as e:
        raise UserError(with_file(e, p)) from None
    except Exception as e:  # noqa: BLE001 -- a broken config file is the user's to fix
        raise UserError(override_error(e, p) or f"{in_file(e, p)}: cannot load the config file "
                        f"({type(e).__name__}: {e})") from None
    if not hasattr(mod, "get_config"):
        raise UserError(f"{path}: no get_config() function (fix: define get_config(arg=None) returning a "
                        "ConfigDict)")
    try:
        return mod.get_config(variant) if variant is not None else mod.get_config()
    except UserError as e:  # e.g. dataset_config(tempreature=...): name the config file and line
        raise UserError(with_file(e, p)) from None
    except Exception as e:  # noqa: BLE001
        raise UserError(override_error(e, p) or f"{in_file(e, p)}: get_config({variant!r}) failed "
                        f"({type(e).__name__}: {e})") from None


def load_data_config(spec: str):
    """(data config, where) for ``--config``: 'shared', or a config file's ``data`` field (or the data config
    itself when the file returns one)."""
    from jaxembed.data.config import shared_train_config

    if spec == "shared":
        from jaxembed import paths

        d = paths.shared_data_dir()
        if not (d / "train").is_dir():
            raise UserError(f"--config shared: {d / 'train'} does not exist (fix: set JAXEMBED_DATA to the shared "
                            "data folder)")
        return shared_train_config(d), "shared: data"
    cfg = load_config_file(spec)
    keys = set(cfg.keys()) if hasattr(cfg, "keys") else set()
    if "data" in keys:
        from jaxembed.config import data_section

        return data_section(cfg), f"{spec}: data"  # a run config: its data section without the run's 'store' key
    if "datasets" in keys:
        return cfg, f"{spec}: data"
    raise UserError(f"{spec}: get_config() returned no 'data' field (fix: add config.data = a data config, see "
                    "jaxembed.data.config.default_data_config)")
