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
from pathlib import Path

from jaxembed.base_model import base_license_of, base_model_of, hub_id, hub_license, jaxembed_base, license_of
from jaxembed.losses import table as loss_table
from jaxembed.runs.facts import eval_at, eval_rows, final_eval, skipped_note
from jaxembed.runs.rundir import RunDir, rundir

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
        from jaxembed.mote.settings import MoTESettings

        rows.append(MoTESettings.card_row(mote_spec))
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


def plain_card(config, head, prompts=None, *, source: str | None = None, name: str | None = None,
               max_length: int | None = None, mote_spec=None, note: str = "", path: str | os.PathLike | None = None
               ) -> str:
    """The card of a folder written without a training run (a conversion): what it is, where it came from
    (``source``: its hub id names the base model, its README.md the license). The usage names ``name`` (the hub id
    it will be pushed to), else the folder ``path`` it is written to."""
    base = (hub_id(source) or jaxembed_base(source)) if source else None
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
    base_id = hub_id(base) or jaxembed_base(base)
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
    from jaxembed.mote.settings import MoTESettings

    return (["## Routing (task type -> experts)", ""]
            + MoTESettings.card_routing(spec) + [""]
            + ["`transformers.AutoModel` on this folder gives the default expert's dense model.", ""])


def run_card(workdir: str | os.PathLike | RunDir, config: dict, model, *, summary: dict | None = None,
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
    rd = rundir(workdir)
    loads = _where(name, path)  # what the usage snippet loads
    summary = dict(summary or {})
    if summary.get("step") is None and rd.summary_json.is_file():
        try:
            summary = {**json.loads(rd.summary_json.read_text(encoding="utf-8")), **summary}
        except (OSError, ValueError):
            pass
    step = step if step is not None else summary.get("step")
    store_dir = Path(store_dir or (config.get("data") or {}).get("store") or rd.store)
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
    evaluation = final_eval(rd, summary)
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
    note = skipped_note(int(summary.get("skipped") or 0), int(summary.get("step") or step or 0))
    if note:
        lines += [f"**Warning:** {note[0].upper()}{note[1:]}.", ""]
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
    # each loss's and feature's own words (jaxembed/losses/parts/: symmetric, PEG's alpha and beta, Matryoshka, ...)
    loss = f"`{lcfg.get('type')}`, temperature {_num(lcfg.get('temperature'))}" + loss_table.card_text(lcfg)
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
    from jaxembed.train.gradcache import GradCacheSettings

    gradcache_row = GradCacheSettings.from_config(tcfg).card_row()
    if gradcache_row:
        trows.insert(3, gradcache_row)
    from jaxembed.lora import LoRASpec

    lora_row = LoRASpec.card_row(mcfg.get("lora") or {}, lora_export)
    if lora_row:
        trows.insert(1, lora_row)
    lines += ["## Training", ""] + _table(("", ""), trows)

    # evaluation
    if rows:
        where = ("on the exported step" if on_step else
                 f"at step {evaluation.get('step')}; the export is step {step}, so these numbers are not in the "
                 "metadata")
        at = evaluation.get("step")
        start = eval_at(rd, 0) if at != 0 else None
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
