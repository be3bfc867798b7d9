"""A run's export (the Hugging Face / sentence-transformers folder; jaxembed.export writes it): its parameters
fetched to the host (``host_params``, a collective on a pod), the model with them (``host_model``; LoRA: with
the frozen base), the prompts of every task (``task_prompts``), its model card (``run_card``), and
``export_params``, which writes the folder. ``jaxembed.train.run.export_from_workdir`` (``jaxembed export``,
``model.init_from``) exports a run directory's step with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import lora, pod

if TYPE_CHECKING:
    from jaxembed.train.run import Run


def task_prompts(store) -> dict[str, str]:
    """Prompts of every task, keyed as mteb looks them up: ``{task}-query``, ``{task}-document`` and ``{task}``."""
    prompts = {}
    for d in store.datasets:
        if d.query_instruction:
            prompts.setdefault(d.task, d.query_instruction)
            prompts.setdefault(f"{d.task}-query", d.query_instruction)
        if d.doc_instruction:
            prompts.setdefault(f"{d.task}-document", d.doc_instruction)
    return prompts


def export_params(run: Run, params, out_dir: Path, *, summary: dict | None = None, step: int | None = None,
                  name: str | None = None, lora_export: str | None = None) -> Path:
    """Write the export of ``params`` (host arrays, or arrays on this process's devices) to ``out_dir``, with the
    run's model card (``jaxembed.export.card.run_card``: ``summary`` of this run, else the run directory's
    summary.json; ``step``: the exported checkpoint; ``name``: the hub id it will be pushed to). LoRA runs:
    ``model.lora.export`` (or ``lora_export``): merged weights, the PEFT adapter, or both
    (``jaxembed.export.export_lora``)."""
    from jaxembed import export as exportlib

    model = host_model(run, params)
    prompts = {**run.loaded.st.prompts, **task_prompts(run.store)}
    mote = getattr(model.config, "mote", None) is not None
    lora_kind = (lora_export or run.lora.export) if run.lora is not None else None
    card = run_card(run, model, prompts, summary=summary, step=step, name=name, kind="mote" if mote else "model",
                    path=out_dir, lora_export=lora_kind)
    kw = dict(hf_config=run.loaded.hf_config, prompts=prompts, similarity_fn_name=run.loaded.st.similarity_fn_name,
              model_card=card)
    if run.lora is not None:
        adapter_card = None  # a MoTE run's adapters (one folder per expert) get export_lora's cards
        if lora_kind != "merged" and not mote:  # the adapter alone is what a push uploads (loadable_folder)
            adapter_card = run_card(run, model, prompts, summary=summary, step=step, kind="adapter",
                                    name=name if lora_kind == "adapter" else None, adapter_base=run.lora_base,
                                    path=Path(out_dir) / exportlib.ADAPTER_DIR, lora_export=lora_kind)
        return exportlib.export_lora(model, run.loaded.tokenizer, out_dir, spec=run.lora, base=run.lora_base,
                                     kind=lora_kind, adapter_card=adapter_card, name=name, **kw)
    return exportlib.export(model, run.loaded.tokenizer, out_dir, **kw)


def host_model(run: Run, params):
    """The model with ``params`` (host arrays). LoRA: the frozen base weights are the loaded model's own, host
    arrays of this process (``run.rest`` may be sharded over other processes' devices)."""
    if run.lora is None:
        return nnx.merge(run.graphdef, jax.device_get(params), run.rest)
    base = nnx.split(run.loaded.model, lora.TRAINABLE, ...)[2]
    return nnx.merge(run.graphdef, jax.device_get(params), jax.device_get(base))


def run_card(run: Run, model, prompts: dict, **kw) -> str:
    """The model card of an export of ``run`` (``jaxembed.export.card.run_card`` on its run directory)."""
    from jaxembed.export import card as model_card

    return model_card.run_card(run.rundir, cfglib.to_plain(run.config), model, prompts=prompts,
                               max_length=run.loaded.tokenizer.max_length,
                               store_dir=run.config.data.store or run.rundir.store, **kw)


def host_params(params) -> Any:
    """Parameters as host arrays on every process (a collective with several processes: all must call it)."""
    if pod.process_count() > 1:
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(params, tiled=True)  # the full value of each global array
    return jax.device_get(params)
