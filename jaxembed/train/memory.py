"""How large a global batch fits on a device, predicted before any device: the trainer's own train step
(``jaxembed.train.step.make_train_step``) built on an abstract model (``jax.ShapeDtypeStruct`` leaves: no weights
are made or read), compiled ahead of time for one padded batch shape, and measured by XLA's memory analysis of the
compiled program (``compiled.memory_analysis()``: arguments + outputs - donated aliases + temporaries).

The figure is the compiler's buffer assignment on the machine that compiles (the CPU, here): the device's own
compiler fuses, schedules and picks attention kernels differently (a fused flash-attention kernel keeps no
[heads, T, T] probabilities, the einsum path of the CPU does), and its runtime adds a context, workspaces and an
allocator's fragmentation. The prediction is therefore a starting point to check on the device, not a guarantee.

- ``abstract_run(hf_config, settings)``: a ``jaxembed.train.run.Run`` of that architecture config with the run
  settings of ``MemorySettings`` (compute dtype, remat, gradient cache, LoRA and its base dtype), without a
  store, a plan or a model folder: one contrastive dataset, ``negatives`` hard negatives per query.
- ``step_memory(run, batch, query_length, doc_length)``: one compilation, its ``Probe``.
- ``prober(hf_config, settings, ...)``: batch -> ``Probe``, of the whole model or extrapolated along the depth from
  two cut copies of it (``depths``: much cheaper compilations, the same figure within 0.02 % where checked).
- ``largest_batch(probe, budget, ...)``: the largest global batch (a multiple of ``step``) whose step fits in
  ``budget`` bytes: interpolation search between a fitting and a failing batch (memory is close to affine in the
  batch), each probe one compilation (or two cut ones).
"""

from __future__ import annotations

import dataclasses
import time
import types
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import lora, parallel
from jaxembed.errors import UserError


#: XLA options that skip LLVM's optimisations of the generated CPU code: the buffer assignment (what the memory
#: analysis reports) is made before, and comes out the same; compiling takes about half the time
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """The run settings that shape the step's memory. remat: False, True or a policy name (``model.remat_policy``);
    lora_rank 0: full fine-tuning (AdamW on every parameter); gradcache_chunk 0: no gradient cache; negatives: hard
    negatives per query (K = 1 + negatives documents)."""

    dtype: str = "bfloat16"
    remat: bool | str = False
    gradcache_chunk: int = 0
    lora_rank: int = 0
    base_dtype: str = "bfloat16"
    negatives: int = 1
    pooling: str = "lasttoken"

    def describe(self) -> str:
        how = (f"LoRA rank {self.lora_rank} ({self.base_dtype} base)" if self.lora_rank else "full fine-tuning")
        remat = f"remat ({self.remat})" if isinstance(self.remat, str) else "remat" if self.remat else "no remat"
        extra = [f"compute {self.dtype}", remat,
                 f"gradient cache {self.gradcache_chunk} queries" if self.gradcache_chunk else "no gradient cache"]
        return ", ".join([how, *extra])


@dataclasses.dataclass(frozen=True)
class Probe:
    """One compiled step: its global batch (queries), XLA's byte counts and the compile time."""

    batch: int
    arguments: int
    outputs: int
    aliased: int
    temporaries: int
    compile_s: float

    @property
    def peak(self) -> int:
        """Bytes alive at once: the arguments (the state is donated: the outputs reuse its buffers), the outputs
        that do not, and the temporaries."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "peak": self.peak}


def run_config(settings: MemorySettings) -> Any:
    """The run config of ``settings`` (the defaults of ``jaxembed.config`` otherwise)."""
    c = cfglib.default_config()
    c.model.dtype = settings.dtype
    c.model.remat = bool(settings.remat)
    c.model.remat_policy = settings.remat if isinstance(settings.remat, str) else "nothing"
    c.train.gradcache_chunk = int(settings.gradcache_chunk)
    c.data.packing = False
    if settings.lora_rank:
        c.model.lora.enabled = True
        c.model.lora.rank = int(settings.lora_rank)
        c.model.lora.alpha = 2.0 * settings.lora_rank
        c.model.lora.base_dtype = settings.base_dtype
    return c


def abstract_model(hf_config: dict, settings: MemorySettings, spec: lora.LoRASpec | None):
    """The EmbeddingModel of ``hf_config`` (a Hugging Face config.json dict) with ShapeDtypeStruct leaves, with
    LoRA adapters (and the base cast) when ``spec`` is given."""
    from jaxembed import models
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig
    from jaxembed.models.layers import remat_option

    remat = remat_option(bool(settings.remat), settings.remat if isinstance(settings.remat, str) else "nothing")
    cfg = models.config_from_hf(hf_config, where="the model config", dtype=settings.dtype, param_dtype="float32",
                                remat=remat)

    def build():
        model = EmbeddingModel.init(cfg, HeadConfig(settings.pooling))
        if spec is not None:
            lora.apply(model, spec)
        return model

    return nnx.eval_shape(build)


def abstract_run(hf_config: dict, settings: MemorySettings):
    """A ``jaxembed.train.run.Run`` of an abstract model: what ``make_train_step`` reads, nothing allocated."""
    from jaxembed.runs import optim
    from jaxembed.train.run import Run

    c = run_config(settings)
    spec = lora.spec_from_config(c)
    model = abstract_model(hf_config, settings, spec)
    graphdef, params, rest = nnx.split(model, lora.TRAINABLE if spec is not None else nnx.Param, ...)
    if spec is None and jax.tree.leaves(rest):
        raise UserError("the model has non-parameter state, which an abstract full fine-tuning step cannot hold")
    tx, sched = optim.make_optimizer(nnx.to_pure_dict(params), lr=c.optim.lr, total_steps=1000, warmup_steps=100,
                                     weight_decay=c.optim.weight_decay, grad_clip=c.optim.grad_clip)
    store = types.SimpleNamespace(path="", datasets=[types.SimpleNamespace(loss="", name="docs")])
    plan = types.SimpleNamespace(dataset_ids=np.zeros(1, np.int32), used_dataset_ids=lambda: [0])
    loaded = types.SimpleNamespace(model=model)
    mesh = parallel.make_mesh(1, 1)
    return Run(c, None, mesh, loaded, store, plan, graphdef, rest, tx, sched, 1 + int(settings.negatives), None, None,
               spec, "")


def abstract_state(run) -> dict:
    """The train state's ShapeDtypeStructs (``jaxembed.train.state.init_state``'s structure)."""
    _, params, _ = nnx.split(run.loaded.model, lora.TRAINABLE if run.lora is not None else nnx.Param, ...)
    pure = nnx.to_pure_dict(params)
    s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
    key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    return {"params": pure, "opt_state": jax.eval_shape(run.tx.init, pure), "step": s((), jnp.int32),
            "rng": key, "peg_t": s((), jnp.float32), "nonfinite": s((), jnp.int32), "skipped": s((), jnp.int32)}


def abstract_batch(batch: int, K: int, query_length: int, doc_length: int) -> dict:
    """The loader's padded batch (``jaxembed.data.pipeline``) of ``batch`` queries, as ShapeDtypeStructs."""
    s = jax.ShapeDtypeStruct
    i32, f32, n = jnp.int32, jnp.float32, batch * K
    return {"query_input_ids": s((batch, query_length), i32), "query_attention_mask": s((batch, query_length), i32),
            "doc_input_ids": s((n, doc_length), i32), "doc_attention_mask": s((n, doc_length), i32),
            "query_prompt_length": s((batch,), i32), "doc_prompt_length": s((n,), i32),
            "doc_valid": s((n,), jnp.bool_), "doc_hash": s((n, 2), jnp.uint32), "query_hash": s((batch, 2), jnp.uint32),
            "task_id": s((batch,), i32), "dataset_id": s((batch,), i32), "weight": s((batch,), f32),
            "example_index": s((batch,), i32), "teacher_score": s((n,), f32), "pair_score": s((batch,), f32),
            "temperature": s((), f32), "step": s((), i32)}


def step_memory(run, batch: int, query_length: int, doc_length: int, step_fn: Callable | None = None) -> Probe:
    """Compile the run's train step for ``batch`` queries of ``query_length`` tokens and K documents of
    ``doc_length`` tokens each; XLA's byte counts of the compiled program."""
    from jaxembed.train.step import make_train_step

    step = step_fn or make_train_step(run)
    fn, kw = getattr(step, "func", step), dict(getattr(step, "keywords", {}))
    t0 = time.perf_counter()
    lowered = fn.lower(abstract_state(run), abstract_batch(batch, run.K, query_length, doc_length), **kw)
    compiled = lowered.compile(compiler_options=FAST_COMPILE)
    seconds = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    if ma is None:
        raise UserError(f"the {jax.default_backend()} compiler reports no memory analysis (fix: run on the CPU: "
                        "JAX_PLATFORMS=cpu)")
    return Probe(batch, int(ma.argument_size_in_bytes), int(ma.output_size_in_bytes),
                 int(getattr(ma, "alias_size_in_bytes", 0)), int(ma.temp_size_in_bytes), round(seconds, 1))


def _affine(a: Probe, b: Probe, budget: int) -> float | None:
    """The batch at which the line through probes ``a`` and ``b`` (peak bytes against batch) reaches ``budget``."""
    slope = (b.peak - a.peak) / (b.batch - a.batch) if b.batch != a.batch else 0.0
    return a.batch + (budget - a.peak) / slope if slope > 0 else None


def next_batch(fits: list[Probe], overs: list[Probe], budget: int, step: int, bisect: bool = False) -> int:
    """The next batch to probe, a multiple of ``step``: halve while nothing fits; double after one fitting
    probe; then the affine extrapolation through the two largest fitting probes (at most 8 times the larger), or
    the interpolation between the largest fitting and the smallest failing one, kept strictly between them
    (``bisect``: the middle, when interpolation keeps landing on one side of a curved memory line)."""
    if not fits:
        return max(step, min(p.batch for p in overs) // 2 // step * step)
    fit = max(fits, key=lambda p: p.batch)
    over = min(overs, key=lambda p: p.batch) if overs else None
    if over is not None:
        x = _affine(fit, over, budget)
        if x is None or bisect:
            x = (fit.batch + over.batch) / 2
        return min(max(int(x) // step * step, fit.batch + step), over.batch - step)
    if len(fits) < 2:
        return 2 * fit.batch
    second = sorted(fits, key=lambda p: p.batch)[-2]
    x = _affine(second, fit, budget)
    # memory flat in the batch (the gradient cache: one sub-batch's activations) says little: jump by 8
    return max(fit.batch + step, min(int(x), 8 * fit.batch) // step * step if x is not None else 8 * fit.batch)


def depth_key(hf_config: dict) -> str:
    """The config.json field of the model's depth."""
    for key in ("num_hidden_layers", "num_layers"):
        if key in hf_config:
            return key
    raise UserError("the model config has no num_hidden_layers (or num_layers): its depth is unknown")


def at_depth(hf_config: dict, layers: int) -> dict:
    """``hf_config`` cut to its first ``layers`` layers (the per-layer lists too)."""
    out = dict(hf_config, **{depth_key(hf_config): int(layers)})
    if isinstance(out.get("layer_types"), list):
        out["layer_types"] = out["layer_types"][:layers]
    return out


def prober(hf_config: dict, settings: MemorySettings, query_length: int, doc_length: int,
           depths: tuple[int, int] | None = None) -> Callable[[int], Probe]:
    """batch -> the ``Probe`` of the model's train step. depths (d1, d2): the model cut to d1 and d2 layers is
    compiled, and each byte count extrapolated along the depth to the model's own (the layers are alike, so the
    step's memory is affine in their number: Qwen2-1.5B's 28 layers at 8 queries of 512-token documents, predicted
    from 2 and 4 layers, came within 0.02 % of the full compilation); each probe then costs two small
    compilations instead of a large one."""
    from jaxembed.train.step import make_train_step

    if depths is None:
        run = abstract_run(hf_config, settings)
        fn = make_train_step(run)
        return lambda batch: step_memory(run, batch, query_length, doc_length, fn)
    d1, d2 = depths
    full = int(hf_config[depth_key(hf_config)])
    runs = [abstract_run(at_depth(hf_config, d), settings) for d in (d1, d2)]
    fns = [make_train_step(r) for r in runs]

    def probe(batch: int) -> Probe:
        a, b = (step_memory(r, batch, query_length, doc_length, f) for r, f in zip(runs, fns))
        t = (full - d1) / (d2 - d1)
        ext = lambda x, y: int(round(x + (y - x) * t))  # noqa: E731
        return Probe(batch, ext(a.arguments, b.arguments), ext(a.outputs, b.outputs), ext(a.aliased, b.aliased),
                     ext(a.temporaries, b.temporaries), round(a.compile_s + b.compile_s, 1))

    return probe


def largest_batch(probe: Callable[[int], Probe], budget: int, *, step: int = 1, start: int = 8, max_probes: int = 8,
                  log: Callable[[str], None] = lambda s: None) -> tuple[int, list[Probe]]:
    """(the largest global batch, a multiple of ``step``, whose step needs at most ``budget`` bytes by
    ``probe`` (``prober``); every probe, by batch). 0 when ``step`` queries do not fit. After ``max_probes``
    probes the largest fitting batch found so far is returned (the probes show the bracket)."""
    fits: list[Probe] = []
    overs: list[Probe] = []
    sides: list[bool] = []  # whether each probe fitted, in order
    b = max(step, start // step * step)
    while len(sides) < max_probes:
        p = probe(b)
        sides.append(p.peak <= budget)
        (fits if sides[-1] else overs).append(p)
        log(f"batch {b}: {p.peak / 2**30:.2f} GiB ({'fits' if sides[-1] else 'over'}, compiled in "
            f"{p.compile_s:.0f} s)")
        if overs and min(q.batch for q in overs) <= step and not fits:
            break
        if fits and overs and min(q.batch for q in overs) - max(q.batch for q in fits) <= step:
            break
        b = next_batch(fits, overs, budget, step, bisect=len(sides) >= 3 and len(set(sides[-2:])) == 1)
    probes = sorted(fits + overs, key=lambda p: p.batch)
    return (max(q.batch for q in fits) if fits else 0), probes
