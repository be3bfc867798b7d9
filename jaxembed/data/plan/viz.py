"""The picture of a batch plan (``jaxembed plan show --png``), drawn with matplotlib (the optional ``viz`` extra).

One row per task (plus ``(mixed)`` for mixed-task batches; rows without steps are left out), one column per bin of
steps; a cell's colour strength is the share of the bin's steps given to that task, so the curriculum's task order
reads from left to right.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from jaxembed.errors import UserError

if TYPE_CHECKING:
    from jaxembed.data.plan.file import Plan

MIXED = "(mixed)"


def task_shares(task_ids: np.ndarray, n_tasks: int, width: int = 1000) -> np.ndarray:
    """Share of each bin's steps per task. task_ids int [S] (-1 = mixed) -> float64 [n_tasks + 1, min(width, S)]
    (row 0 = mixed, row k = task k - 1; each non-empty column sums to 1)."""
    S = len(task_ids)
    cols = max(1, min(width, S))
    bins = (np.arange(S) * cols) // max(S, 1)
    share = np.zeros((n_tasks + 1, cols))
    np.add.at(share, (np.asarray(task_ids, np.int64) + 1, bins), 1.0)
    return share / np.maximum(np.bincount(bins, minlength=cols), 1)[None]


def _pyplot(path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(f"{path}: drawing a plan needs matplotlib, which is not installed "
                        "(fix: pip install 'jaxembed[viz]')") from None
    return plt


def render_png(plan: Plan, path: str | os.PathLike, width: int = 1000) -> Path:
    """Draw the task sequence of ``plan`` over its steps as a PNG at ``path`` (about ``width`` pixels of steps plus
    the labels). -> the path. UserError (one line) when matplotlib is missing."""
    plt = _pyplot(path)
    from matplotlib.colors import hsv_to_rgb

    labels = [MIXED] + list(plan.task_names)
    share = task_shares(plan.task_ids, len(plan.task_names), width)
    rows = [k for k in range(len(labels)) if share[k].sum() > 0] or [0]
    # golden-ratio hues: distinct colours for any number of tasks; mixed batches grey
    pal = hsv_to_rgb(np.stack([(np.arange(len(labels)) * 0.618033988749895) % 1.0,
                               np.full(len(labels), 0.75), np.full(len(labels), 0.9)], -1))
    pal[0] = 90 / 255
    s = share[rows][..., None]
    img = np.where(s > 0, 1 - s * (1 - pal[rows][:, None, :]), 240 / 255)  # [rows, cols, 3]

    dpi, label_px = 100, 7 * min(40, max(len(labels[k]) for k in rows)) + 40
    fig = plt.figure(figsize=((width + label_px + 30) / dpi, (18 * len(rows) + 80) / dpi), dpi=dpi)
    ax = fig.add_axes((label_px / (width + label_px + 30), 45 / (18 * len(rows) + 80),
                       width / (width + label_px + 30), 18 * len(rows) / (18 * len(rows) + 80)))
    S = plan.steps
    ax.imshow(img, aspect="auto", interpolation="nearest", extent=(0, S, len(rows), 0))
    ax.set_yticks(np.arange(len(rows)) + 0.5, [labels[k][:40] for k in rows], fontsize=7)
    ax.set_xlim(0, S)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"task sequence: {S} steps x {plan.global_batch_size}", fontsize=9)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)
