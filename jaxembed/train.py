"""The trainer: ``jaxembed train --config FILE[:VARIANT] --workdir DIR [--config.KEY=VALUE ...]``.

Flow (DESIGN.md 3): config -> validate -> dataset store -> batch plan -> Grain loader -> sharded step ->
checkpoints -> export. Each arrow leaves a file in the run directory:
config.json / config.txt, store/, plan.npz, metrics.jsonl, tensorboard/, checkpoints/, export/.

Train state (one pytree): params, opt_state, step, rng (raw key data), peg_t (PEG momentum), nonfinite
(consecutive skipped steps), skipped (total). The data position is the step: the plan and the loader give the
same batch for a step after any restart, so a resumed run reproduces an uninterrupted one bit for bit on CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import flops as flopslib
from jaxembed import gradcache, hf, optim, parallel
from jaxembed.checkpointing import Checkpointer
from jaxembed.errors import UserError
from jaxembed.losses import CandidateInfo, LossOptions, QueryInfo, layout_pos_index, tiled_terms
from jaxembed.losses.infonce import contrastive_loss, query_terms
from jaxembed.losses.matryoshka import matryoshka_loss
from jaxembed.monitor import Monitor

log = logging.getLogger(__name__)


class TrainingStopped(UserError):
    """The run stopped on purpose (non-finite steps); the message names step and task."""


@dataclasses.dataclass
class Run:
    config: Any
    workdir: Path
    mesh: Any
    loaded: hf.Loaded
    store: Any
    plan: Any
    graphdef: Any
    rest: Any
    tx: Any
    schedule: Callable
    K: int
    routes: tuple[np.ndarray, np.ndarray] | None = None  # MoTE: expert of each plan task's queries / documents [T]

    @property
    def task_names(self) -> list[str]:
        return list(self.plan.task_names) if hasattr(self.plan, "task_names") else []


# ------------------------------------------------------------------------------------------------ set-up


def _check_workdir(config, workdir: Path) -> None:
    prev = workdir / "config.json"
    if not prev.exists():
        return
    old = json.loads(prev.read_text())
    new = json.loads(cfglib.to_json(config))
    keys = ("model", "data", "plan", "loss", "optim")
    diffs = [k for k in keys if old.get(k) != new.get(k)]
    diffs += [f"train.{k}" for k in ("seed", "gradcache_chunk", "dropout")
              if old.get("train", {}).get(k) != new["train"].get(k)]
    if diffs:
        raise UserError(f"{workdir} holds a run with a different config ({', '.join(diffs)} differ). Resuming needs "
                        "the same config (fix: use a new --workdir, or the run's own config.json)")


def prepare_store(config, workdir: Path):
    from jaxembed.data.store import Store, write_store

    if config.data.store:
        return Store.open(config.data.store)
    store_dir = workdir / "store"
    if not (store_dir / "manifest.json").exists():
        report = write_store(cfglib.data_section(config), store_dir)
        log.info("prepared the dataset store: %s", report.summary() if hasattr(report, "summary") else report)
    return Store.open(store_dir)


def prepare_plan(config, store, workdir: Path):
    from jaxembed.data.plan import Plan, build_plan

    plan = build_plan(store, config.plan, data_config=cfglib.data_section(config))
    path = workdir / "plan.npz"
    if path.exists():
        saved = Plan.load(path)
        if saved.fingerprint() != plan.fingerprint():
            raise UserError(f"{path}: the saved plan differs from the one the config builds (the data or the plan "
                            "config changed); fix: use a new --workdir")
    else:
        plan.save(path)
    return plan


def setup(config, workdir: str | Path) -> Run:
    """Validate, create the run directory, load the model, the store and the plan, build the optimizer."""
    cfglib.validate(config)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    _check_workdir(config, workdir)
    cfglib.write_resolved(config, workdir)
    parallel.initialize()
    mesh = parallel.make_mesh(config.train.mesh_data, config.train.mesh_fsdp)
    kw = dict(dtype=config.model.dtype, param_dtype=config.model.param_dtype, remat=config.model.remat)
    if config.model.max_length:
        kw["max_length"] = config.model.max_length
    if config.model.pooling:
        kw["pooling"] = config.model.pooling
    if config.model.causal is not None:
        kw["causal"] = config.model.causal
    loaded = load_model(config, source=init_source(config, workdir), **kw)
    store = prepare_store(config, workdir)
    plan = prepare_plan(config, store, workdir)
    K = 1 + max(int(d.num_negatives) for d in store.datasets)
    spec = getattr(loaded.model.config, "mote", None)
    routes = None
    if spec is not None:
        from jaxembed import mote

        task_types = {}
        for d in store.datasets:
            task_types.setdefault(d.task, d.task_type)
        routes = mote.routing_tables(spec, list(plan.task_names), task_types)
    graphdef, params, rest = nnx.split(loaded.model, nnx.Param, ...)
    pure = nnx.to_pure_dict(params)
    total = plan.steps
    warmup = config.optim.warmup_steps if config.optim.warmup_steps >= 0 else int(config.optim.warmup_ratio * total)
    tx, sched = optim.make_optimizer(
        pure, lr=config.optim.lr, total_steps=total, warmup_steps=warmup, schedule_kind=config.optim.schedule,
        weight_decay=config.optim.weight_decay, b1=config.optim.b1, b2=config.optim.b2, eps=config.optim.eps,
        grad_clip=config.optim.grad_clip, freeze=tuple(config.optim.freeze), end_factor=config.optim.end_factor,
        routed=spec is not None)
    return Run(config, workdir, mesh, loaded, store, plan, graphdef, rest, tx, sched, K, routes)


def init_source(config, workdir: str | Path) -> str:
    """The folder (or hub id) the run's weights come from: ``model.name``, or ``model.init_from`` (a previous
    stage): a run's ``export/``; a run without one is exported from its latest checkpoint into
    ``<workdir>/init_from`` (once); or a model folder. Only step 0 reads it: a resumed run restores its own
    checkpoint."""
    src = config.model.get("init_from") if "init_from" in config.model else ""
    if not src:
        return config.model.name
    p = Path(os.path.expanduser(str(src)))
    if not (p / "checkpoints").is_dir():
        return str(p)  # a model folder
    if (p / "export" / "config.json").is_file():
        return str(p / "export")
    out = Path(workdir) / "init_from"
    if not (out / "config.json").is_file():
        print(f"model.init_from: exporting the latest checkpoint of {p} to {out}", flush=True)
        export_from_workdir(p, out)
    return str(out)


def load_model(config, source: str | None = None, **kw) -> hf.Loaded:
    """The run's model: ``source`` (default ``config.model.name``) loaded with ``kw``; with
    ``model.mote.enabled``, up-cycled into task experts (MoTE 3.1.1), or a MoTE export whose experts match the
    config."""
    source = source or config.model.name
    m = config.model.mote if "mote" in config.model else None
    if m is None or not m.enabled:
        loaded = hf.load(source, **kw)
        if getattr(loaded.model.config, "mote", None) is not None:
            raise UserError(f"the model {source!r} is a MoTE model (task experts) but "
                            "config.model.mote.enabled is False (fix: set model.mote.enabled=True, or start from a "
                            "dense model, e.g. `jaxembed export --model ... --average-experts`)")
        return loaded
    from jaxembed import mote
    from jaxembed.models import config_from_hf

    folder = hf.resolve(source)
    st = hf.read_sentence_transformers(folder)
    try:
        num_layers = config_from_hf(json.loads((st.transformer_dir / "config.json").read_text())).num_layers
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"{st.transformer_dir / 'config.json'}: cannot read the model config ({e})") from None
    return hf.load(folder, mote=mote.spec_from_config(m, num_layers), **kw)


def _param_shardings(run: Run, params_state) -> Any:
    specs = parallel.param_specs(params_state, run.mesh, run.config.train.param_sharding)
    shard = jax.tree.map(lambda s: jax.sharding.NamedSharding(run.mesh, s), specs,
                         is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    return nnx.to_pure_dict(shard) if isinstance(shard, nnx.State) else shard


def init_state(run: Run) -> dict:
    """The initial train state, placed on the mesh (params replicated or FSDP-sharded)."""
    _, params_state, _ = nnx.split(run.loaded.model, nnx.Param, ...)
    pure = nnx.to_pure_dict(params_state)
    shardings = _param_shardings(run, params_state)
    pure = jax.device_put(pure, shardings)
    rep = parallel.replicated(run.mesh)
    opt_state = jax.jit(run.tx.init)(pure)
    state = {
        "params": pure,
        "opt_state": opt_state,
        "step": jnp.asarray(0, jnp.int32),
        "rng": jax.random.key_data(jax.random.key(run.config.train.seed)),
        "peg_t": jnp.asarray(0.0, jnp.float32),
        "nonfinite": jnp.asarray(0, jnp.int32),
        "skipped": jnp.asarray(0, jnp.int32),
    }
    return jax.tree.map(lambda x: x if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1
                        else jax.device_put(x, rep), state)


# --------------------------------------------------------------------------------------------------- step


def make_train_step(run: Run) -> Callable:
    c = run.config
    K = run.K
    opts = LossOptions(same_task=c.loss.same_task_mask, peg=c.loss.type == "peg")
    terms_fn = tiled_terms(c.loss.block_q, c.loss.block_c) if c.loss.tiled else query_terms
    chunk = c.train.gradcache_chunk or None
    default_temp = float(c.loss.temperature)
    graphdef, rest = run.graphdef, run.rest
    routes = None if run.routes is None else tuple(np.asarray(r, np.int32) for r in run.routes)
    num_experts = run.loaded.model.config.mote.num_experts if routes is not None else 0
    inject = tuple(int(s) for s in c.train.inject_nonfinite_steps)
    dims, dim_ws = tuple(c.loss.matryoshka_dims), tuple(c.loss.matryoshka_weights)
    mesh = run.mesh
    sharded_loss = parallel.shard_map_loss(mesh, terms_fn=terms_fn, opts=opts, symmetric=c.loss.symmetric,
                                           peg_alpha=c.loss.peg_alpha, peg_beta=c.loss.peg_beta
                                           ) if c.loss.impl == "shard_map" else None

    def encode(params, x, key, one_expert=False):
        model = nnx.merge(graphdef, params, rest)
        rngs = None if key is None else nnx.Rngs(dropout=key)
        experts = x.get("experts")
        if experts is not None and one_expert:  # every row has the same expert: MoTE's fast path (jaxembed.mote)
            experts = experts[0]
        return model(x["ids"], x["mask"], x["prompt"], deterministic=key is None, rngs=rngs, experts=experts)

    def expert_ids(batch):
        """MoTE: the expert of each query [B] and each candidate [B * K], by the row's task (MoTE 3.1)."""
        t = batch["task_id"]
        return jnp.asarray(routes[0])[t], jnp.repeat(jnp.asarray(routes[1])[t], K)

    def loss_fn(params, batch, key, peg_t, single_task=False):
        kq = kd = None
        if c.train.dropout:
            kq, kd = jax.random.split(key)
        q_in = {"ids": batch["query_input_ids"], "mask": batch["query_attention_mask"],
                "prompt": batch["query_prompt_length"]}
        d_in = {"ids": batch["doc_input_ids"], "mask": batch["doc_attention_mask"],
                "prompt": batch["doc_prompt_length"]}
        if routes is not None:
            q_in["experts"], d_in["experts"] = expert_ids(batch)
        enc = functools.partial(encode, one_expert=single_task)
        eq = gradcache.encode_chunked(enc, params, q_in, chunk, kq)
        ed = gradcache.encode_chunked(enc, params, d_in, None if chunk is None else chunk * K, kd)
        b = eq.shape[0]
        pos = layout_pos_index(b, K)
        t = batch["temperature"]
        temp = jnp.where(jnp.isnan(t), default_temp, t)
        ci = CandidateInfo(batch["doc_valid"], batch["doc_hash"], jnp.repeat(batch["task_id"], K))
        qi = QueryInfo(pos_hash=batch["doc_hash"][::K], task=batch["task_id"], hash=batch["query_hash"])
        weights = batch["weight"]
        if sharded_loss is not None:
            loss, metrics = sharded_loss(eq, ed, pos, weights, qi, ci, peg_t, temp)
        else:
            kw = dict(temperature=temp, weights=weights, qi=qi, ci=ci, opts=opts, symmetric=c.loss.symmetric,
                      peg_t_prev=peg_t, peg_alpha=c.loss.peg_alpha, peg_beta=c.loss.peg_beta, terms_fn=terms_fn)
            if dims:
                loss, metrics = matryoshka_loss(eq, ed, pos, dims=dims, dim_weights=dim_ws, **kw)
            else:
                loss, metrics = contrastive_loss(eq, ed, pos, **kw)
        if inject:  # a real non-finite step: loss and every gradient NaN (nan * dloss), as a bf16 overflow gives
            bad = jnp.any(jnp.asarray(inject) == batch["step"])
            loss = loss * jnp.where(bad, jnp.nan, 1.0)
        return loss, metrics

    def step(state, batch, single_task=False):
        """single_task (static): every row of the batch has one task (MoTE: one expert per encode call)."""
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], batch, key,
                                                                           state["peg_t"], single_task)
        gnorm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        extra = {}
        if routes is not None:  # only the routed experts are updated (jaxembed.optim.routed_adamw)
            from jaxembed import mote

            extra["active"] = mote.active_experts(num_experts, *expert_ids(batch))
        updates, new_opt = run.tx.update(grads, state["opt_state"], state["params"], **extra)
        new_params = optax.apply_updates(state["params"], updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
        peg_t = metrics.get("peg_t", state["peg_t"])
        new_state = {  # a skipped step changes nothing but the counters (the schedule's too: lr = schedule(step))
            "params": keep(new_params, state["params"]),
            "opt_state": optim.keep_unless(ok, new_opt, state["opt_state"]),
            "step": state["step"] + 1,
            "rng": state["rng"],
            "peg_t": jnp.where(ok, peg_t, state["peg_t"]),
            "nonfinite": jnp.where(ok, 0, state["nonfinite"] + 1),
            "skipped": state["skipped"] + (~ok).astype(jnp.int32),
        }
        out = {k: v for k, v in metrics.items()}
        out.update(loss=loss, grad_norm=gnorm, lr=run.schedule(state["step"]), ok=ok, temperature=temp_of(batch))
        return new_state, out

    def temp_of(batch):
        t = batch["temperature"]
        return jnp.where(jnp.isnan(t), default_temp, t)

    return jax.jit(step, donate_argnums=(0,), static_argnames=("single_task",))


# --------------------------------------------------------------------------------------------------- loop


class _Signals:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and exits at the next step boundary."""

    def __init__(self):
        self.received: int | None = None
        self._old = {}

    def __enter__(self):
        for s in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)


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


def export_params(run: Run, params, out_dir: Path) -> Path:
    from jaxembed import export as exportlib

    model = nnx.merge(run.graphdef, jax.device_get(params), run.rest)
    return exportlib.export(model, run.loaded.tokenizer, out_dir, hf_config=run.loaded.hf_config,
                            prompts={**run.loaded.st.prompts, **task_prompts(run.store)},
                            similarity_fn_name=run.loaded.st.similarity_fn_name)


def _host_metrics(pending: list, run: Run, t_start: float, flops_per_step: list) -> tuple[dict, list]:
    """Fetch the metrics of the pending steps (waits for them: the only host sync of the loop) and average them;
    throughput is measured up to the moment the last step's results arrived."""
    fetched = jax.device_get([m for _, m, _ in pending])
    elapsed = max(time.time() - t_start, 1e-9)
    rows = []
    agg: dict[str, float] = {}
    for (step, _, host), m in zip(pending, fetched):
        rows.append((step, bool(m["ok"]), host))
        for k, v in m.items():
            if k != "ok":
                agg[k] = agg.get(k, 0.0) + float(v)
    n = len(pending)
    out = {k: v / n for k, v in agg.items()}
    out["skipped"] = sum(1 for _, ok, _ in rows if not ok)
    ex = sum(h["examples"] for _, _, h in pending)
    tok = sum(h["tokens"] for _, _, h in pending)
    out.update(examples_per_s=ex / elapsed, tokens_per_s=tok / elapsed, step_time_s=elapsed / n)
    peak = flopslib.peak_flops_per_device()
    if peak:
        out["mfu"] = sum(flops_per_step) / elapsed / (peak * jax.device_count())
    return out, rows


def train(config, workdir: str | Path) -> dict:
    """Run (or resume) training; returns a summary dict. Raises UserError for bad input before any work."""
    run = setup(config, workdir)
    c = run.config
    workdir = run.workdir
    is_main = jax.process_index() == 0
    ckpt = Checkpointer(workdir / "checkpoints", keep_last=c.train.keep_checkpoints,
                        best_metric=c.eval.best_metric, best_mode=c.eval.best_mode,
                        async_save=c.train.async_checkpoints)
    state = init_state(run)
    start = ckpt.latest_step() or 0
    if start:
        state = ckpt.restore(start, state)
        log.info("resumed from %s at step %d", workdir / "checkpoints", start)
    total = run.plan.steps
    monitor = Monitor(workdir, total, start, progress=c.train.progress, is_main=is_main)
    if start:
        monitor.message(f"resuming at step {start} of {total} from {workdir / 'checkpoints'}")
    step_fn = make_train_step(run)
    from jaxembed.data.pipeline import batch_stats, cached_step_lengths, make_loader, to_global

    lengths = cached_step_lengths(run.store, run.plan, run.loaded.tokenizer, workdir / "plan_lengths.npz")
    if c.train.length_buckets == "pow2":  # fewer shapes, fewer compilations, a little more padding
        lengths = tuple(pow2_lengths(x) for x in lengths)
    loader = make_loader(run.store, run.plan, run.loaded.tokenizer, process_index=jax.process_index(),
                         process_count=jax.process_count(), start_step=start, workers=c.train.loader_workers,
                         lengths=lengths, num_candidates=run.K)
    rows_sharding = parallel.batch_sharding(run.mesh)
    evaluator = make_evaluator(run)
    if evaluator and c.eval.before and start == 0:
        monitor.log(0, evaluator(state["params"]), prefix="eval")
    pending, flops_per_step = [], []
    consecutive, first_bad = 0, None
    last_save_time = time.time()
    t_interval = time.time()
    status = "completed"
    best, best_value = None, None  # best dev step of this invocation (Orbax keeps its checkpoint)
    step = start
    try:
        with _Signals() as sig, loader:
            for step in range(start, total):
                host_batch = next(loader)
                batch = to_global(host_batch, rows_sharding)
                if run.routes is not None:  # MoTE: a one-task batch takes the one-expert-per-call path
                    state, m = step_fn(state, batch, single_task=bool(run.plan.task_ids[step] >= 0))
                else:
                    state, m = step_fn(state, batch)
                hs = batch_stats(host_batch)
                hs["task"] = int(run.plan.task_ids[step]) if hasattr(run.plan, "task_ids") else -1
                pending.append((step, m, hs))
                flops_per_step.append(flopslib.train_step_flops(
                    run.loaded.model.config, host_batch["query_input_ids"].shape[0] * jax.process_count(),
                    host_batch["query_input_ids"].shape[1],
                    host_batch["doc_input_ids"].shape[0] * jax.process_count(),
                    host_batch["doc_input_ids"].shape[1], run.loaded.model.dim, bool(c.train.gradcache_chunk)))
                monitor.advance()
                done = step + 1
                last = done == total
                if done % c.train.log_every == 0 or last or sig.received is not None:
                    metrics, rows = _host_metrics(pending, run, t_interval, flops_per_step)
                    monitor.log(done, metrics)
                    for s, ok, h in rows:
                        if ok:
                            consecutive, first_bad = 0, None
                            continue
                        consecutive += 1
                        first_bad = s if first_bad is None else first_bad
                        if c.train.max_nonfinite and consecutive >= c.train.max_nonfinite:
                            raise TrainingStopped(_nonfinite_message(run, s, first_bad, consecutive, h["task"]))
                    pending, flops_per_step = [], []
                    t_interval = time.time()
                eval_metrics = None
                if evaluator and c.eval.every and (done % c.eval.every == 0 or last):
                    eval_metrics = evaluator(state["params"])
                    monitor.log(done, eval_metrics, prefix="eval")
                    value = eval_metrics.get(c.eval.best_metric) if c.eval.best_metric else None
                    if value is None and c.eval.best_metric:
                        raise UserError(f"config.eval.best_metric = {c.eval.best_metric!r} is not among the dev "
                                        f"metrics: {', '.join(sorted(eval_metrics))}")
                    if value is not None and math.isfinite(value) and (
                            best_value is None or (value > best_value if c.eval.best_mode == "max"
                                                   else value < best_value)):
                        best, best_value = done, value
                    t_interval = time.time()
                due = (c.train.checkpoint_every and done % c.train.checkpoint_every == 0) or last or (
                    c.train.checkpoint_minutes and time.time() - last_save_time >= 60 * c.train.checkpoint_minutes)
                if due or sig.received is not None:
                    ckpt.save(done, state, eval_metrics)
                    last_save_time = time.time()
                if sig.received is not None:
                    status = "preempted"
                    ckpt.wait()
                    monitor.message(f"signal {sig.received}: checkpoint saved at step {done}; run the same command "
                                    "to resume")
                    break
            ckpt.wait()
    finally:
        ckpt.close()
        monitor.close()
    summary = {"status": status, "step": int(jax.device_get(state["step"])),
               "skipped": int(jax.device_get(state["skipped"])), "workdir": str(workdir), "best_step": best}
    if status == "completed" and c.export.at_end and is_main:
        out_dir = Path(c.export.dir) if c.export.dir else workdir / "export"
        summary["export"] = str(export_params(run, state["params"], out_dir))
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n") if is_main else None
    return summary


def pow2_lengths(lengths: np.ndarray, smallest: int = 16) -> np.ndarray:
    """Round each step's longest text up to a power of two (>= smallest): the loader then pads to one of
    16 / 32 / 64 / ... (or the maximum length), so a run compiles its step for a handful of shapes."""
    x = np.maximum(np.asarray(lengths), smallest)
    return (2 ** np.ceil(np.log2(x))).astype(np.int32)


def _nonfinite_message(run: Run, step: int, first: int, count: int, task: int) -> str:
    names = getattr(run.plan, "task_names", None)
    task_name = names[task] if names is not None and 0 <= task < len(names) else "mixed"
    return (f"step {step}: {count} non-finite losses or gradients in a row (from step {first}; task "
            f"'{task_name}'); the updates were skipped. Fix: lower optim.lr or raise loss.temperature, use "
            "model.dtype=float32, or check that task's data")


def make_evaluator(run: Run):
    """A callable params -> {"Task/metric": value} on the configured dev tasks, or None."""
    c = run.config
    if not c.eval.tasks:
        return None
    from jaxembed import evaluate as evallib
    from jaxembed.encode import Encoder

    enc = Encoder(run.loaded.model, run.loaded.tokenizer, run.loaded.st.prompts)  # compiled once, weights swapped

    def evaluator(params):
        enc.set_model(nnx.merge(run.graphdef, params, run.rest))
        res = evallib.evaluate(enc, list(c.eval.tasks), max_examples=c.eval.max_examples or None, progress=False)
        return {f"{task}/{k}": float(v) for task, scores in res.items() for k, v in scores.items()
                if isinstance(v, (int, float))}

    return evaluator


def export_from_workdir(workdir: str | Path, out: str | Path, step: int | None = None, *, task: str | None = None,
                        average_experts: bool = False) -> Path:
    """Export a checkpoint of a run (the latest, or ``step``) as a HF / sentence-transformers folder.

    MoTE runs: the full export (every expert), or with ``task`` the plain dense folder of that task's expert, or
    with ``average_experts`` the expert-averaged dense folder (MoTE App. B)."""
    if task is not None and average_experts:
        raise UserError("export: give --task or --average-experts, not both")
    workdir = Path(workdir)
    cfg_file = workdir / "config.json"
    if not cfg_file.exists():
        raise UserError(f"{workdir}: not a jaxembed run directory (no config.json)")
    config = cfglib.from_json(cfg_file.read_text())
    run = setup(config, workdir)
    ckpt = Checkpointer(workdir / "checkpoints", async_save=False)
    steps = ckpt.all_steps()
    if not steps:
        raise UserError(f"{workdir / 'checkpoints'}: no checkpoint to export")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise UserError(f"--step {step}: no such checkpoint (have: {', '.join(map(str, steps))})")
    state = ckpt.restore(step, init_state(run))
    ckpt.close()
    if task is None and not average_experts:
        return export_params(run, state["params"], Path(out))
    from jaxembed import export as exportlib

    model = nnx.merge(run.graphdef, jax.device_get(state["params"]), run.rest)
    kw = dict(hf_config=run.loaded.hf_config, prompts={**run.loaded.st.prompts, **task_prompts(run.store)},
              similarity_fn_name=run.loaded.st.similarity_fn_name)
    if task is not None:
        return exportlib.export_expert(model, run.loaded.tokenizer, Path(out), task, **kw)
    return exportlib.export_averaged(model, run.loaded.tokenizer, Path(out), **kw)
