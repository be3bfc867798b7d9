"""MoTE (jaxembed/mote/; docs/design.md, MoTE): up-cycling exactness on BERT (real all-MiniLM-L6-v2), Qwen2 and T5;
per-sequence routing, gradients only for routed experts (also under the gradient cache and remat), the routed
AdamW, a real train step on the shared data that leaves idle experts bit-for-bit untouched, the three exports
(full sentence-transformers folder with every expert, per-task dense folder, expert average), task-aware
loading, encoding and evaluation, the config and TA-CL."""

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import export, loading, models, mote, paths
from jaxembed.runs import optim
from jaxembed.encode import Encoder
from jaxembed.errors import UserError
from jaxembed.models.embedding import EmbeddingModel, HeadConfig

SENTS = ["A man is playing a guitar.", "What is the capital of France?", "The stock market fell sharply.",
         "Cats sleep a lot.", "Paris is the capital and largest city of France.", "It rained all day."]
EXPERTS = mote.DEFAULT_EXPERTS
MOTE_CONFIG = str(paths.REPO_ROOT / "configs" / "mote.py")


def _perturb_experts(model, scale=0.02):
    """Make every expert different (expert e gets noise e * scale), so routing mistakes show. numpy noise: no
    per-shape XLA compilation."""
    g, state = nnx.split(model)
    rng = np.random.default_rng(0)

    def f(path, x):
        if not mote.is_expert_path(path):
            return x
        ramp = np.arange(x.shape[0], dtype=np.float32).reshape((-1,) + (1,) * (x.ndim - 1))
        return jnp.asarray(np.asarray(x) + scale * ramp * rng.standard_normal(x.shape, np.float32), x.dtype)

    return nnx.merge(g, jax.tree_util.tree_map_with_path(f, state))


def _random_model(cfg, seed=0):
    """A random EmbeddingModel built from numpy arrays (nnx's eager initialisers compile a kernel per shape)."""
    rng = np.random.default_rng(seed)
    params = {p: (1.0 + 0.1 * rng.standard_normal(s) if p[-1] == "scale" else 0.2 * rng.standard_normal(s))
              for p, s in models.param_shapes(models.abstract_model(cfg)).items()}
    return EmbeddingModel(models.model_from_params(cfg, params), HeadConfig("mean"))


def _jit(model):
    """model(ids, mask, experts=...) as one jitted function (eager op-by-op dispatch is slow)."""
    g, state = nnx.split(model)
    f = jax.jit(lambda st, ids, mask, ex: nnx.merge(g, st)(ids, mask, experts=ex))
    return lambda ids, mask, experts=None: np.asarray(f(state, ids, mask, experts))


@pytest.fixture(scope="module")
def upcycled(minilm):
    return mote.upcycle(minilm.model, mote.MoTESpec.build(minilm.model.config.num_layers))


@pytest.fixture(scope="module")
def distinct(upcycled, minilm):
    """The up-cycled real MiniLM with distinct experts, its Encoder, and its embeddings of SENTS per expert."""
    model = _perturb_experts(upcycled)
    enc = Encoder(model, minilm.tokenizer)
    return model, enc, {e: enc.encode(SENTS, task=e) for e in EXPERTS}


@pytest.fixture(scope="module")
def full_export(distinct, minilm, tmp_path_factory):
    out = tmp_path_factory.mktemp("mote_full")
    return export.export(distinct[0], minilm.tokenizer, out, prompts={"query": "query: "})


# ------------------------------------------------------------------------------------------------ up-cycling


def test_upcycled_minilm_equals_dense_for_every_expert(minilm, upcycled, distinct):
    """MoTE 3.1.1: at step 0 the up-cycled model's embeddings are the dense model's, for every expert, by the
    one-expert-per-call path and by per-row routing (real all-MiniLM-L6-v2, <= 1e-6)."""
    dense = Encoder.from_loaded(minilm).encode(SENTS)
    enc = distinct[1]
    enc.set_model(upcycled)  # same architecture as the fixture's model: no recompilation
    try:
        for e in EXPERTS:
            np.testing.assert_allclose(enc.encode(SENTS, task=e), dense, atol=1e-6, rtol=0)
    finally:
        enc.set_model(distinct[0])
    ids, mask = minilm.tokenizer.pad(minilm.tokenizer.tokenize(SENTS, 32), 16, len(SENTS))
    rows = jnp.asarray([0, 1, 2, 3, 0, 2], jnp.int32)  # one expert per row, mixed
    np.testing.assert_allclose(_jit(upcycled)(ids, mask, rows), dense, atol=1e-6, rtol=0)
    assert upcycled.backbone.layers[0].ffn.experts.intermediate.kernel.shape == (4, 384, 1536)


@pytest.mark.parametrize("arch", ["qwen2", "t5"])
def test_upcycled_qwen2_t5_equal_dense(arch):
    """Up-cycling from the other architectures (tiny random configs): every block (Qwen2) and every other block
    (T5, gated-GELU), every expert equals the dense model (<= 1e-6)."""
    if arch == "qwen2":
        cfg = models.config_from_hf(dict(model_type="qwen2", vocab_size=128, hidden_size=32, intermediate_size=48,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
        placement = "every"
    else:
        cfg = models.config_from_hf(dict(model_type="t5", vocab_size=128, d_model=32, d_kv=8, d_ff=48, num_layers=4,
                                         num_heads=4, feed_forward_proj="gated-gelu"))
        placement = "every_other"
    dense = _random_model(cfg, seed=3)
    spec = mote.MoTESpec.build(cfg.num_layers, placement=placement)
    up = mote.upcycle(dense, spec)
    ids = jnp.asarray(np.random.RandomState(0).randint(2, 128, (3, 7)), jnp.int32)
    mask = jnp.asarray([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5], jnp.int32)
    ref, f = _jit(dense)(ids, mask), _jit(up)
    for e in range(4):
        np.testing.assert_allclose(f(ids, mask, jnp.asarray(e, jnp.int32)), ref, atol=1e-6, rtol=0)
    if arch == "t5":  # per-row routing too (the BERT test covers it on the real model)
        np.testing.assert_allclose(f(ids, mask, jnp.asarray([3, 0, 2], jnp.int32)), ref, atol=1e-6, rtol=0)
    layers = up.backbone.layers
    mote_layers = [i for i in range(cfg.num_layers) if isinstance(layers[i].ffn, mote.MoTEFeedForward)]
    assert tuple(mote_layers) == spec.layers == ((0, 1) if arch == "qwen2" else (1, 3))


def _tiny_bert(remat=False):
    """One MoTE layer: routing, the gradient cache and per-layer remat treat every MoTE layer alike."""
    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32),
                                remat=remat)
    return _perturb_experts(mote.upcycle(_random_model(cfg, seed=1), mote.MoTESpec.build(1)))


def test_gradients_reach_only_routed_experts_also_with_gradcache_and_remat():
    """Per-row routing: idle experts get exactly zero gradient; the gradient cache (sub-batches under scan +
    checkpoint) and per-layer remat give the same loss and gradients; FSDP never shards the expert axis."""
    from jaxembed import parallel
    from jaxembed.train import gradcache

    ids = jnp.asarray(np.random.RandomState(1).randint(1, 64, (4, 6)), jnp.int32)
    x = {"ids": ids, "mask": jnp.ones_like(ids), "experts": jnp.asarray([0, 0, 2, 2], jnp.int32)}

    def loss_of(model, chunk):
        g, p, r = nnx.split(model, nnx.Param, ...)

        def enc(params, xx, key):
            return nnx.merge(g, params, r)(xx["ids"], xx["mask"], experts=xx["experts"])

        f = lambda params: jnp.sum(gradcache.encode_chunked(enc, params, x, chunk) ** 3)  # noqa: E731
        return jax.jit(jax.value_and_grad(f))(p)

    model = _tiny_bert()
    v, grads = loss_of(model, None)
    k = grads["backbone"]["layers"][0]["ffn"]["experts"]["intermediate"]["kernel"][...]
    assert [bool(jnp.any(k[e] != 0)) for e in range(4)] == [True, False, True, False]
    v2, g2 = loss_of(_tiny_bert(remat=True), 2)  # remat and gradient cache (2 sub-batches) together
    np.testing.assert_allclose(float(v2), float(v), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g2), jax.tree.leaves(grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)
    mesh = parallel.make_mesh(1, -1)
    specs = parallel.param_specs(nnx.state(model, nnx.Param), mesh, "fsdp")
    kspec = specs["backbone"]["layers"][0]["ffn"]["experts"]["intermediate"]["kernel"]
    assert tuple(kspec) == (None, "fsdp", None)  # expert axis replicated, each expert's embed axis sharded


def test_routed_adamw():
    """All experts active: routed AdamW = optax.adamw (to rounding). An idle expert: weights, both moments and
    its step count bit-for-bit unchanged, no weight decay; a routed one moves. Works under freeze."""
    k = jax.random.split(jax.random.key(0), 3)
    params = {"a": {"kernel": jax.random.normal(k[0], (4, 3)), "bias": jnp.ones(3)},
              "ffn": {"experts": {"kernel": jax.random.normal(k[1], (3, 4, 5)), "scale": jnp.ones((3, 5))}}}
    grads = lambda i: jax.tree.map(lambda x: jax.random.normal(jax.random.fold_in(k[2], i), x.shape), params)  # noqa
    ref, tx = (optax.adamw(1e-2, weight_decay=0.1, mask=optim.decay_mask),
               optim.routed_adamw(1e-2, weight_decay=0.1, mask=optim.decay_mask))
    pa = pb = params
    sa, sb = ref.init(pa), tx.init(pb)
    upd_a, upd_b = jax.jit(ref.update), jax.jit(lambda g, s, p, a: tx.update(g, s, p, active=a))
    for i in range(4):
        ua, sa = upd_a(grads(i), sa, pa)
        ub, sb = upd_b(grads(i), sb, pb, jnp.ones(3, bool))
        pa, pb = optax.apply_updates(pa, ua), optax.apply_updates(pb, ub)
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)
    active = jnp.asarray([True, False, True])
    ub, sb2 = upd_b(grads(9), sb, pb, active)
    pb2 = optax.apply_updates(pb, ub)
    adam, adam2 = sb[0], sb2[0]
    for tree, tree2 in ((pb, pb2), (adam.mu, adam2.mu), (adam.nu, adam2.nu)):
        for name in ("kernel", "scale"):
            a, b = np.asarray(tree["ffn"]["experts"][name]), np.asarray(tree2["ffn"]["experts"][name])
            np.testing.assert_array_equal(a[1], b[1])
            assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[2], b[2])
    assert adam2.expert_count.tolist() == [5, 4, 5] and int(adam2.count) == 5
    txf, _ = optim.make_optimizer(params, lr=1e-3, total_steps=10, warmup_steps=0, routed=True, freeze=(r"^a\.",))
    u, _ = jax.jit(lambda g, s, p: txf.update(g, s, p, active=active))(grads(1), txf.init(params), params)
    assert float(jnp.abs(u["a"]["kernel"]).sum()) == 0 and float(jnp.abs(u["ffn"]["experts"]["kernel"][1]).sum()) == 0
    assert float(jnp.abs(u["ffn"]["experts"]["kernel"][0]).sum()) > 0


# ------------------------------------------------------------------------------------------------- exports


def test_full_export_loads_offline_in_sentence_transformers(distinct, full_export, monkeypatch):
    """One folder with every expert: sentence-transformers loads it without network (the module file ships in
    the folder) and encode(task=...) / encode_query / encode_document equal jaxembed per expert (<= 1e-5); the
    shared weights are stored once."""
    st = pytest.importorskip("sentence_transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, enc, embs = distinct
    m = st.SentenceTransformer(str(full_export), device="cpu", trust_remote_code=True)
    for e in EXPERTS:
        np.testing.assert_allclose(m.encode(SENTS, task=e), embs[e], atol=1e-5, rtol=0)
    np.testing.assert_allclose(m.encode(SENTS, task="Clustering"), embs["clustering"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(m.encode_document(SENTS), embs["search_document"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(m.encode(SENTS), embs[mote.DEFAULT_EXPERT], atol=1e-5, rtol=0)  # no task
    np.testing.assert_allclose(m.encode_query(SENTS), enc.encode(SENTS, task="query", prompt="query: "), atol=1e-5)
    with pytest.raises(ValueError, match="encode_query / encode_document"):
        m.encode(SENTS, task="retrieval")
    shared = loading.read_safetensors(full_export / "model.safetensors")
    experts = loading.read_safetensors(full_export / mote.WEIGHTS_FILE)
    per_expert = {k.split(".", 2)[2] for k in experts}
    assert len(experts) == 4 * len(per_expert) and per_expert < set(shared)  # FFN keys of the 6 layers, 4 experts
    assert not any("embeddings" in k or "attention.self" in k for k in per_expert)  # only the FFN (+ its LNs)
    assert json.loads((full_export / "modules.json").read_text())[0]["type"] == "jaxembed_mote.MoTETransformer"


def test_hf_load_reads_the_full_export_all_or_one_task(distinct, full_export):
    """jaxembed.loading.load gives back the MoTE model (same parameters); with task= only that task's experts are
    read and kept (memory: one task's experts), with the same embeddings."""
    model, enc, embs = distinct
    back = loading.load(full_export)
    assert back.model.config.mote == model.config.mote
    for a, b in zip(jax.tree.leaves(nnx.state(back.model, nnx.Param)), jax.tree.leaves(nnx.state(model, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    full = nnx.to_flat_state(nnx.state(model, nnx.Param))
    one = loading.load(full_export, task="clustering")
    assert one.model.config.mote.experts == ("clustering",)
    assert one.model.backbone.layers[5].ffn.experts.output.kernel.shape == (1, 1536, 384)
    two = loading.load(full_export, task="Retrieval")
    assert two.model.config.mote.experts == ("search_query", "search_document")
    for loaded, idx in ((one, [1]), (two, [2, 3])):  # exactly the task's expert slices, the rest shared
        for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(loaded.model, nnx.Param)), full):
            b = np.asarray(b[...])
            np.testing.assert_array_equal(np.asarray(a[...]), b[idx] if mote.is_expert_path(path) else b)
    enc2 = Encoder.from_loaded(two)
    with pytest.raises(UserError, match="not loaded"):
        enc2.encode(SENTS, task="clustering")
    with pytest.raises(UserError, match="say which"):
        enc2.encode(SENTS, task="retrieval")
    with pytest.raises(UserError, match="dense model"):
        Encoder(mote.extract_expert(model, "clustering"), enc.tokenizer).encode(SENTS, task="clustering")


def test_per_task_and_averaged_exports(distinct, full_export, minilm, tmp_path):
    """Per-task export: a plain dense folder (standard modules, no custom code) whose embeddings equal the JAX
    MoTE model's for that expert (<= 1e-5), also through the CLI from the full export. Expert averaging (App. B):
    a dense model of the original architecture with the mean of the experts."""
    st = pytest.importorskip("sentence_transformers")
    from jaxembed.cli import main

    model, enc, embs = distinct
    out = export.export_expert(model, minilm.tokenizer, tmp_path / "doc", "search_document")
    assert not (out / mote.CONFIG_FILE).exists()
    assert all(m["type"].startswith("sentence_transformers.") for m in json.loads((out / "modules.json").read_text()))
    np.testing.assert_allclose(st.SentenceTransformer(str(out), device="cpu").encode(SENTS), embs["search_document"],
                               atol=1e-5, rtol=0)
    assert main(["export", "--model", str(full_export), "--task", "clustering", "--out", str(tmp_path / "clu")]) == 0
    np.testing.assert_allclose(st.SentenceTransformer(str(tmp_path / "clu"), device="cpu").encode(SENTS),
                               embs["clustering"], atol=1e-5, rtol=0)
    with pytest.raises(UserError, match="search_query.*search_document"):  # two experts: not one dense model
        export.export_expert(model, minilm.tokenizer, tmp_path / "x", "retrieval")
    assert not (tmp_path / "x").exists()
    assert main(["export", "--model", str(full_export), "--average-experts", "--out", str(tmp_path / "avg")]) == 0
    avg = loading.load(tmp_path / "avg")
    assert getattr(avg.model.config, "mote", None) is None
    stack = np.asarray(model.backbone.layers[2].ffn.experts.intermediate.kernel[...])
    np.testing.assert_allclose(np.asarray(avg.model.backbone.layers[2].ffn.intermediate.kernel[...]),
                               stack.mean(0), atol=1e-7)
    ref = nnx.state(mote.average_experts(model), nnx.Param)  # the dense architecture, every parameter
    for a, b in zip(jax.tree.leaves(nnx.state(avg.model, nnx.Param)), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    npy = tmp_path / "q.npy"
    (tmp_path / "in.txt").write_text("\n".join(SENTS) + "\n")
    assert main(["encode", "--model", str(full_export), "--input", str(tmp_path / "in.txt"), "--out", str(npy),
                 "--task", "search_query", "-q"]) == 0
    np.testing.assert_allclose(np.load(npy), embs["search_query"], atol=1e-6, rtol=0)


# -------------------------------------------------------------------------------------- config and TA-CL


def test_mine_routes_queries_and_corpus_through_the_task_experts(distinct):
    """jaxembed mine with a MoTE reference model: retrieval queries go through search_query and the corpus through
    search_document (as in training); the result equals mining on those experts' embeddings, computed directly."""
    from jaxembed import mining

    model, enc, _ = distinct
    examples = [{"id": f"x{i}", "query": SENTS[i], "pos": [SENTS[(i + 3) % 6]], "neg": [SENTS[(i + 1) % 6]]}
                for i in range(3)]
    cfg = mining.MineConfig(top_k=6, window=(0, 6), num_negatives=2)
    res = mining.mine(enc, examples, cfg, progress=False, task="retrieval")
    assert res.report["mote_experts"] == {"task": "retrieval", "query": "search_query",
                                          "document": "search_document"}
    texts, _, _ = mining.build_corpus(examples)
    Q = enc.encode([e["query"] for e in examples], expert="search_query")
    D = enc.encode(texts, expert="search_document")
    ref = mining.mine_with_embeddings(examples, Q, texts, D, cfg)
    assert res.records == ref.records
    assert res.report["rank_histogram_all_positives"] == ref.report["rank_histogram_all_positives"]
    # an STS dataset: both sides through the classification expert
    sts = mining.mine(enc, examples, cfg, progress=False, task="sts")
    assert sts.report["mote_experts"]["query"] == sts.report["mote_experts"]["document"] == "classification"
    with pytest.raises(UserError, match="astrology. is neither an expert"):
        mining.mine(enc, examples, cfg, progress=False, task="astrology")


def test_spec_routing_and_config_errors(tmp_path):
    spec = mote.MoTESpec.build(6)
    assert spec.experts_for("retrieval") == ("search_query", "search_document")
    assert spec.expert_name("Reranking", "document") == "search_document"
    assert spec.expert_name("PairClassification") == spec.expert_name("sts") == "classification"
    assert spec.expert_name("query") == "search_query" and spec.expert_name(None) == "classification"
    assert spec.expert_for("clustering") == 1
    assert mote.mote_layers("every_other", 6) == (1, 3, 5)
    with pytest.raises(UserError, match="neither an expert"):
        spec.experts_for("bitext")
    q, d = mote.routing_tables(spec, ["wiki", "cls"], {"wiki": "retrieval", "cls": "classification"})
    assert q.tolist() == [2, 0] and d.tolist() == [3, 0]
    with pytest.raises(UserError, match=r"task 'x' \(task type 'clustering'\).*routing.clustering"):
        mote.routing_tables(mote.MoTESpec(("a",), (0,), (("retrieval", "a", "a"),), "a"), ["x"], {"x": "clustering"})

    def bad(key, value, match):
        c = cfglib.load_config_file(MOTE_CONFIG + ":tiny")
        cfglib.apply_overrides(c, [f"{key}={value}"])
        with pytest.raises(UserError, match=match):
            cfglib.validate(c)

    bad("model.mote.experts", "('a', 'b b')", "expert name 'b b'")
    bad("model.mote.placement", "middle", "every, every_other")
    bad("model.mote.routing.retrieval", "('search_query', 'nope')", "unknown expert 'nope'")
    bad("model.mote.default", "nope", "default")
    c = cfglib.load_config_file(MOTE_CONFIG + ":cpu")  # every shared dataset, trecqa (reranking) among them
    c.model.mote.routing = {k: v for k, v in c.model.mote.routing.items() if k != "reranking"}
    with pytest.raises(UserError, match=r"dataset 'trecqa' has task type 'reranking'.*routing.reranking ="):
        cfglib.validate(c)
    c.model.mote.routing["reranking"] = ("search_query", "search_document")
    back = cfglib.from_json(cfglib.to_json(c))
    assert dict(back.model.mote.routing) == dict(c.model.mote.routing)


def test_config_variants_and_ta_cl():
    """configs/mote.py: TA-CL per task type (batching, temperature), the static switch, EOB, IC."""
    c = cfglib.load_config_file(MOTE_CONFIG)
    cfglib.validate(c)
    by = {d.name: d for d in c.data.datasets}
    assert (by["wikiqa"].batching, by["wikiqa"].temperature) == ("homogeneous", 0.03)
    assert (by["sst2"].batching, by["sst2"].temperature, by["sst2"].task) == ("heterogeneous", 0.03, "classification")
    assert by["trec"].task == "classification"  # one heterogeneous unit across the classification datasets
    assert c.model.mote.enabled and c.model.mote.placement == "every"
    s = cfglib.load_config_file(MOTE_CONFIG + ":tiny,static")
    assert {(d.batching, d.temperature) for d in s.data.datasets} == {("heterogeneous", 0.03)}
    assert s.plan.steps == 4
    assert cfglib.load_config_file(MOTE_CONFIG + ":eob").model.mote.placement == "every_other"
    assert not cfglib.load_config_file(MOTE_CONFIG + ":ic").model.mote.enabled
    data = types.SimpleNamespace(datasets=[types.SimpleNamespace(name="news", task_type="clustering", task="news",
                                                                 batching=None, temperature=None)])
    mote.ta_cl(data)
    assert (data.datasets[0].batching, data.datasets[0].temperature, data.datasets[0].task) == \
        ("heterogeneous", 0.06, "clustering")
    with pytest.raises(UserError, match="unknown variant"):
        cfglib.load_config_file(MOTE_CONFIG + ":huge")


# ------------------------------------------------------------------------------------ training and routing


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, minilm_dir, shared_data):
    """configs/mote.py:tiny (the real shared data, TA-CL) on a tiny random BERT with MiniLM's tokenizer (one
    layer: routing and the routed optimizer treat every MoTE layer alike)."""
    from jaxembed.tokenizer import Tokenizer
    from jaxembed.train import train

    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=128))
    folder = tmp_path_factory.mktemp("tiny_bert")
    export.export(_random_model(cfg), Tokenizer.from_folder(minilm_dir, 64), folder)
    c = cfglib.load_config_file(MOTE_CONFIG + ":tiny")
    c.model.name = str(folder)
    for d in c.data.datasets:  # one length bucket, one compilation (the random model reads no meaning anyway)
        d.max_query_length = d.max_doc_length = 16
    wd = tmp_path_factory.mktemp("mote_tiny")
    return wd, train(c, wd)


def _ckpt(wd, step):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(wd.absolute() / "checkpoints") as mgr:
        return mgr.restore(step, args=ocp.args.StandardRestore())


def _expert_leaves(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
            if mote.is_expert_path(p)}


def test_train_step_updates_only_routed_experts(tiny_run):
    """A real run (configs/mote.py:tiny, shared data): between two checkpoints, the experts that no step routed
    to keep their weights and both Adam moments bit for bit; the routed experts' change. The export is the full
    MoTE folder."""
    from jaxembed.data.plan import Plan
    from jaxembed.data.store import Store

    wd, summary = tiny_run
    assert summary["status"] == "completed" and summary["step"] == 4 and summary["skipped"] == 0
    plan, store = Plan.load(wd / "plan.npz"), Store.open(wd / "store")
    spec = mote.MoTESpec.build(1)
    types_ = {d.task: d.task_type for d in store.datasets}
    q, d = mote.routing_tables(spec, list(plan.task_names), types_)
    a, b = _ckpt(wd, 2), _ckpt(wd, 4)
    routed = {int(x) for t in plan.task_ids[2:4] for x in (q[t], d[t])}
    assert routed and len(routed) < 4  # the check below has both kinds of expert
    assert spec.index("clustering") in routed  # the clustering sets (from classification files) train it
    leaves_a, leaves_b = _expert_leaves(a), _expert_leaves(b)
    kinds = {"['mu']": 0, "['nu']": 0, "['params']": 0}
    for key, x in leaves_a.items():
        if x.ndim == 0 or x.shape[0] != 4:
            continue
        for e in range(4):
            same = np.array_equal(x[e], leaves_b[key][e])
            assert same == (e not in routed), (key, e)
        kinds = {k: v + (k in key) for k, v in kinds.items()}
    assert all(kinds.values()), kinds  # weights and both moments were checked
    ec = [np.asarray(v) for k, v in jax.tree_util.tree_flatten_with_path(b["opt_state"])[0]
          if "expert_count" in jax.tree_util.keystr(k)]
    expected = [sum(e in {int(q[t]), int(d[t])} for t in plan.task_ids[:4]) for e in range(4)]
    assert [x.tolist() for x in ec] == [expected]
    back = loading.load(wd / "export")
    assert back.model.config.mote.experts == EXPERTS


def test_evaluation_and_mteb_route_by_task_type(tiny_run):
    """The local evaluators and the MTEB wrapper route retrieval / reranking queries and documents to their
    experts and symmetric tasks to classification, from the model's own routing."""
    from jaxembed.evaluate import evaluate

    wd, _ = tiny_run
    calls = []

    class Rec(Encoder):
        def encode(self, texts, **kw):
            calls.append(kw.get("expert"))
            return super().encode(texts, **kw)

    rec = Rec.from_loaded(loading.load(wd / "export"))
    evaluate(rec, ["WikiQA-dev", "STSBenchmark-dev"], max_examples=3)
    assert calls == ["search_query", "search_document", "classification"]
    mteb_types = pytest.importorskip("mteb.types")
    from jaxembed.evaluate import MTEBEncoder

    calls.clear()
    m = MTEBEncoder(rec)
    meta = types.SimpleNamespace(name="SomeRetrieval", type="Retrieval", prompt=None)
    for side in (mteb_types.PromptType.query, mteb_types.PromptType.document):
        m.encode([{"text": SENTS[:2]}], task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=side)
    m.encode([{"text": SENTS[:2]}], task_metadata=types.SimpleNamespace(name="C", type="Clustering", prompt=None),
             hf_split="test", hf_subset="default")
    assert calls == ["search_query", "search_document", "clustering"]
