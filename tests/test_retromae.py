"""RetroMAE pre-training: masking statistics, the decoder's first token is the sentence embedding (and the
decoder loss trains the encoder through it), learning on a fixed batch of real text, the job with resume, and
the exported encoder (jaxembed.loading.load and sentence-transformers give the trained encoder's embeddings)."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import paths
from jaxembed.errors import UserError
from jaxembed.pretrain import masking
from jaxembed.pretrain import retromae as rm

SPECIAL = (0, 100, 101, 102, 103)  # [PAD] [UNK] [CLS] [SEP] [MASK] of the BERT vocabulary
MASK_ID = 103
CONFIG = str(paths.REPO_ROOT / "configs" / "retromae.py")


def _ids(rows=256, length=64, seed=0):
    """[CLS] text [SEP] [PAD]... rows of random lengths, a few [UNK] inside the text."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, length), np.int32)
    mask = np.zeros((rows, length), np.int32)
    for r in range(rows):
        n = int(rng.integers(3, length + 1))
        ids[r, :n] = rng.integers(1000, 30000, n)
        ids[r, 0], ids[r, n - 1] = 101, 102
        if n > 4:
            ids[r, 2] = 100
        mask[r, :n] = 1
    return jnp.asarray(ids), jnp.asarray(mask)


@jax.jit
def _mask(key, ids, mask, ratio):
    special = jnp.asarray(SPECIAL, jnp.int32)
    can = masking.maskable(ids, mask, special)
    sel = masking.choose(key, can, ratio)
    new, labels = masking.corrupt(jax.random.fold_in(key, 1), ids, sel, mask_id=MASK_ID, vocab_size=30522,
                                  special_ids=special)
    return can, sel, new, labels


@pytest.mark.parametrize("ratio", [0.3, 0.5])
def test_masking_statistics(ratio):
    ids, mask = _ids()
    can, sel, new, labels = (np.asarray(x) for x in _mask(jax.random.key(0), ids, mask, ratio))
    ids_ = np.asarray(ids)
    n, k = can.sum(1), sel.sum(1)
    np.testing.assert_array_equal(k, np.where(n > 0, np.maximum(1, np.round(ratio * n)), 0))  # exact per row
    assert not np.any(sel & ~can)                                             # never padding / special tokens
    assert k.max() <= masking.max_selected(ids.shape[1], ratio)
    np.testing.assert_array_equal(labels, np.where(sel, ids_, masking.IGNORE))
    np.testing.assert_array_equal(new[~sel], ids_[~sel])                      # the rest is untouched
    to_mask = (new[sel] == MASK_ID).mean()
    kept = (new[sel] == ids_[sel]).mean()
    rand = 1 - to_mask - kept
    assert sel.sum() > 2000
    assert abs(to_mask - 0.8) < 0.03 and abs(kept - 0.1) < 0.03 and abs(rand - 0.1) < 0.03, (to_mask, kept, rand)
    replaced = new[sel & (new != MASK_ID) & (new != ids_)]
    assert not np.isin(replaced, SPECIAL).any()                               # random tokens are never special
    special_pos = np.isin(ids_, SPECIAL) | (np.asarray(mask) == 0)
    np.testing.assert_array_equal(new[special_pos], ids_[special_pos])
    assert abs(k.sum() / n.sum() - ratio) < 0.01                              # the ratio over the whole batch


def test_gather_selected_and_loss():
    h = jnp.arange(2 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 3)
    labels = jnp.asarray([[-1, 7, -1, 9, -1], [-1, -1, -1, -1, 4]])
    logits = jnp.zeros((2, 2, 10)).at[0, 0, 7].set(5.0)

    @jax.jit
    def f(h, labels, logits):
        hs, lab, valid = masking.gather_selected(h, labels, 2)
        return hs, lab, valid, masking.mlm_loss(logits, lab, valid)

    hs, lab, valid, (loss, acc, n) = f(h, labels, logits)
    np.testing.assert_array_equal(np.asarray(hs[0]), np.asarray(h[0, jnp.asarray([1, 3])]))
    np.testing.assert_array_equal(np.asarray(lab), [[7, 9], [4, 0]])
    np.testing.assert_array_equal(np.asarray(valid), [[True, True], [True, False]])
    ce = [np.log(9 + np.exp(5.0)) - 5.0, np.log(10), np.log(10)]
    assert float(n) == 3 and abs(float(loss) - np.mean(ce)) < 1e-5 and abs(float(acc) - 1 / 3) < 1e-6


def _tiny_retromae(seed=0):
    from jaxembed import models
    from jaxembed.pretrain.model import build_retromae

    cfg = models.config_from_hf(dict(model_type="bert", vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64))
    return build_retromae(cfg, 1, seed)


def test_decoder_sees_the_sentence_embedding_as_its_first_token():
    from jaxembed.pretrain.model import retromae_loss

    graphdef, params, rest = nnx.split(_tiny_retromae(), nnx.Param, ...)
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(1000, 30000, (4, 12)), jnp.int32).at[:, 0].set(101).at[:, -1].set(102)
    mask = jnp.ones_like(ids)
    sentence = jax.random.normal(jax.random.key(0), (4, 32))

    @jax.jit
    def probe(p):
        """Decoder outputs (as is, another first token, another sentence embedding) and d(decoder loss)/d(params)
        with the encoder's MLM loss switched off."""
        model = nnx.merge(graphdef, p, rest)
        outs = [model.decode(sentence, ids, mask), model.decode(sentence, ids.at[:, 0].set(7), mask),
                model.decode(sentence + 1.0, ids, mask)]
        kw = dict(special_ids=SPECIAL, mask_id=MASK_ID, dropout=False, encoder_weight=0.0, decoder_weight=1.0)
        return outs, jax.grad(
            lambda q: retromae_loss(nnx.merge(graphdef, q, rest), ids, mask, jax.random.key(3), **kw)[0])(p)

    (d, d_first, d2), g = probe(params)
    d, d_first, d2 = (np.asarray(x) for x in (d, d_first, d2))
    # the first input token is replaced: whatever it was, the decoder's output is the same
    np.testing.assert_array_equal(d, d_first)
    # ... by the sentence embedding: another embedding changes the output at every position
    assert np.all(np.abs(d2 - d).max(axis=-1) > 1e-4)
    g = nnx.to_pure_dict(g)
    # the decoder loss alone (encoder MLM weight 0) trains the encoder's transformer layer, which reaches the
    # decoder only through the sentence embedding (the decoder shares the embedding layer, not the layers)
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g["encoder"]["layers"][0])) > 1e-6
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g["encoder_head"])) == 0.0
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g["decoder"])) > 1e-6
    assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(g["encoder"]["embeddings"])) > 1e-6


def test_packed_encoder_gives_the_padded_loss_and_gradients():
    """data.packing: the encoder on the packed rows of the batch's texts (2 shards, several texts per row), the
    loss and every gradient equal to the padded rows' (the masks are drawn on the padded rows in both)."""
    from jaxembed.pretrain import data as datalib
    from jaxembed.pretrain.model import retromae_loss

    graphdef, params, rest = nnx.split(_tiny_retromae(), nnx.Param, ...)
    rng = np.random.default_rng(1)
    lengths = rng.integers(5, 16, 8)
    seqs = [np.r_[101, rng.integers(1000, 30000, n - 2), 102].astype(np.int32) for n in lengths]
    ids = np.zeros((8, 16), np.int32)
    for i, x in enumerate(seqs):
        ids[i, :len(x)] = x
    mask = (ids != 0).astype(np.int32)
    pack = datalib.encoder_pack(seqs, 2, 3, 32)  # 2 shards of 4 texts in 3 rows of 32 slots
    assert pack["pack_segment_ids"].shape == (6, 32) and pack["pack_segment_ids"].max() >= 2
    kw = dict(special_ids=SPECIAL, mask_id=MASK_ID, dropout=False)

    def loss(p, pk):
        return retromae_loss(nnx.merge(graphdef, p, rest), ids, mask, jax.random.key(5), pack=pk, shards=2, **kw)[0]

    l0, g0 = jax.jit(jax.value_and_grad(lambda p: loss(p, None)))(params)
    l1, g1 = jax.jit(jax.value_and_grad(lambda p: loss(p, pack)))(params)
    assert abs(float(l1) - float(l0)) < 1e-5
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
    shapes = datalib.packed_shapes(datalib.BatchSchedule(rng.integers(5, 60, 200), 8, 0), 20, 2, (16, 32, 64),
                                   hidden_size=32)
    assert shapes[0] == 64 and len(set(shapes[1].tolist())) <= 8  # one row length, a few row counts


def _tiny(**over):
    cfg = cfglib.load_config_file(CONFIG + ":tiny")
    return cfglib.apply_overrides(cfg, [f"{k}={v}" for k, v in over.items()])


def test_config_errors(shared_data):
    with pytest.raises(UserError, match=r"config.retromae.decoder_mask_ratio = 1.5 is not valid"):
        rm.validate(_tiny(**{"retromae.decoder_mask_ratio": 1.5}))
    with pytest.raises(UserError, match=r"config.model.init = 'bogus'.*pretrained, random"):
        rm.validate(_tiny(**{"model.init": "bogus"}))
    with pytest.raises(UserError, match=r"data.paths\[0\]"):
        rm.validate(_tiny(**{"data.paths": "('/nonexistent.jsonl',)"}))
    with pytest.raises(UserError, match=r"model.overrides.*only used with model.init='random'"):
        rm.validate(_tiny(**{"model.init": "pretrained"}))


def test_data_reading_and_batches(tmp_path):
    from jaxembed.pretrain import data as datalib

    f = tmp_path / "d.jsonl"
    f.write_text('{"query": "a question here", "pos": ["an answer", "another answer"], "neg": ["a wrong one"]}\n'
                 '{"text": "an answer"}\n'
                 'not json\n'
                 '{"other": 1}\n'
                 '{"text": 5}\n')
    (tmp_path / "t.txt").write_text("plain line one\n\nplain line two\n")
    texts, rep = datalib.read_texts([str(f), str(tmp_path / "t.txt")], ("text", "query", "pos", "neg"))
    assert texts == ["a question here", "an answer", "another answer", "a wrong one", "plain line one",
                     "plain line two"]
    assert rep["duplicates"] == 1 and rep["records"] == 8
    assert rep["skipped"] == {"invalid JSON": 1, "no text field (text, query, pos, neg)": 2,
                              "field 'text' holds a int, not a string": 1, "blank line": 1}
    lengths = np.random.default_rng(0).integers(5, 60, 100)
    s = datalib.BatchSchedule(lengths, 8, seed=3, window=4)
    ep = s.epoch_batches(0)
    assert ep.shape == (12, 8) and len(np.unique(ep)) == 96                  # no text twice in an epoch
    again = datalib.BatchSchedule(lengths, 8, seed=3, window=4)
    np.testing.assert_array_equal(again.indices(13), s.indices(13))           # a pure function of the step
    spread = np.mean([np.ptp(lengths[b]) for b in ep])
    assert spread < 0.5 * np.ptp(lengths)                                     # similar lengths share a batch


def test_texts_of_invisible_characters_count_as_empty(tmp_path):
    """Pre-training skips and counts a text of only zero-width characters, NUL or a byte-order mark as it does a
    whitespace-only one ("empty text"): each would be encoded as the special tokens alone."""
    from jaxembed.pretrain import data as datalib

    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["a text", "   ", "\u200b", "\u0000", "\ufeff",
                                                                   "\u200c\u200d \u2060", "\u200bok"]))
    (tmp_path / "t.txt").write_text("plain line\n\u200b\u200b\n", encoding="utf-8")
    texts, rep = datalib.read_texts([str(f), str(tmp_path / "t.txt")], ("text",))
    assert texts == ["a text", "\u200bok", "plain line"]
    assert rep["skipped"] == {"empty text": 6}


@pytest.fixture(scope="module")
def job(shared_data, minilm_dir, tmp_path_factory):
    """The :tiny job through the CLI (4 steps, checkpoints at 2 and 4), and the same job paused after 2 steps
    and resumed."""
    from jaxembed.cli import main

    root = tmp_path_factory.mktemp("retromae")
    assert main(["pretrain", "retromae", "--config", CONFIG + ":tiny", "--workdir", str(root / "a")]) == 0
    paused = rm.pretrain(_tiny(), root / "b", max_steps=2)
    resumed = rm.pretrain(_tiny(), root / "b")
    return root, paused, resumed


def test_loss_decreases_on_a_fixed_batch_of_real_text(job, tmp_path):
    """The :tiny model (dropout on) on one fixed batch of 8 wikiqa texts, 25 steps: both MLM losses fall from
    ~ln(30522) = 10.3 nats (uniform over the vocabulary). Same compiled step as the job (no new compilation)."""
    run = rm.setup(_tiny(), tmp_path / "fixed")
    state = rm.init_state(run)
    step = rm.make_train_step(run)
    batch = rm.batch_at(run, 0)
    assert batch["input_ids"].shape == (8, 32)
    batch = rm.to_device(run, batch)
    enc, dec = [], []
    for _ in range(25):
        state, m = step(state, batch)
        enc.append(float(m["enc_loss"]))
        dec.append(float(m["dec_loss"]))
    print("enc", [round(x, 2) for x in enc], "\ndec", [round(x, 2) for x in dec])
    assert np.isfinite(enc + dec).all()
    assert enc[0] > 9.5 and dec[0] > 9.5
    assert np.mean(enc[-3:]) < enc[0] - 2.0 and np.mean(dec[-3:]) < dec[0] - 2.0


def _params(workdir, step):
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(Path(workdir).absolute() / "checkpoints") as mgr:
        return mgr.restore(step, args=ocp.args.StandardRestore())["params"]


def test_job_run_directory_and_resume(job):
    root, paused, resumed = job
    a = root / "a"
    for f in ("config.json", "config.txt", "data_report.json", "metrics.jsonl", "summary.json", "export"):
        assert (a / f).exists(), f
    assert list((a / "tensorboard").iterdir())
    rep = json.loads((a / "data_report.json").read_text())
    assert rep["read"]["texts"] == 512 and rep["tokenized"]["kept"] + rep["tokenized"]["too_short"] == 512
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4] and all(np.isfinite(r["loss"]) for r in rows)
    assert {"enc_loss", "dec_loss", "enc_acc", "dec_acc", "lr", "grad_norm", "tokens_per_s"} <= set(rows[0])
    assert paused["status"] == "paused" and paused["step"] == 2 and "export" not in paused
    assert resumed["status"] == "completed" and resumed["step"] == 4
    b_rows = [json.loads(x)["step"] for x in (root / "b" / "metrics.jsonl").read_text().splitlines()]
    assert b_rows == [2, 4]                                   # the resumed run went on from step 2
    pa, pb = _params(a, 4), _params(root / "b", 4)
    for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))   # == an uninterrupted run, bit for bit
    with pytest.raises(UserError, match="different config: train.steps 4 -> 6 "):  # the key, with both values
        rm.pretrain(_tiny(**{"train.steps": 6}), root / "b")


def test_exported_encoder_loads_with_identical_embeddings(job, minilm_dir):
    from jaxembed import loading
    from jaxembed.encode import Encoder

    root, _, _ = job
    run = rm.setup(_tiny(), root / "a")
    params = _params(root / "a", 4)
    trained = rm.encoder_model(run, params)
    loaded = loading.load(root / "a" / "export")
    assert loaded.model.head.pooling == "cls" and loaded.model.head.normalize
    want = jax.tree.leaves(nnx.to_pure_dict(nnx.split(trained.backbone, nnx.Param, ...)[1]))
    got = jax.tree.leaves(nnx.to_pure_dict(nnx.split(loaded.model.backbone, nnx.Param, ...)[1]))
    assert len(want) == len(got)
    for x, y in zip(want, got):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    texts = ["how are glacier caves formed ?", "A glacier cave is a cave formed within the ice of a glacier .",
             "The stock market fell sharply on Monday."]
    enc = Encoder.from_loaded(loaded)
    ours = enc.encode(texts, progress=False)
    enc.set_model(trained)                                    # the same compiled encoder, the trained weights
    ref = enc.encode(texts, progress=False)
    np.testing.assert_array_equal(ours, ref)
    st = pytest.importorskip("sentence_transformers")
    emb = st.SentenceTransformer(str(root / "a" / "export"), device="cpu").encode(texts)
    np.testing.assert_allclose(emb, ref, atol=1e-5)
