"""The lines a run prints as it starts (process 0 of a pod): the model, the data, the plan."""

from __future__ import annotations


import jax
import numpy as np
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import loading, lora, pod
from jaxembed.runs.rundir import RunDir


def say(text: str) -> None:
    """A line of the run's start on stdout (process 0 of a pod only)."""
    if pod.is_main():
        print(text, flush=True)


def count(n: float, unit: str) -> str:
    return f"{n:,.0f} {unit}" + ("" if n == 1 else "s")


def describe_model(loaded: loading.Loaded, source: str, config, mesh) -> str:
    """One line: the model, its size, its max length, compute dtype and the devices."""
    mc = loaded.model.config
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(loaded.model, nnx.Param)))
    arch = ", ".join(x for x in (getattr(mc, "model_type", ""), f"{getattr(mc, 'num_layers', '?')} layers",
                                 f"hidden {getattr(mc, 'hidden_size', '?')}", f"{n / 1e6:.1f}M parameters") if x)
    extra = [f"max length {loaded.tokenizer.max_length}", f"compute {config.model.dtype}"]
    lora_spec = lora.spec_from_config(config)
    if lora_spec is not None:
        extra.append(f"LoRA rank {lora_spec.rank}, base frozen")
    if getattr(mc, "mote", None) is not None:
        extra.append(f"MoTE {len(mc.mote.experts)} experts")
    devices = jax.devices()
    where = f"{len(devices)} x {devices[0].device_kind}" + (f" in {jax.process_count()} processes"
                                                            if jax.process_count() > 1 else "")
    return f"model: {source} ({arch}); {', '.join(extra)}; devices: {where} (mesh {dict(mesh.shape)})"


def describe_store(store, config, rd: RunDir) -> str:
    """One line: the datasets with their sizes and task types, and where the store is."""
    ds = store.datasets
    shown = ", ".join(f"{d.name} {d.size:,} ({d.task_type})" for d in ds[:8])
    more = f" and {len(ds) - 8} more" if len(ds) > 8 else ""
    total = sum(d.size for d in ds)
    where = config.data.store or rd.store
    return (f"data: {count(len(ds), 'dataset')}, {count(total, 'example')}: {shown}{more} "
            f"(store {where})")


def describe_plan(plan, config, store) -> str:
    """One line: steps, queries per step and candidates per query, epochs, batching, packing. Reads the plan's step
    count only: the plan it is given is the saved one, memory-mapped, and no row of it is read here."""
    negs = max(int(d.num_negatives) for d in store.datasets)
    size = sum(d.size for d in store.datasets)
    b = int(config.plan.global_batch_size)
    epochs = plan.steps * b / max(size, 1)
    cand = "positive" + (f" + {count(negs, 'hard negative')}" if negs else "") + " per query"
    pack = "texts packed into rows" if cfglib.packing_enabled(config) else "one text per row (padded)"
    return (f"plan: {count(plan.steps, 'step')} x {b:,} queries ({cand}; in-batch negatives across the global "
            f"batch), {epochs:.2g} epochs of the data, {config.plan.strategy or 'per-dataset'} batching, {pack}")
