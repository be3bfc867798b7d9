"""MoTE routing (jaxembed/mote/spec.py, block.py) and the routed optimizer's masking (jaxembed/runs/optim.py) on toy
inputs, against hand-written expectations and a float64 numpy AdamW: no model compile. The mutants each test kills
(docs/testing.md) are named in it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxembed import mote
from jaxembed.runs import optim
from jaxembed.errors import UserError

EXP = mote.DEFAULT_EXPERTS  # classification, clustering, search_query, search_document


def test_mote_layers():
    """`range(1, n, 2)` numbers and the placement tests."""
    assert mote.mote_layers("every", 4) == (0, 1, 2, 3)
    assert mote.mote_layers("every_other", 4) == (1, 3)
    assert mote.mote_layers("every_other", 5) == (1, 3)
    assert mote.mote_layers("every_other", 7) == (1, 3, 5)
    with pytest.raises(UserError, match="placement 'odd' is not valid"):
        mote.mote_layers("odd", 4)


def test_experts_for_every_kind_of_task():
    """experts_for / expert_name / expert_for / index / _route: None, an expert name, query / document in any
    case, jaxembed and MTEB type names, aliases, one name for a same-expert pair, the errors."""
    s = mote.MoTESpec.build(2)
    assert s.experts_for(None) == ("classification",)
    assert s.experts_for("clustering") == ("clustering",)
    assert s.experts_for("query") == ("search_query",) and s.experts_for("Document") == ("search_document",)
    assert s.experts_for("retrieval") == ("search_query", "search_document")
    assert s.experts_for("Retrieval") == ("search_query", "search_document")
    assert s.experts_for("PairClassification") == ("classification",)
    assert s.experts_for("BitextMining") == ("classification",)  # alias -> sts
    assert s.experts_for("InstructionReranking") == ("search_query", "search_document")
    assert s._route("nothing") is None and s._route("Clustering") == ("clustering", "clustering")
    with pytest.raises(UserError, match="neither an expert"):
        s.experts_for("translation")
    assert s.expert_name("retrieval", "query") == "search_query"
    assert s.expert_name("retrieval", "document") == "search_document"
    assert s.expert_name("sts") == "classification" and s.expert_name("sts", "document") == "classification"
    assert s.expert_name(None) == "classification"
    with pytest.raises(UserError, match="task 'retrieval' encodes queries with expert 'search_query' and documents "
                                        "with 'search_document'; say which"):
        s.expert_name("retrieval")
    with pytest.raises(UserError, match="say which"):
        s.expert_name("retrieval", "passage")
    assert [s.expert_for(t, "document") for t in ("retrieval", "clustering", None)] == [3, 1, 0]
    assert s.expert_for("query") == 2 and s.index("search_document") == 3
    with pytest.raises(UserError, match="expert 'x' is not loaded"):
        s.index("x")
    no_ret = mote.MoTESpec.build(2, routing={"sts": ("clustering", "clustering")})
    with pytest.raises(UserError, match="no 'retrieval' entry to take the query expert"):
        no_ret.experts_for("query")
    assert no_ret.experts_for("sts") == ("clustering",)


def test_routing_tables():
    s = mote.MoTESpec.build(2)
    q, d = mote.routing_tables(s, ["a", "b", "c"], {"a": "retrieval", "b": "clustering", "c": "sts"})
    assert q.tolist() == [2, 1, 0] and d.tolist() == [3, 1, 0] and q.dtype == d.dtype == np.int32
    with pytest.raises(UserError, match="task 'b' .task type 'translation'. routes to no MoTE expert"):
        mote.routing_tables(s, ["a", "b"], {"a": "retrieval", "b": "translation"})
    with pytest.raises(UserError, match="task 'z' .task type None"):
        mote.routing_tables(s, ["z"], {})


def test_active_experts_and_make_route():
    """active_experts: any row of any id array (-1 = no expert); make_route: None -> the default expert, a scalar
    -> no active mask (the fast path), [B] / [B, L] -> reshaped ids and their active experts."""
    a = mote.active_experts(4, jnp.asarray([0, 2, 2]), jnp.asarray([[2, -1], [-1, -1]]))
    assert a.tolist() == [True, False, True, False]
    assert mote.active_experts(3).tolist() == [False, False, False]
    assert mote.active_experts(3, jnp.asarray([1])).tolist() == [False, True, False]
    s = mote.MoTESpec.build(2)
    ids, act = mote.make_route(None, s, 2)
    assert ids.shape == () and int(ids) == 0 and act is None
    ids, act = mote.make_route(3, s, 2)
    assert ids.shape == () and int(ids) == 3 and act is None
    ids, act = mote.make_route(np.array([[1], [3]]), s, 2)  # [B, 1] per row, given as 2-D
    assert ids.shape == (2, 1) and act.tolist() == [False, True, False, True]
    ids, act = mote.make_route(np.array([1, 3]), s, 2)
    assert ids.shape == (2,) and ids.tolist() == [1, 3] and act.tolist() == [False, True, False, True]
    ids, act = mote.make_route(np.array([[0, 0, -1], [2, -1, -1]]), s, 2)
    assert ids.shape == (2, 3) and act.tolist() == [True, False, True, False]


class _Lin(nnx.Module):
    def __init__(self, rngs):
        self.w = nnx.Param(jnp.zeros((3, 3)))

    def __call__(self, h, deterministic=True, rngs=None):
        y = jnp.einsum("blh,hk->blk", h, self.w[...])  # one expert's [H, H] (`keepdims=True` would be [1, H, H])
        if not deterministic:  # "dropout": needs the key MoTEFeedForward draws
            y = y + jax.random.uniform(rngs.dropout(), y.shape)
        return y


def _ffn():
    ff = mote.MoTEFeedForward(_Lin, 3, nnx.Rngs(0))
    ws = np.stack([np.eye(3) * (e + 1) for e in range(3)]).astype(np.float32)  # expert e scales by e + 1
    ff.experts.w[...] = jnp.asarray(ws)
    return ff


def test_feed_forward_takes_each_rows_and_tokens_expert():
    """MoTEFeedForward: a scalar id indexes the stack; per row / per token each row (token) takes its expert's
    output, -1 and inactive experts give 0. Kills `ids.ndim == 0` -> `!= 0`, `ids == e` -> `!=`, the pick
    lambdas' axes, `range(self.num_experts)` -> zero iterations, `active[e]`."""
    ff = _ffn()
    x = jnp.ones((2, 2, 3))
    np.testing.assert_array_equal(np.asarray(ff(x, (jnp.asarray(2), None))), 3 * np.ones((2, 2, 3)))
    rows = jnp.asarray([1, 0])
    out = np.asarray(ff(x, (rows, jnp.asarray([True, True, False]))))
    np.testing.assert_array_equal(out[:, :, 0], [[2, 2], [1, 1]])
    tok = jnp.asarray([[2, -1], [0, 2]])
    out = np.asarray(ff(x, (tok, jnp.asarray([True, False, True]))))
    np.testing.assert_array_equal(out[:, :, 0], [[3, 0], [1, 3]])
    # an expert marked idle is skipped: its rows get 0 (the caller marks every used expert active)
    out = np.asarray(ff(x, (rows, jnp.asarray([True, False, False]))))
    np.testing.assert_array_equal(out[:, :, 0], [[0, 0], [1, 1]])
    with pytest.raises(ValueError, match="needs a route"):
        ff(x, None)
    # dropout: one key drawn from rngs for the call, only when not deterministic (`key = None if deterministic
    # ...` -> `if not deterministic ...`)
    r = nnx.Rngs(dropout=0)
    same = np.asarray(ff(x, (jnp.asarray(2), None), deterministic=True, rngs=r))
    np.testing.assert_array_equal(same, 3 * np.ones((2, 2, 3)))
    noisy = np.asarray(ff(x, (jnp.asarray(2), None), deterministic=False, rngs=r))
    assert np.all((noisy > 3) & (noisy < 4))


def test_expert_paths():
    assert mote.is_expert_path(("layers", 0, "ffn", "experts", "w"))
    assert mote.is_expert_path((jax.tree_util.DictKey("ffn"), jax.tree_util.DictKey("experts")))
    assert not mote.is_expert_path(("layers", "ffn", "w"))
    assert optim._is_expert((jax.tree_util.DictKey("experts"), jax.tree_util.DictKey("k")))
    assert not optim._is_expert(("experts",))  # optax key paths only: plain strings have no .key
    assert optim._num_experts({"a": jnp.zeros((2, 2)), "ffn": {"experts": {"k": jnp.zeros((5, 2))}}}) == 5
    assert optim._num_experts({"a": jnp.zeros((2, 2))}) == 0
    assert optim._expert_view(jnp.zeros((4, 2, 3)), jnp.arange(4)).shape == (4, 1, 1)


B1, B2, EPS, LR, WD = 0.8, 0.9, 1e-2, 0.1, 0.5


def _numpy_routed_adamw(params, grads_seq, actives):
    """float64 AdamW in which an idle expert keeps its moments and step count and gets no update (optim.py's
    docstring). params: {"a": [2, 3], "ffn": {"experts": {"k": [E, 2]}}}. -> params after the steps."""
    p = {k: np.asarray(v, np.float64) for k, v in (("a", params["a"]), ("k", params["ffn"]["experts"]["k"]))}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    count, ecount = 0, np.zeros(p["k"].shape[0], np.int64)
    for g_tree, act in zip(grads_seq, actives):
        g = {"a": np.asarray(g_tree["a"], np.float64), "k": np.asarray(g_tree["ffn"]["experts"]["k"], np.float64)}
        count += 1
        act = np.ones(len(ecount), bool) if act is None else np.asarray(act)
        ecount = ecount + act
        for name in ("a", "k"):
            m2 = (1 - B1) * g[name] + B1 * m[name]
            v2 = (1 - B2) * g[name] ** 2 + B2 * v[name]
            if name == "k":
                a = act[:, None]
                c = np.maximum(ecount, 1)[:, None]
                m2, v2 = np.where(a, m2, m[name]), np.where(a, v2, v[name])
            else:
                a, c = True, count
            u = (m2 / (1 - B1 ** c)) / (np.sqrt(v2 / (1 - B2 ** c)) + EPS)
            u = u + WD * p[name]  # decoupled weight decay (both leaves are matrices: decay_mask is True)
            p[name] = p[name] - LR * np.where(a, u, 0.0)
            m[name], v[name] = m2, v2
    return p, count, ecount


def test_routed_adamw_equals_a_numpy_reference_with_idle_experts():
    """Three steps with different routed experts (one never routed, one routed once): weights, moments' effect,
    step counts and the bias correction per expert. Kills the mutants of `(1 - b1)`, `b1 * m`, `g ** 2`,
    `1 - b2 ** c`, `+ eps`, `jnp.maximum(ecount, 1)` -> `(ecount, 2)`, `jnp.where(act, ...)`, `where(a, m2, m)`,
    zero_idle_experts' `where` and its `active is None` test (weight decay of idle experts)."""
    rng = np.random.default_rng(0)
    params = {"a": jnp.asarray(rng.standard_normal((2, 3)), jnp.float32),
              "ffn": {"experts": {"k": jnp.asarray(rng.standard_normal((4, 2)), jnp.float32)}}}
    grads = [jax.tree.map(lambda x, i=i: jnp.asarray(np.random.default_rng(i + 1).standard_normal(x.shape),
                                                     jnp.float32), params) for i in range(3)]
    actives = [np.array([True, False, True, False]), np.array([True, False, False, True]), None]
    tx = optim.routed_adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD, mask=optim.decay_mask)
    state, p = tx.init(params), params
    for g, act in zip(grads, actives):
        kw = {} if act is None else {"active": jnp.asarray(act)}
        u, state = tx.update(g, state, p, **kw)
        p = optax.apply_updates(p, u)
    want, count, ecount = _numpy_routed_adamw(params, grads, actives)
    adam = state[0]
    assert int(adam.count) == count == 3 and adam.expert_count.tolist() == ecount.tolist() == [3, 1, 2, 2]
    np.testing.assert_allclose(np.asarray(p["a"]), want["a"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(p["ffn"]["experts"]["k"]), want["k"], rtol=1e-5, atol=1e-6)


def test_scale_by_routed_adam_defaults_are_optax_adams():
    """Called with its defaults (b1, b2, eps), on a tree without experts, scale_by_routed_adam is optax's Adam
    (mutants of the default numbers)."""
    params = {"a": jnp.asarray(np.random.default_rng(0).standard_normal((3, 2)), jnp.float32)}
    ours, ref = optim.scale_by_routed_adam(), optax.scale_by_adam()
    s_ours, s_ref = ours.init(params), ref.init(params)
    for i in range(2):
        g = {"a": jnp.asarray(np.random.default_rng(i + 5).standard_normal((3, 2)) * 1e-3, jnp.float32)}
        u_ours, s_ours = ours.update(g, s_ours, params)
        u_ref, s_ref = ref.update(g, s_ref, params)
        np.testing.assert_allclose(np.asarray(u_ours["a"]), np.asarray(u_ref["a"]), rtol=1e-5, atol=1e-7)


def test_idle_expert_is_bit_for_bit_untouched_and_active_none_is_dense():
    """An idle expert: parameters, both moments and its count unchanged (`jnp.where(a, u, zeros)` ->
    `where(a, zeros, u)` ...); active=None: every expert trained (`jnp.ones([n], bool)` -> zeros)."""
    params = {"ffn": {"experts": {"k": jnp.ones((2, 3))}}}
    g = {"ffn": {"experts": {"k": jnp.full((2, 3), 0.5)}}}
    tx = optim.routed_adamw(LR, b1=B1, b2=B2, eps=EPS, weight_decay=WD, mask=optim.decay_mask)
    s0 = tx.init(params)
    u, s1 = tx.update(g, s0, params, active=jnp.asarray([False, True]))
    assert np.all(np.asarray(u["ffn"]["experts"]["k"])[0] == 0) and np.all(np.asarray(u["ffn"]["experts"]["k"])[1] < 0)
    assert np.all(np.asarray(s1[0].mu["ffn"]["experts"]["k"])[0] == 0) and s1[0].expert_count.tolist() == [0, 1]
    u, s2 = tx.update(g, s0, params)
    assert np.all(np.asarray(u["ffn"]["experts"]["k"]) < 0) and s2[0].expert_count.tolist() == [1, 1]
