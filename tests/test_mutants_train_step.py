"""The train step's update and skip logic (jaxembed/train/loop.py make_train_step's ``step``, jaxembed/runs/optim.py
keep_unless) in process: one compile of a one-layer tiny BERT step, three steps (applied, skipped, applied) checked
field by field. Kills the step's mutants named in docs/testing.md (the ``ok`` test, the counters, the kept state)."""

import jax
import numpy as np
import optax
import pytest

from jaxembed import parallel
from jaxembed.data import pipeline as P

pytestmark = pytest.mark.slow


def _leaves(tree):
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_applied_skipped_applied(shared_data, tmp_path):
    """Step 0 applies its update; step 1 (non-finite loss and gradients, injected) changes nothing but the step
    counter, the schedule's count and the non-finite / skipped counters; step 2 applies again and resets the
    non-finite run. The metrics say which (ok, loss, lr = schedule(step))."""
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import init_state, make_train_step, setup
    from packed_reference import slice_data, small_config

    c = small_config(slice_data(shared_data, tmp_path), inject_nonfinite_steps=(1,))
    c.model.name = str(tiny_model_dir("bert", num_layers=1))
    c.data.packing = False
    run = setup(c, tmp_path / "run")
    host = P.make_loader(run.store, run.plan, run.loaded.tokenizer, num_candidates=run.K).batch(0)
    step = make_train_step(run)
    state = init_state(run)
    seen = [jax.device_get(state)]
    metrics = []
    for i in range(3):
        b = dict(host, step=np.asarray(i, np.asarray(host["step"]).dtype))
        state, m = step(state, P.to_global(b, parallel.batch_sharding(run.mesh)))
        seen.append(jax.device_get(state))
        metrics.append(jax.device_get(m))
    s0, s1, s2, s3 = seen
    assert [bool(m["ok"]) for m in metrics] == [True, False, True]
    assert np.isfinite(metrics[0]["loss"]) and np.isnan(metrics[1]["loss"]) and np.isfinite(metrics[2]["loss"])
    assert [float(m["lr"]) for m in metrics] == pytest.approx([float(run.schedule(i)) for i in range(3)])
    assert [int(s["step"]) for s in seen] == [0, 1, 2, 3]
    assert [int(s["nonfinite"]) for s in seen] == [0, 0, 1, 0]
    assert [int(s["skipped"]) for s in seen] == [0, 0, 1, 1]
    assert all(np.array_equal(s["rng"], s0["rng"]) for s in seen)
    assert float(s2["peg_t"]) == float(s1["peg_t"])
    p = [_leaves(s["params"]) for s in seen]
    assert all(np.array_equal(p[2][k], p[1][k]) for k in p[1])  # the skipped step: parameters bit for bit
    assert any(not np.array_equal(p[1][k], p[0][k]) for k in p[0])  # the applied ones move them
    assert any(not np.array_equal(p[3][k], p[2][k]) for k in p[0])
    o1, o2 = _leaves(s1["opt_state"]), _leaves(s2["opt_state"])
    changed = sorted(k for k in o1 if not np.array_equal(o1[k], o2[k]))
    assert len(changed) == 1 and int(o1[changed[0]]) == 1 and int(o2[changed[0]]) == 2, changed  # the schedule's
    sched = [x for x in jax.tree.leaves(s2["opt_state"], is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
             if isinstance(x, optax.ScaleByScheduleState)]
    assert len(sched) == 1 and int(sched[0].count) == 2
    o3 = _leaves(s3["opt_state"])
    assert sum(not np.array_equal(o3[k], o2[k]) for k in o2) > 1  # moments and Adam's count move again

    # a finite loss with non-finite gradients is skipped too (`isfinite(loss) & isfinite(gnorm)` -> `|`): every
    # norm's scale and bias 0 makes every embedding 0, whose loss is finite (all logits 0) and whose normalisation
    # has a NaN gradient
    zero = jax.tree_util.tree_map_with_path(
        lambda k, x: np.zeros_like(x) if jax.tree_util.keystr(k).endswith(("['scale']", "['bias']")) else x,
        s3["params"])
    s4 = dict(s3, params=zero)
    b = dict(host, step=np.asarray(3, np.asarray(host["step"]).dtype))
    s5, m4 = step(jax.device_put(s4), P.to_global(b, parallel.batch_sharding(run.mesh)))
    m4, s5 = jax.device_get(m4), jax.device_get(s5)
    assert np.isfinite(m4["loss"]) and not np.isfinite(m4["grad_norm"]) and not bool(m4["ok"])
    assert int(s5["skipped"]) == 2 and int(s5["nonfinite"]) == 1
    assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(s5["params"]),
                                                                          jax.tree.leaves(zero)))
