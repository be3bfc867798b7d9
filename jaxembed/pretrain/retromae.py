"""RetroMAE pre-training job: ``jaxembed pretrain retromae --config retromae[:tiny] --workdir DIR``.

Flow: config -> validate -> texts (JSON Lines / text files or a store; deduplicated, tokenized once) -> the
RetroMAE model (any BERT-family checkpoint jaxembed imports, or a random config with that checkpoint's
tokenizer) -> length-bucketed batches -> jitted step (both corruptions drawn inside the step from the run's
key and the step number) -> AdamW with warm-up -> Orbax checkpoints -> export of the ENCODER as a Hugging Face /
sentence-transformers folder, which ``jaxembed train`` starts from (``model.name`` = that folder).

The run directory holds config.json / config.txt (resolved config), data_report.json, metrics.jsonl,
tensorboard/, checkpoints/, export/ and summary.json. Rerunning the same command resumes from the latest
checkpoint: the batch of a step is a pure function of the data, the seed and the step, and so are the masks,
so a resumed run reproduces an uninterrupted one. SIGTERM / SIGINT save a checkpoint and stop (exit 143).

The config (``default_config``, ``validate``) is ``jaxembed.pretrain.config``, re-exported here.

Train state (one pytree): params (encoder, encoder_head, decoder, decoder_head), opt_state, step, rng (raw key
data), nonfinite (consecutive skipped updates), skipped (total).

Its loop is its own, not jaxembed.train.loop: that loop runs a contrastive Run (dataset store, batch plan, Grain
loader, dev evaluation, pods) and none of it applies to one host masking raw texts; the parts that do apply are
shared (jaxembed.train: checkpoints, monitor, signals, optim; the run lock; the export's folder rules).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import loading, models, parallel
from jaxembed.runs import atomic_files
from jaxembed.config import io as config_io
from jaxembed.runs import compile_cache, optim
from jaxembed.runs.checkpoints import Checkpointer
from jaxembed.errors import UserError
from jaxembed.runs.monitor import Monitor
from jaxembed.runs.rundir import RunDir, rundir
from jaxembed.pretrain import data as datalib
from jaxembed.pretrain.config import DEFAULT_FIELDS, config_error, default_config, validate  # noqa: F401 (re-exported)
from jaxembed.pretrain.model import (BERT_FAMILY, RetroMAE, build_retromae, copy_head, load_mlm_head,
                                     retromae_loss)
from jaxembed.runs.signals import StopSignals
from jaxembed.tokenizer import Tokenizer

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------ set-up

@dataclasses.dataclass
class Run:
    config: Any
    workdir: Path
    mesh: Any
    model: RetroMAE
    tokenizer: Tokenizer
    hf_config: dict
    corpus: datalib.Corpus
    schedule: datalib.BatchSchedule
    buckets: tuple
    graphdef: Any
    rest: Any
    tx: Any
    lr_schedule: Callable
    special_ids: tuple
    mask_id: int
    notes: list
    pack_length: int = 0                    # data.packing: the encoder's packed row length (0 = padded rows)
    pack_rows: np.ndarray | None = None     # its rows per device of every step


_RESUME_KEYS = ("model", "data", "retromae", "optim")


def _check_workdir(config, rd: RunDir) -> None:
    prev = rd.config_json
    if not prev.exists():
        return
    old, new = json.loads(prev.read_text()), json.loads(cfglib.to_json(config))
    old.setdefault("data", {}).setdefault("packing", True)  # a run config without data.packing: the default
    keys = _RESUME_KEYS + tuple(f"train.{k}" for k in ("seed", "batch_size", "steps", "dropout"))
    diffs = config_io.config_differences(old, new, keys)
    if diffs:
        raise UserError(f"{rd.root} holds a run with a different config: {config_io.describe_differences(diffs)} "
                        "(the run's value -> this command's). Resuming needs the same config (fix: use a new "
                        f"--workdir, or the run's own settings, in {prev})")


def _encoder(c, notes: list) -> tuple[Any, Tokenizer, dict, dict | None]:
    """(pretrained BertModel, or the BertConfig of a random one; tokenizer; hf config for the export; checkpoint
    tensors or None)."""
    kw = dict(dtype=c.model.dtype, param_dtype=c.model.param_dtype, remat=c.model.remat)
    if c.model.init == "pretrained":
        loaded = loading.load(c.model.name, max_length=c.model.max_length, **kw)
        backbone = loaded.model.backbone
        if backbone.config.model_type not in BERT_FAMILY:
            raise UserError(f"model.name {c.model.name}: model_type {backbone.config.model_type!r} is not in the "
                            f"BERT family ({', '.join(BERT_FAMILY)}); RetroMAE here needs a BERT-style encoder")
        tensors, _ = loading.read_weights(loaded.st.transformer_dir)
        notes.append(f"encoder: {c.model.name} ({backbone.config.model_type}, {backbone.config.num_layers} layers, "
                     f"hidden {backbone.config.hidden_size})")
        return backbone, loaded.tokenizer, loaded.hf_config, tensors
    folder = loading.resolve(c.model.name)
    st = loading.read_sentence_transformers(folder)
    cfg_file = st.transformer_dir / "config.json"
    try:
        base = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"model.name {c.model.name}: cannot read {cfg_file} ({e})") from None
    if base.get("model_type") not in BERT_FAMILY:
        raise UserError(f"model.name {c.model.name}: model_type {base.get('model_type')!r} is not in the BERT family "
                        f"({', '.join(BERT_FAMILY)})")
    hf_cfg = {**base, **dict(c.model.overrides)}
    try:
        config = models.config_from_hf(hf_cfg, where=f"{c.model.name} + model.overrides", **kw)
    except (TypeError, ValueError) as e:
        raise UserError(f"model.overrides: {e}") from None
    limit = config.max_position_embeddings - (config.pad_token_id + 1 if config.offset_positions else 0)
    if c.model.max_length > limit:
        raise config_error("model.max_length", c.model.max_length, f"<= {limit} (max_position_embeddings of the model)")
    tok = Tokenizer.from_folder(st.transformer_dir, c.model.max_length, lowercase=st.do_lower_case)
    notes.append(f"encoder: random {config.model_type}, {config.num_layers} layers, hidden {config.hidden_size} "
                 f"(tokenizer of {c.model.name})")
    return config, tok, hf_cfg, None


def setup(config, rd: str | Path | RunDir, *, progress: bool | None = None,
          lock: Any = None) -> Run:
    """Validate, read and tokenize the texts, build the model and the optimizer; then (``lock`` taken first: one
    run per run directory) write the run's config. Nothing is written before every check has passed. ``rd``: the
    run directory, as a path or its RunDir."""
    from jaxembed import pod

    rd = rundir(rd)

    pod.single_host_only("jaxembed pretrain retromae")  # before any JAX call: one line, no hang
    validate(config)
    workdir = rd.root
    _check_workdir(config, rd)
    if config.export.at_end:
        from jaxembed.export import check_target

        check_target(_export_dir(config, rd), "config.export.dir", workdir=rd)
    c = config
    notes: list[str] = []
    encoder, tok, hf_cfg, tensors = _encoder(c, notes)
    enc_cfg = encoder.config if tensors is not None else encoder
    if tok.hf.mask_token_id is None:
        raise UserError(f"model.name {c.model.name}: the tokenizer has no mask token (RetroMAE needs [MASK])")
    if len(tok.hf) > enc_cfg.vocab_size:
        raise UserError(f"model.name {c.model.name}: the tokenizer has {len(tok.hf)} tokens, the model's vocab_size "
                        f"is {enc_cfg.vocab_size}")
    model = build_retromae(enc_cfg, c.retromae.decoder_layers, c.train.seed,
                           encoder if tensors is not None else None)
    where = load_mlm_head(model.encoder_head, tensors, c.model.name) if tensors is not None else None
    if where:
        notes.append(f"MLM head: loaded from the checkpoint ({where}.*); the decoder head starts as a copy of it")
    else:
        notes.append("MLM head: the checkpoint has none, so it was initialised (normal(0.02), zero bias); the "
                     "decoder head starts as a copy of it")
    copy_head(model.encoder_head, model.decoder_head)
    notes.append(f"decoder: {c.retromae.decoder_layers} BERT layer(s), randomly initialised")

    texts, rep = datalib.read_texts(tuple(c.data.paths), tuple(c.data.fields), c.data.store, c.data.max_texts,
                                    c.data.dedup)
    corpus, trep = datalib.tokenize(texts, tok, c.model.max_length, c.data.min_tokens, progress=progress)
    schedule = datalib.BatchSchedule(corpus.lengths, c.train.batch_size, c.train.seed, c.data.bucket_window)
    ndev = jax.local_device_count()
    if c.train.batch_size % ndev:
        raise config_error("train.batch_size", c.train.batch_size, f"a multiple of the {ndev} local devices")
    report = {"read": rep, "tokenized": trep, "batches_per_epoch": schedule.per_epoch,
              "texts_left_per_epoch": len(corpus) - schedule.per_epoch * c.train.batch_size,
              "epochs": round(c.train.steps / schedule.per_epoch, 3)}
    if lock is not None:
        lock.acquire()
    workdir.mkdir(parents=True, exist_ok=True)
    cfglib.write_resolved(config, rd)
    atomic_files.write_json(rd.data_report_json, report)
    notes.append(f"data: {len(corpus)} texts ({rep['records']} records read, {rep['duplicates']} duplicates, "
                 f"{sum(rep['skipped'].values())} skipped, {trep['too_short']} shorter than {c.data.min_tokens} "
                 f"tokens), {trep['tokens']} tokens; {schedule.per_epoch} batches per epoch, "
                 f"{report['epochs']} epochs; report: {rd.data_report_json}")

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    pure = nnx.to_pure_dict(params)
    warmup = c.optim.warmup_steps if c.optim.warmup_steps >= 0 else int(c.optim.warmup_ratio * c.train.steps)
    freeze = ("^encoder\\.pooler\\.",) if getattr(enc_cfg, "add_pooler", False) else ()
    tx, sched = optim.make_optimizer(
        pure, lr=c.optim.lr, total_steps=c.train.steps, warmup_steps=warmup, schedule_kind=c.optim.schedule,
        weight_decay=c.optim.weight_decay, b1=c.optim.b1, b2=c.optim.b2, eps=c.optim.eps,
        grad_clip=c.optim.grad_clip, freeze=freeze, end_factor=c.optim.end_factor)
    special = tuple(sorted(set(tok.hf.all_special_ids)))
    buckets = datalib.buckets_for(c.data.length_buckets, c.model.max_length)
    pack_length, pack_rows = 0, None
    if c.data.get("packing", True):
        pack_length, pack_rows = datalib.packed_shapes(schedule, int(c.train.steps), ndev, buckets,
                                                       hidden_size=int(enc_cfg.hidden_size))
        notes.append(f"packing: the encoder runs on rows of {pack_length} tokens, "
                     f"{len(set(pack_rows.tolist()))} row count(s) per device")
    return Run(c, workdir, parallel.make_mesh(), model, tok, hf_cfg, corpus, schedule, buckets, graphdef, rest, tx,
               sched, special, int(tok.hf.mask_token_id), notes, pack_length, pack_rows)


def init_state(run: Run) -> dict:
    _, params, _ = nnx.split(run.model, nnx.Param, ...)
    pure = nnx.to_pure_dict(params)
    state = {"params": pure, "opt_state": jax.jit(run.tx.init)(pure), "step": jnp.asarray(0, jnp.int32),
             "rng": jax.random.key_data(jax.random.key(run.config.train.seed)),
             "nonfinite": jnp.asarray(0, jnp.int32), "skipped": jnp.asarray(0, jnp.int32)}
    return jax.device_put(state, parallel.replicated(run.mesh))


# --------------------------------------------------------------------------------------------------- step

_STEP_CACHE: dict = {}


def make_train_step(run: Run) -> Callable:
    """jit(state, batch) -> (state, metrics); the state is donated. The jitted function is reused by later runs
    in the same process with the same model structure and settings (a resumed run does not compile again)."""
    key = None
    if not jax.tree.leaves(run.rest):
        c = run.config
        key = (run.model.config, int(c.retromae.decoder_layers), cfglib.to_json(c.retromae), cfglib.to_json(c.optim),
               int(c.train.steps), bool(c.train.dropout), run.special_ids, run.mask_id,
               jax.tree.structure(nnx.to_pure_dict(nnx.split(run.model, nnx.Param, ...)[1])))
        if key in _STEP_CACHE:
            return _STEP_CACHE[key]
    fn = _make_train_step(run)
    if key is not None:
        if len(_STEP_CACHE) >= 4:
            _STEP_CACHE.pop(next(iter(_STEP_CACHE)))
        _STEP_CACHE[key] = fn
    return fn


def _make_train_step(run: Run) -> Callable:
    r = run.config.retromae
    kw = dict(special_ids=run.special_ids, mask_id=run.mask_id, encoder_ratio=float(r.encoder_mask_ratio),
              decoder_ratio=float(r.decoder_mask_ratio), encoder_weight=float(r.encoder_loss_weight),
              decoder_weight=float(r.decoder_loss_weight), p_mask=float(r.mask_prob), p_random=float(r.random_prob),
              dropout=bool(run.config.train.dropout))
    graphdef, rest, tx, sched = run.graphdef, run.rest, run.tx, run.lr_schedule
    mesh = run.mesh

    def loss_fn(params, batch, key):
        model = nnx.merge(graphdef, params, rest)
        pack = {k: v for k, v in batch.items() if k.startswith("pack_")} or None
        return retromae_loss(model, batch["input_ids"], batch["attention_mask"], key, pack=pack, mesh=mesh, **kw)

    def step(state, batch):
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], batch, key)
        gnorm = optax.global_norm(grads)
        ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
        updates, new_opt = tx.update(grads, state["opt_state"], state["params"])
        new_params = optax.apply_updates(state["params"], updates)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
        new_state = {"params": keep(new_params, state["params"]), "opt_state": keep(new_opt, state["opt_state"]),
                     "step": state["step"] + 1, "rng": state["rng"],
                     "nonfinite": jnp.where(ok, 0, state["nonfinite"] + 1),
                     "skipped": state["skipped"] + (~ok).astype(jnp.int32)}
        return new_state, {**metrics, "loss": loss, "grad_norm": gnorm, "lr": sched(state["step"]), "ok": ok}

    return jax.jit(step, donate_argnums=(0,))


def batch_at(run: Run, step: int) -> dict:
    """The host batch of a step (numpy): padded rows, and with data.packing the encoder's packed rows."""
    idx = run.schedule.indices(step)
    batch = datalib.make_batch(run.corpus, idx, run.tokenizer, run.buckets)
    if run.pack_rows is not None:
        batch.update(datalib.encoder_pack([run.corpus.get(int(i)) for i in idx], run.mesh.size,
                                          int(run.pack_rows[step]), run.pack_length))
    return batch


def to_device(run: Run, batch: dict) -> dict:
    """A host batch as arrays split over the local devices (rows over the data axes)."""
    return {k: jax.device_put(v, parallel.batch_sharding(run.mesh, v.ndim)) for k, v in batch.items()}


# --------------------------------------------------------------------------------------------------- loop

def encoder_model(run: Run, params) -> Any:
    """The trained encoder as an EmbeddingModel (export pooling and normalisation) from train-state params."""
    from jaxembed.models.embedding import EmbeddingModel, HeadConfig

    model = nnx.merge(run.graphdef, jax.device_get(params), run.rest)
    return EmbeddingModel(model.encoder, HeadConfig(pooling=run.config.export.pooling,
                                                    normalize=run.config.export.normalize))


def export_encoder(run: Run, params, out_dir: Path) -> Path:
    from jaxembed import export as exportlib

    card = ("---\nlibrary_name: sentence-transformers\ntags:\n- sentence-transformers\n- jaxembed\n- retromae\n---\n\n"
            "# RetroMAE-pre-trained encoder (jaxembed)\n\nThe encoder of a RetroMAE run (masked auto-encoding: "
            f"encoder mask ratio {run.config.retromae.encoder_mask_ratio}, decoder mask ratio "
            f"{run.config.retromae.decoder_mask_ratio}); sentence embedding: `{run.config.export.pooling}` pooling. "
            "Fine-tune it contrastively: `jaxembed train` with `model.name` set to this folder.\n")
    return exportlib.export(encoder_model(run, params), run.tokenizer, out_dir, hf_config=run.hf_config,
                            model_card=card)


def pretrain(config, workdir: str | Path | RunDir, *, max_steps: int | None = None) -> dict:
    """Run (or resume) RetroMAE pre-training; returns the summary. ``max_steps``: stop after this many steps in
    this call (a checkpoint is saved; status 'paused'; rerun to continue)."""
    from jaxembed.runs.workdir_lock import WorkdirLock

    rd = rundir(workdir)
    lock = WorkdirLock(rd)
    try:
        return _pretrain(config, rd, max_steps, lock)
    finally:
        lock.release()


def _export_dir(config, rd: RunDir) -> Path:
    return rd.export_dir(config.export.dir)


def _pretrain(config, rd: RunDir, max_steps: int | None, lock) -> dict:
    c = config
    run = setup(config, rd, progress=c.train.progress, lock=lock)
    workdir = rd.root
    compile_cache.use_for_run(rd, c.train.compile_cache)
    for n in run.notes:
        print(n)
    ckpt = Checkpointer(rd.checkpoints, keep_last=c.train.keep_checkpoints,
                        async_save=c.train.async_checkpoints)
    state = init_state(run)
    start = ckpt.latest_step() or 0
    total = int(c.train.steps)
    if start:
        state = ckpt.restore(start, state)
    monitor = Monitor(rd, total, start, progress=c.train.progress)
    if start:
        monitor.message(f"resuming at step {start} of {total} from {rd.checkpoints}")
    step_fn = make_train_step(run)
    status = "completed"
    pending: list = []
    ex = tok = 0
    consecutive = 0
    t_interval = last_save = time.time()
    stop_at = total if max_steps is None else min(total, start + int(max_steps))
    try:
        with StopSignals() as sig:
            for step in range(start, stop_at):
                host = batch_at(run, step)
                batch = to_device(run, host)
                state, m = step_fn(state, batch)
                pending.append(m)
                ex += host["input_ids"].shape[0]
                tok += int(host["attention_mask"].sum())
                monitor.advance()
                done = step + 1
                end = done == stop_at
                if done % c.train.log_every == 0 or end or sig.received is not None:
                    fetched = jax.device_get(pending)
                    dt = max(time.time() - t_interval, 1e-9)
                    agg = {k: float(np.mean([float(f[k]) for f in fetched])) for k in fetched[0] if k != "ok"}
                    agg.update(skipped=sum(1 for f in fetched if not bool(f["ok"])), examples_per_s=ex / dt,
                               tokens_per_s=tok / dt, step_time_s=dt / len(fetched))
                    monitor.log(done, agg, prefix="pretrain")
                    for f in fetched:
                        consecutive = 0 if bool(f["ok"]) else consecutive + 1
                        if c.train.max_nonfinite and consecutive >= c.train.max_nonfinite:
                            raise UserError(f"step {done}: {consecutive} non-finite losses or gradients in a row; "
                                            "the updates were skipped (fix: lower optim.lr, use float32)")
                    pending, ex, tok, t_interval = [], 0, 0, time.time()
                due = (c.train.checkpoint_every and done % c.train.checkpoint_every == 0) or end or (
                    c.train.checkpoint_minutes and time.time() - last_save >= 60 * c.train.checkpoint_minutes)
                if due or sig.received is not None:
                    ckpt.save(done, state)
                    last_save = time.time()
                if sig.received is not None:
                    status = "preempted"
                    monitor.message(f"signal {sig.received}: checkpoint saved at step {done}; run the same command "
                                    "to resume")
                    break
            ckpt.wait()
    finally:
        ckpt.close()
        monitor.close()
    step_now = int(jax.device_get(state["step"]))
    if status == "completed" and step_now < total:
        status = "paused"
    summary = {"status": status, "step": step_now, "skipped": int(jax.device_get(state["skipped"])),
               "workdir": str(workdir), "notes": run.notes}
    if status == "completed" and c.export.at_end:
        summary["export"] = str(export_encoder(run, state["params"], _export_dir(c, rd)))
    atomic_files.write_json(rd.summary_json, summary)
    return summary
