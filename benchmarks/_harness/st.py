"""The sentence-transformers peer of the benchmarks: the HF Trainer's AdamW (its weight-decay groups), a batch's
features per column, the plan's batches and rows in ST's form (the same strings in the same order as jaxembed's
loader), and ST's MultipleNegativesRankingLoss with jaxembed's two InfoNCE masks."""

from __future__ import annotations

from .recipe import loader_tables, step_items


def trainer_adamw(model, lr: float, weight_decay: float, **kw):
    """The HF Trainer's optimizer: torch AdamW with weight decay on every trainable parameter except LayerNorm /
    RMSNorm weights and biases. ``kw``: betas, eps."""
    import torch
    from torch import nn
    from transformers.trainer_pt_utils import get_parameter_names

    decay = set(get_parameter_names(model, [nn.LayerNorm],
                                    [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
              {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, **kw)


def st_step(model, loss_fn, opt, features, amp):
    """One sentence-transformers training step as the HF Trainer runs it: the loss under ``amp`` (a context
    manager factory: autocast, or a null context), backward, grad-norm clipping at 1.0, the optimizer step. -> loss."""
    import torch

    with amp():
        loss = loss_fn(features, None)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def column_features(batch: dict, columns: list[str]) -> list[dict]:
    """A collated batch ({"<column>_input_ids": ..., ...}) as ST's loss takes it: one feature dict per column."""
    return [{k[len(col) + 1:]: v for k, v in batch.items() if k.startswith(col + "_")} for col in columns]


class PlanBatchSampler:
    """Yields the row indices of plan step 0, 1, ... (rows are laid out step-major: row = step * G + r), so a
    torch DataLoader over the flattened plan gives exactly jaxembed's batches in jaxembed's order."""

    def __init__(self, steps: int, batch_size: int):
        self.steps, self.batch_size = steps, batch_size

    def __iter__(self):
        for s in range(self.steps):
            yield list(range(s * self.batch_size, (s + 1) * self.batch_size))

    def __len__(self):
        return self.steps


def plan_rows(store, plan, tok):
    """The flattened plan as ST dataset rows: {"anchor", "positive", "negative_1", ..., "label"}, where anchor is
    instruction + query and the documents are exactly the loader's choice for that (step, row). label holds
    [id(positive), id(negative_1) or -1 when the slot is empty, ..., step]: text identities (ids of the raw text
    without instruction, as jaxembed's hashes) for the masks, and the step for the token check."""
    import numpy as np

    tables = loader_tables(store, plan, tok)
    used = np.unique(plan.dataset_ids).tolist()
    lq = {tables.max_q[d] for d in used}
    ld = {tables.max_d[d] for d in used}
    if len(lq) != 1 or len(ld) != 1:
        raise SystemExit(f"error: the datasets of the plan have different max lengths (queries {sorted(lq)}, "
                         f"documents {sorted(ld)}); ST's collator takes one length per column")
    K = tables.K
    G = plan.global_batch_size
    ids: dict[str, int] = {}
    rows = []
    for s in range(plan.steps):
        q_items, d_items, _, d_raw = step_items(tables, store, plan, s)
        for r in range(G):
            row = {"anchor": q_items[r][0]}
            label = []
            for j in range(K):
                item, raw = d_items[r * K + j], d_raw[r * K + j]
                row["positive" if j == 0 else f"negative_{j}"] = item[0] if item is not None else ""
                label.append(ids.setdefault(raw, len(ids)) if raw is not None else -1)
            row["label"] = label + [s]
            rows.append(row)
    return rows, K, lq.pop(), ld.pop()


def make_masked_mnrl():
    """The class MaskedMNRL (torch and sentence-transformers are imported only when it is made)."""
    import torch
    import torch.nn.functional as F
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    class MaskedMNRL(MultipleNegativesRankingLoss):
        """ST's MultipleNegativesRankingLoss (query -> documents, joint softmax) with jaxembed's two masks: an
        empty negative slot (label id -1) is no candidate, and a candidate whose text is the query's own positive
        (same id, another column) is no negative. labels: int64 [B, K + 1] = ids of (positive, negatives), step."""

        def compute_loss_from_embeddings(self, embeddings, labels):
            q, docs = embeddings[0], embeddings[1:]
            B, K = q.shape[0], len(docs)
            cand = torch.cat(docs, 0)                        # column-major: all positives, then negatives_1, ...
            cid = labels[:, :K].T.reshape(-1)                # [K*B] text ids in the same order
            logits = self.similarity_fct(q, cand) * self.scale   # [B, K*B]
            rows = torch.arange(B, device=q.device)
            allowed = (cid >= 0)[None, :] & (cid[None, :] != labels[:, :1])
            allowed[rows, rows] = True                       # the own positive (column r) always counts
            logits = logits.masked_fill(~allowed, float("-inf"))
            return F.cross_entropy(logits, rows)

    return MaskedMNRL


def stock_datasets(store, plan, rows: list[dict], K: int) -> dict[str, list[dict]]:
    """The plan's rows (``plan_rows``) grouped by dataset for a stock ST ``DatasetDict``: columns anchor, positive,
    negative_1, ... (no label, no empty slot); rows whose negative slots are empty go to ``<name>_pairs``."""
    G = plan.global_batch_size
    out: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        name = store.datasets[int(plan.dataset_ids[i // G][i % G])].name
        negs = [row[f"negative_{j}"] for j in range(1, K) if row.get(f"negative_{j}")]
        rec = {"anchor": row["anchor"], "positive": row["positive"]}
        rec.update({f"negative_{j + 1}": t for j, t in enumerate(negs)})
        key = name if len(negs) == K - 1 else f"{name}_pairs" if not negs else f"{name}_{len(negs)}neg"
        out.setdefault(key, []).append(rec)
    return out
