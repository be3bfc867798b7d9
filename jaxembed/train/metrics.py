"""The trainer's figures of its steps: ``host_metrics`` averages the logged steps' metrics and measures the
throughput (examples, tokens per second, step time, the share of real tokens, MFU, the device memory's peak);
``step_flops`` counts one step's FLOPs on the global batch (jaxembed.flops), padded or packed rows, for the MFU.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import jax

from jaxembed import flops as flopslib
from jaxembed.train import encode as train_encode

if TYPE_CHECKING:
    from jaxembed.runs.rundir import RunDir
    from jaxembed.train.run import Run


def host_metrics(pending: list, run: Run, t_start: float, flops_per_step: list) -> tuple[dict, list]:
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
    # the share of the encoded token slots that hold a real token (packed rows: ~0.9; padded: often below 0.5)
    out["real_token_fraction"] = tok / max(sum(h["padded_tokens"] for _, _, h in pending), 1)
    peak = flopslib.peak_flops_per_device()
    if peak:
        out["mfu"] = sum(flops_per_step) / elapsed / (peak * jax.device_count())
    mem = flopslib.device_memory_peak_gib()  # GPU / TPU: the allocator's high-water mark; CPU keeps none
    if mem is not None:
        out["device_memory_peak_gib"] = mem
    return out, rows


def step_flops(run: Run, host_batch: dict) -> float:
    """FLOPs of the step on the global batch (jaxembed.flops): the computed token slots, padded rows or packed
    rows (a packed row of L slots costs a padded row of L)."""
    n = jax.process_count()
    if train_encode.is_packed(host_batch):
        packs = [host_batch[k] for k in ("pack_input_ids", "query_pack_input_ids", "doc_pack_input_ids")
                 if k in host_batch]
        b = host_batch["query_prompt_length"].shape[0] * n
        enc = sum(flopslib.forward_flops(run.loaded.model.config, x.shape[0] * n, x.shape[1]) for x in packs)
        cached = bool(run.config.train.gradcache_chunk)
        return enc * (4.0 if cached else 3.0) + 3 * 2.0 * b * (b * run.K) * run.loaded.model.dim
    q, d = host_batch["query_input_ids"], host_batch["doc_input_ids"]
    return flopslib.train_step_flops(run.loaded.model.config, q.shape[0] * n, q.shape[1], d.shape[0] * n, d.shape[1],
                                     run.loaded.model.dim, bool(run.config.train.gradcache_chunk))


def dev_scores(rd: RunDir, metric: str) -> dict[int, float]:
    """{step: value of ``metric``} of the dev evaluations in ``<workdir>/metrics.jsonl``, over every invocation of
    the run (step 0: the model before training, ``eval.before``); non-finite values are left out."""
    import math

    from jaxembed.runs.facts import eval_records

    out: dict[int, float] = {}
    for r in eval_records(rd):
        v = r["metrics"].get(metric)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[r["step"]] = float(v)
    return out


def best_step(scores: dict[int, float], mode: str) -> int | None:
    """The step of the best score (``mode`` 'max' / 'min'); a tie goes to the later step, as Orbax's BestN keeps
    the later of two equal checkpoints (a stable sort, the last n kept)."""
    best = None
    for step in sorted(scores):
        if best is None or (scores[step] >= scores[best] if mode == "max" else scores[step] <= scores[best]):
            best = step
    return best
