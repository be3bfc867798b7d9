"""The train step: ``make_train_step(run)`` builds the jitted ``step(state, batch) -> (state, metrics)`` of a run
(jaxembed.train.run.Run), with its loss function: the batch encoded (jaxembed.train.encode: padded or packed
rows, the gradient cache, MoTE's experts), each row's loss (jaxembed.losses.objective, Matryoshka, the GIST guide's
mask), the gradients, the optimizer update (jaxembed.runs.optim), and a non-finite step skipped (the state unchanged
but its counters). The train state is described in jaxembed.train.

Read top to bottom: ``step_facts`` (what the step reads from the run, fixed when it is built), ``embed`` /
``expert_ids`` / ``guide_embeddings`` (the encoders), ``row_infos`` and ``loss_fn`` (the loss), ``train_step`` and
``kept_state`` (gradients, update, skip), ``make_train_step`` (jit).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxembed import parallel
from jaxembed.runs import optim
from jaxembed.train import encode as train_encode
from jaxembed.losses import CandidateInfo, LossOptions, QueryInfo, layout_pos_index, tiled_terms
from jaxembed.losses.infonce import contrastive_loss, query_terms
from jaxembed.losses.matryoshka import matryoshka_loss

if TYPE_CHECKING:
    from jaxembed.train.run import Run


def make_contrastive_path(objective, path, mesh) -> Callable:
    """The run's contrastive path (``path``: its ``jaxembed.losses.parts.contrastive.ContrastiveSettings``):
    path(qi, ci, peg_t, temperature) -> contrastive(q, c, pos_index, weights, kind) -> (loss, metrics), the callable
    the objective's contrastive losses call, plain or tiled, under jit or shard_map, each kind with its own variant
    (its settings' ``contrastive_path``: PEG's weights)."""
    kinds = objective.contrastive
    terms_fn = tiled_terms(path.block_q, path.block_c) if path.tiled else query_terms
    variant = {k: objective.settings_of(k).contrastive_path() for k in kinds}
    opts = {k: LossOptions(same_task=path.same_task_mask, **variant[k][0]) for k in kinds}
    path_kw = {k: dict(symmetric=path.symmetric, **variant[k][1]) for k in kinds}
    sharded_loss = {k: parallel.shard_map_loss(mesh, terms_fn=terms_fn, opts=opts[k], **path_kw[k])
                    for k in kinds} if path.impl == "shard_map" else None

    def bind(qi, ci, peg_t, temp):
        def contrastive(q, d, pos_, w, kind):
            if sharded_loss is not None:
                return sharded_loss[kind](q, d, pos_, w, qi, ci, peg_t, temp)
            return contrastive_loss(q, d, pos_, temperature=temp, weights=w, qi=qi, ci=ci, opts=opts[kind],
                                    peg_t_prev=peg_t, terms_fn=terms_fn, **path_kw[kind])

        return contrastive

    return bind


@dataclasses.dataclass(frozen=True, eq=False)
class StepFacts:
    """What the step's pieces read from the run, fixed when the step is built: the loss setup
    (jaxembed.train.loss), MoTE's routes, the gradient cache's chunk, the packed rows' sub-tokens, the injected
    non-finite steps (a test's fault), the mesh."""

    run: Any
    K: int
    objective: Any
    kind_table: np.ndarray
    guide: tuple | None
    gist: Any
    mrl: Any
    chunk: int | None
    default_temp: float
    routes: tuple | None
    num_experts: int
    inject: tuple
    contrastive_path: Callable
    sub_tokens: tuple


def step_facts(run: Run) -> StepFacts:
    """The StepFacts of a run (its loss setup built here: the data checks that need the store run now)."""
    from jaxembed.train.loss import make_loss_setup

    c = run.config
    setup_ = make_loss_setup(run)
    routes = None if run.routes is None else tuple(np.asarray(r, np.int32) for r in run.routes)
    if run.packing is not None and run.packing.combined and routes is not None:
        assert np.array_equal(routes[0], routes[1]), "a combined pack needs the same query and document experts"
    return StepFacts(
        run=run, K=run.K, objective=setup_.objective, kind_table=setup_.kind_of_dataset, guide=setup_.guide,
        gist=setup_.settings["gist"], mrl=setup_.settings["matryoshka"], chunk=c.train.gradcache_chunk or None,
        default_temp=float(c.loss.temperature), routes=routes,
        num_experts=run.loaded.model.config.mote.num_experts if routes is not None else 0,
        inject=tuple(int(s) for s in c.train.inject_nonfinite_steps),
        contrastive_path=make_contrastive_path(setup_.objective, setup_.settings["contrastive"], run.mesh),
        sub_tokens=run.packing.sub_tokens if run.packing is not None else (0, 0))


def embed(f: StepFacts, merge, params, batch, keys=(None, None), experts=(None, None), one_expert=False):
    """Queries [B, D] and candidates [B*K, D] of a padded or packed batch (jaxembed.train.encode); one_expert:
    every row has the same expert (MoTE's fast path, jaxembed.mote)."""
    return train_encode.embed_batch(merge, params, batch, K=f.K, mesh=f.run.mesh, keys=keys, experts=experts,
                                    one_expert=one_expert, chunk=f.chunk, sub_tokens=f.sub_tokens)


def expert_ids(f: StepFacts, batch):
    """MoTE: the expert of each query [B] and each candidate [B * K], by the row's task (MoTE 3.1)."""
    t = batch["task_id"]
    return jnp.asarray(f.routes[0])[t], jnp.repeat(jnp.asarray(f.routes[1])[t], f.K)


def guide_embeddings(f: StepFacts, guide_params, batch):
    """GIST: the frozen guide's embeddings of the queries [B, G] and candidates [B*K, G] (no gradient)."""
    gq, gd = embed(f, lambda p: nnx.merge(f.guide[0], p), guide_params, batch)
    return jax.lax.stop_gradient(gq), jax.lax.stop_gradient(gd)


def temperature(f: StepFacts, batch):
    """Each row's temperature: its dataset's, else the run's ``loss.temperature`` (NaN in the batch)."""
    t = batch["temperature"]
    return jnp.where(jnp.isnan(t), f.default_temp, t)


def row_infos(f: StepFacts, batch, pos, guide_emb):
    """(queries' info, candidates' info, each row's loss kind or None) for the losses' masks; GIST: candidates
    the guide finds as close as the positive are masked."""
    from jaxembed.losses import objective as objlib
    from jaxembed.losses.gist import guide_infos

    row_kind = jnp.asarray(f.kind_table)[batch["dataset_id"]] if f.objective.mixed else None
    valid = objlib.candidate_valid(f.objective, batch["doc_valid"], row_kind, f.K)  # scored rows: no candidates
    ci = CandidateInfo(valid, batch["doc_hash"], jnp.repeat(batch["task_id"], f.K))
    qi = QueryInfo(pos_hash=batch["doc_hash"][::f.K], task=batch["task_id"], hash=batch["query_hash"])
    if guide_emb is not None:
        gq, gc, limit = guide_infos(guide_emb[0], guide_emb[1], pos, f.gist.margin, f.gist.margin_strategy)
        qi, ci = qi._replace(guide=gq, guide_limit=limit), ci._replace(guide=gc)
    return qi, ci, row_kind


def loss_fn(f: StepFacts, params, batch, key, peg_t, single_task=False, guide_emb=None, frozen=None):
    """The batch's loss and metrics: each row's loss kind (jaxembed.losses.objective), Matryoshka when configured,
    distillation's teacher scores, the injected non-finite steps."""
    from jaxembed.losses import objective as objlib

    c = f.run.config
    # one dropout key for both sides: every text of the step has its own id (jaxembed.train.encode)
    kq = kd = key if c.train.dropout else None
    experts = expert_ids(f, batch) if f.routes is not None else (None, None)
    base = f.run.rest if frozen is None else frozen  # LoRA: the frozen base weights come in as an input
    eq, ed = embed(f, lambda p: nnx.merge(f.run.graphdef, p, base), params, batch, (kq, kd), experts, single_task)
    b = eq.shape[0]
    pos = layout_pos_index(b, f.K)
    temp = temperature(f, batch)
    qi, ci, row_kind = row_infos(f, batch, pos, guide_emb)
    kw = dict(objective=f.objective, contrastive=f.contrastive_path(qi, ci, peg_t, temp), weights=batch["weight"],
              temperature=temp, row_kind=row_kind,
              teacher=batch["teacher_score"].reshape(b, f.K) if f.objective.distill != "none" else None,
              cand_valid=batch["doc_valid"], pair_score=batch["pair_score"] if f.objective.others else None,
              peg_t_prev=peg_t)
    if f.mrl.dims:
        loss, metrics = matryoshka_loss(eq, ed, pos, dims=f.mrl.dims, dim_weights=f.mrl.weights,
                                        loss_fn=objlib.total_loss, **kw)
    else:
        loss, metrics = objlib.total_loss(eq, ed, pos, **kw)
    if f.inject:  # a real non-finite step: loss and every gradient NaN (nan * dloss), as a bf16 overflow gives
        bad = jnp.any(jnp.asarray(f.inject) == batch["step"])
        loss = loss * jnp.where(bad, jnp.nan, 1.0)
    return loss, metrics


def kept_state(state, ok, new_params, new_opt, peg_t) -> dict:
    """The state after the step: a skipped step (``ok`` false) changes nothing but the counters (the schedule's
    too: lr = schedule(step))."""
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
    return {
        "params": keep(new_params, state["params"]),
        "opt_state": optim.keep_unless(ok, new_opt, state["opt_state"]),
        "step": state["step"] + 1,
        "rng": state["rng"],
        "peg_t": jnp.where(ok, peg_t, state["peg_t"]),
        "nonfinite": jnp.where(ok, 0, state["nonfinite"] + 1),
        "skipped": state["skipped"] + (~ok).astype(jnp.int32),
    }


def train_step(f: StepFacts, state, batch, single_task=False, guide_params=None, frozen=None):
    """single_task (static): every row of the batch has one task (MoTE: one expert per encode call);
    guide_params: the GIST guide's (frozen: an input, not in the optimizer); frozen: LoRA's base weights (an
    input, not a constant baked into the program; never differentiated)."""
    run = f.run
    key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
    guide_emb = None if guide_params is None else guide_embeddings(f, guide_params, batch)
    (loss, metrics), grads = jax.value_and_grad(functools.partial(loss_fn, f), has_aux=True)(
        state["params"], batch, key, state["peg_t"], single_task, guide_emb, frozen)
    gnorm = optax.global_norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
    extra = {}
    if f.routes is not None:  # only the routed experts are updated (jaxembed.runs.optim.routed_adamw)
        from jaxembed import mote

        extra["active"] = mote.active_experts(f.num_experts, *expert_ids(f, batch))
    updates, new_opt = run.tx.update(grads, state["opt_state"], state["params"], **extra)
    new_params = optax.apply_updates(state["params"], updates)
    new_state = kept_state(state, ok, new_params, new_opt, metrics.get("peg_t", state["peg_t"]))
    out = {k: v for k, v in metrics.items()}
    out.update(loss=loss, grad_norm=gnorm, lr=run.schedule(state["step"]), ok=ok, temperature=temperature(f, batch))
    return new_state, out


def make_train_step(run: Run) -> Callable:
    """step(state, batch, single_task=False) -> (state, metrics), jitted (``train_step`` on the run's StepFacts).
    The batch's loss: each row follows its dataset's loss kind (jaxembed.losses.objective; jaxembed.train.loss says
    how that stays static under jit), with distillation and the GIST guide's mask when configured."""
    f = step_facts(run)

    def step(state, batch, single_task=False, guide_params=None, frozen=None):
        return train_step(f, state, batch, single_task, guide_params, frozen)

    jitted = jax.jit(step, donate_argnums=(0,), static_argnames=("single_task",))
    fixed = {} if f.guide is None else {"guide_params": f.guide[1]}
    if run.lora is not None:  # the frozen base weights (run.rest, placed on the mesh by setup), as plain arrays:
        fixed["frozen"] = nnx.to_pure_dict(run.rest)  # merge makes their variables in the trace (nnx.remat needs it)
    return functools.partial(jitted, **fixed) if fixed else jitted
