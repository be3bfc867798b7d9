"""The sentence-transformers runs of the quality comparison (quality_parity.py): ``train_st``, trained exactly like
jaxembed (the plan's batches in order, per-side lengths checked token for token against jaxembed's loader,
jaxembed's two loss masks, the HF Trainer's step written out), with ``loss_agreement`` checking the loss against
jaxembed's InfoNCE before training; and ``train_st_stock``, the stock ``SentenceTransformerTrainer`` on the same
examples."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from .st import PlanBatchSampler, column_features, make_masked_mnrl, plan_rows, stock_datasets, trainer_adamw


def loss_agreement(c, store, plan, loader, st_loss, collator, rows, K: int, doc_cols: list[str]) -> dict:
    """Before training, with dropout off and the same starting weights: ST's loss on a batch vs jaxembed's
    InfoNCE on jaxembed's loader batch of the same step, for the first step, the first step with empty negative
    slots and the first step whose queries share a positive. -> {step: (st, jaxembed)}."""
    import numpy as np
    import torch

    from jaxembed import loading
    from jaxembed.losses import CandidateInfo, QueryInfo, layout_pos_index
    from jaxembed.losses.infonce import contrastive_loss

    G = plan.global_batch_size
    labels = np.array([r["label"] for r in rows]).reshape(plan.steps, G, K + 1)
    empty = np.flatnonzero((labels[:, :, 1:K] < 0).any(axis=(1, 2)))
    shared = np.flatnonzero([len(set(x[:, 0].tolist())) < G for x in labels])
    steps = [0] + [int(a[0]) for a in (empty, shared) if a.size]
    model = loading.load(c.model.name, max_length=c.model.max_length or None).model
    out = {}
    was_training = st_loss.model.training
    st_loss.model.eval()
    for s in dict.fromkeys(steps):
        b = loader.batch(s)
        eq = model(b["query_input_ids"], b["query_attention_mask"], b["query_prompt_length"], deterministic=True)
        ed = model(b["doc_input_ids"], b["doc_attention_mask"], b["doc_prompt_length"], deterministic=True)
        qi = QueryInfo(pos_hash=b["doc_hash"][::K])
        ci = CandidateInfo(b["doc_valid"], b["doc_hash"], None)
        jl, _ = contrastive_loss(eq, ed, layout_pos_index(eq.shape[0], K), temperature=float(c.loss.temperature),
                                 qi=qi, ci=ci)
        batch = collator(rows[s * G:(s + 1) * G])
        labels = batch.pop("label")
        with torch.no_grad():
            sl = float(st_loss(column_features(batch, ["anchor", *doc_cols]), labels))
        out[int(s)] = (sl, float(jl))
    st_loss.model.train(was_training)
    return out


def train_st(c, seed: int, rundir: Path, st_loss: str = "masked", st_threads: int = 1) -> dict:
    """One sentence-transformers run trained exactly like jaxembed (quality_parity.py's docstring) on the plan of the
    run config ``c`` (``seed``: the dropout stream), with ``st_loss`` 'masked' (``make_masked_mnrl``) or 'plain'
    (ST's MNRL) and ``st_threads`` torch threads (0: torch's default); saves the model to rundir/model."""
    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.data_collator import SentenceTransformerDataCollator
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import set_seed
    from transformers.optimization import get_linear_schedule_with_warmup

    from jaxembed import config as cfglib
    from jaxembed.data.pipeline import make_loader
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.loading import read_sentence_transformers
    from jaxembed.tokenizer import Tokenizer

    store = Store.open(c.data.store)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    jax_plan = rundir.parent / f"jaxembed_base_s{seed}" / "plan.npz"
    if jax_plan.exists():
        from jaxembed.data.plan import Plan

        if Plan.load(jax_plan).fingerprint() != plan.fingerprint():
            raise SystemExit(f"error: the plan differs from {jax_plan}")
    info = read_sentence_transformers(Path(c.model.name))
    if not info.head.include_prompt:
        raise SystemExit("error: this model's pooling excludes prompt tokens; pass the instructions as ST prompts "
                         "(prompt_length) instead of prefixed text")
    tok = Tokenizer.from_folder(info.transformer_dir, c.model.max_length or info.max_seq_length,
                                lowercase=info.do_lower_case)
    if np.isfinite(plan.temperatures).any():
        raise SystemExit("error: the recipe gives some tasks their own temperature; the ST side has one scale "
                         "(run the parity on a recipe without per-dataset temperatures, e.g. configs/demo.py)")
    if "mote" in c.model and c.model.mote.enabled:
        raise SystemExit("error: the ST side has no MoTE; run --tools jaxembed for a MoTE recipe")
    rows, K, Lq, Ld = plan_rows(store, plan, tok)
    loader = make_loader(store, plan, tok)  # jaxembed's batches, to check ST's tokenization against

    if st_threads:
        torch.set_num_threads(st_threads)
    set_seed(seed)  # as the HF Trainer does: dropout stream
    model = SentenceTransformer(c.model.name, device="cpu")
    if not getattr(model[1], "include_prompt", True):
        raise SystemExit("error: the ST Pooling excludes prompt tokens")
    model.max_seq_length = c.model.max_length or model.max_seq_length
    doc_cols = ["positive"] + [f"negative_{j}" for j in range(1, K)]
    lengths = {"anchor": Lq, **{col: Ld for col in doc_cols}}

    class Collator(SentenceTransformerDataCollator):
        """ST's collator, with one max length per column (queries Lq, documents Ld) and a check that every batch
        tokenizes to the very ids of jaxembed's loader batch for the same step."""

        checked = 0

        def _get_task_for_column(self, column_name, column_position, router_mapping):
            self._column = column_name
            return None

        def _get_max_length_for_task(self, task):
            return lengths[self._column]

        def __call__(self, features):
            batch = super().__call__(features)
            step = int(batch["label"][0, -1])
            ref = loader.batch(step)
            pairs = [("anchor", ref["query_input_ids"], ref["query_attention_mask"])]
            pairs += [(col, ref["doc_input_ids"][j::K], ref["doc_attention_mask"][j::K])
                      for j, col in enumerate(doc_cols)]
            for col, rid, rmask in pairs:
                ids, mask = batch[f"{col}_input_ids"].numpy(), batch[f"{col}_attention_mask"].numpy()
                for r in range(ids.shape[0]):
                    a, b = ids[r][mask[r] == 1], rid[r][rmask[r] == 1]
                    if not np.array_equal(a, b):
                        raise SystemExit(f"error: step {step} row {r} column {col}: ST tokens {a.tolist()} != "
                                         f"jaxembed tokens {b.tolist()}")
            Collator.checked += 1
            return batch

    collator = Collator(preprocess_fn=model.preprocess)
    dl = torch.utils.data.DataLoader(rows, batch_sampler=PlanBatchSampler(plan.steps, plan.global_batch_size),
                                     collate_fn=collator)
    scale = 1.0 / float(c.loss.temperature)
    loss_fn = (make_masked_mnrl() if st_loss == "masked" else MultipleNegativesRankingLoss)(model, scale=scale)
    # the HF Trainer's optimizer: AdamW, no weight decay on LayerNorm weights and biases
    opt = trainer_adamw(model, lr=c.optim.lr, weight_decay=c.optim.weight_decay, betas=(c.optim.b1, c.optim.b2),
                        eps=c.optim.eps)
    warmup = c.optim.warmup_steps if c.optim.warmup_steps >= 0 else int(c.optim.warmup_ratio * plan.steps)
    sched = get_linear_schedule_with_warmup(opt, warmup, plan.steps)
    agree = loss_agreement(c, store, plan, loader, loss_fn, collator, rows, K, doc_cols)
    diff = max(abs(a - b) for a, b in agree.values())
    print(f"[st seed {seed}] loss before training, ST vs jaxembed (no dropout): " +
          ", ".join(f"step {s}: {a:.6f} vs {b:.6f}" for s, (a, b) in agree.items()) + f"; max |diff| {diff:.2e}",
          flush=True)
    if st_loss == "masked" and diff > 1e-3:
        raise SystemExit(f"error: ST's masked loss and jaxembed's InfoNCE differ by {diff:.2e} on the same batch")
    Collator.checked = 0
    model.train()
    losses, log = [], []
    t0 = time.time()
    for step, batch in enumerate(dl):
        labels = batch.pop("label")
        loss = loss_fn(column_features(batch, ["anchor", *doc_cols]), labels)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), c.optim.grad_clip)
        opt.step()
        sched.step()
        model.zero_grad()
        losses.append(float(loss))
        if (step + 1) % c.train.log_every == 0:
            rec = {"step": step + 1, "loss": statistics.mean(losses[-c.train.log_every:]),
                   "grad_norm": float(gnorm), "time": round(time.time() - t0, 1)}
            log.append(rec)
            print(f"[st seed {seed}] step {step + 1}/{plan.steps} loss {rec['loss']:.4f} ({rec['time']}s)",
                  flush=True)
    train_s = time.time() - t0
    model.save(str(rundir / "model"))
    return {"train_s": train_s, "log": log, "token_checks": Collator.checked, "plan": plan.fingerprint(),
            "loss_agreement_before_training": {str(k): v for k, v in agree.items()},
            "loss_fn": type(loss_fn).__name__, "scale": scale, "warmup_steps": warmup}


def train_st_stock(c, seed: int, rundir: Path, st_threads: int = 1) -> dict:
    """One stock sentence-transformers run (quality_parity.py's docstring) on the examples of the plan of the run
    config ``c`` (``seed``: the Trainer's seed); saves the model to rundir/model."""
    import datasets
    import torch
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, \
        SentenceTransformerTrainingArguments
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.sentence_transformer.training_args import MultiDatasetBatchSamplers

    from jaxembed import config as cfglib
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.loading import read_sentence_transformers
    from jaxembed.tokenizer import Tokenizer

    store = Store.open(c.data.store)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    info = read_sentence_transformers(Path(c.model.name))
    tok = Tokenizer.from_folder(info.transformer_dir, c.model.max_length or info.max_seq_length,
                                lowercase=info.do_lower_case)
    rows, K, Lq, Ld = plan_rows(store, plan, tok)
    groups = stock_datasets(store, plan, rows, K)
    train_ds = datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in groups.items()})
    if st_threads:
        torch.set_num_threads(st_threads)
    model = SentenceTransformer(c.model.name, device="cpu")
    model.max_seq_length = max(Lq, Ld)  # stock ST: one length for every column
    warmup = c.optim.warmup_steps if c.optim.warmup_steps >= 0 else int(c.optim.warmup_ratio * plan.steps)
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(rundir / "trainer"), max_steps=plan.steps, per_device_train_batch_size=plan.global_batch_size,
        learning_rate=c.optim.lr, warmup_steps=warmup, lr_scheduler_type="linear", weight_decay=c.optim.weight_decay,
        max_grad_norm=c.optim.grad_clip, adam_beta1=c.optim.b1, adam_beta2=c.optim.b2, adam_epsilon=c.optim.eps,
        seed=seed, data_seed=seed, multi_dataset_batch_sampler=MultiDatasetBatchSamplers.PROPORTIONAL,
        logging_steps=c.train.log_every, save_strategy="no", report_to="none", use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True)
    loss = MultipleNegativesRankingLoss(model, scale=1.0 / float(c.loss.temperature))
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train_ds, loss=loss)
    t0 = time.time()
    out = trainer.train()
    train_s = time.time() - t0
    model.save(str(rundir / "model"))
    log = [{"step": x["step"], "loss": x["loss"], "grad_norm": x.get("grad_norm")}
           for x in trainer.state.log_history if "loss" in x]
    return {"train_s": train_s, "log": log, "steps": int(out.global_step), "plan": plan.fingerprint(),
            "datasets": {k: len(v) for k, v in groups.items()}, "loss_fn": type(loss).__name__,
            "max_seq_length": model.max_seq_length, "warmup_steps": warmup,
            "trainer": "SentenceTransformerTrainer (stock)"}
