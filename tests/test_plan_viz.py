"""The plan picture (jaxembed/data/plan/viz.py): the per-bin task shares, the PNG matplotlib draws, and the one-line
error when matplotlib is missing."""

import sys
from types import SimpleNamespace

import numpy as np
import pytest

from jaxembed.data import plan as P
from jaxembed.data.plan import viz as V
from jaxembed.errors import UserError


def _plan(task_ids, task_names):
    """Only what the picture reads from a Plan."""
    ids = np.asarray(task_ids, np.int32)
    return SimpleNamespace(task_ids=ids, task_names=list(task_names), steps=len(ids), global_batch_size=8)


def test_task_shares():
    share = V.task_shares(np.array([0, 0, 1, -1, 1, 1]), 3, width=3)   # bins of 2 steps
    np.testing.assert_allclose(share, [[0, .5, 0], [1, 0, 0], [0, .5, 1], [0, 0, 0]])
    share = V.task_shares(np.array([2, 0]), 3, width=1000)              # fewer steps than columns: one per step
    assert share.shape == (4, 2) and share[3, 0] == 1 and share[1, 1] == 1


def _columns(img, rgb):
    """Image columns where the colour rgb fills a band (>= 10 pixels high; text anti-aliasing does not count)."""
    return np.nonzero(((np.abs(img[..., :3] - rgb) < 2 / 255).all(-1)).sum(0) >= 10)[0]


def _task_colour(k):
    """Label k's full-strength colour (golden-ratio hue, as viz.py draws it; label 0 = mixed)."""
    from matplotlib.colors import hsv_to_rgb

    return hsv_to_rgb([(k * 0.618033988749895) % 1.0, 0.75, 0.9])


def test_png_shows_the_task_sequence(tmp_path):
    """A curriculum-like order a -> b -> mixed: the PNG decodes, is about `width` wide plus labels, and each task's
    colour lies left of the next one's; the unused task c gets no colour."""
    image = pytest.importorskip("matplotlib.image")
    plan = _plan([0] * 120 + [1] * 120 + [-1] * 60, ["a", "b", "c"])
    path = V.render_png(plan, tmp_path / "seq.png", width=300)
    assert path == tmp_path / "seq.png" and P.render_png is V.render_png   # the plan package re-exports it
    img = image.imread(path)
    h, w = img.shape[:2]
    assert 300 < w < 500 and 40 < h < 300
    a, b, c = (_columns(img, _task_colour(k)) for k in (1, 2, 3))
    assert len(a) > 100 and len(b) > 100 and len(c) == 0
    assert a.max() < b.min()
    grey = _columns(img, np.full(3, 90 / 255))   # mixed batches
    assert len(grey) > 40 and b.max() < grey.min()
    # one row per task that has steps: a plan of one task is a shorter picture
    h1 = image.imread(V.render_png(_plan([0] * 50, ["a", "b", "c"]), tmp_path / "one.png", width=300)).shape[0]
    assert h1 < h


def test_missing_matplotlib_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UserError) as e:
        P.render_png(_plan([0, 1], ["a", "b"]), tmp_path / "p.png")
    msg = str(e.value)
    assert "\n" not in msg and "matplotlib" in msg and "pip install 'jaxembed[viz]'" in msg and "p.png" in msg
    assert not (tmp_path / "p.png").exists()
