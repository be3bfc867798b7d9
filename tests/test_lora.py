"""LoRA (jaxembed.lora, docs/lora.md): adapters on tiny random models, checked against PEFT + transformers and
sentence-transformers in PyTorch, and in a real (tiny) training run.

- Parity: the adapter exported as a PEFT folder, loaded on the base model by ``peft.PeftModel`` (+ our pooling in
  torch), by ``SentenceTransformer(adapter folder)`` and by ``SentenceTransformer(base).load_adapter``, and the
  merged folder in sentence-transformers, all give our embeddings within 1e-5 in float32 (BERT, Qwen2, Gemma 3).
- A training run (packed batches, the default): the train state holds the adapters and their optimizer state only,
  the base weights stay bit for bit, the merged export is W0 + (alpha / r) A B, the trained adapter (B != 0) matches
  PEFT, a resumed run ends bit for bit where the straight one did, and a changed base folder stops the resume.
- A bfloat16 base (model.lora.base_dtype): half the base's bytes, float32 adapters and moments, the losses of the
  float32 base within 1 %, a float32 merged export of the rounded base + (alpha / r) A B.
- MoTE + gradient cache: adapters per expert, only the routed experts' adapters and moments move; the cached step
  equals the plain one.
- Config errors are one line, before any work (a target that matches nothing lists real paths).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError

TEXTS = ["a short one", "a test sentence that is a good deal longer than the first one, with a comma",
         "Instruct: retrieve answers \n Query: what is LoRA?"]
TOL = 1e-5


def _torch_embed(model, tokenizer, texts, pooling="mean"):
    """Mean-pooled, L2-normalised last hidden states of a transformers (or PEFT) model."""
    import torch

    enc = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    assert pooling == "mean"
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()


def _peft_checks(base: Path, folder: Path, ours: np.ndarray, n_adapters: int, merged: Path | None = None) -> dict:
    """Max |difference| to ``ours`` of every PyTorch way to load the adapter folder (and the merged folder)."""
    from peft import PeftModel
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    pm = PeftModel.from_pretrained(AutoModel.from_pretrained(str(base)), str(folder)).eval()
    assert sum(1 for _, m in pm.named_modules() if "default" in getattr(m, "lora_A", {})) == n_adapters
    out = {"peft+transformers": np.abs(_torch_embed(pm, AutoTokenizer.from_pretrained(str(base)), TEXTS) - ours)}
    out["st(adapter folder)"] = np.abs(SentenceTransformer(str(folder), device="cpu").encode(TEXTS) - ours)
    st = SentenceTransformer(str(base), device="cpu")
    st.load_adapter(str(folder))
    out["st(base).load_adapter"] = np.abs(st.encode(TEXTS) - ours)
    if merged is not None:
        out["st(merged folder)"] = np.abs(SentenceTransformer(str(merged), device="cpu").encode(TEXTS) - ours)
    return {k: float(v.max()) for k, v in out.items()}


@pytest.mark.parametrize("arch", ["bert", "qwen2", "gemma3"])
def test_peft_and_sentence_transformers_parity(arch, tmp_path):
    """Random adapters (B != 0) on a tiny model: the PEFT folder and the merged folder give our embeddings."""
    pytest.importorskip("peft")
    from jaxembed import export, loading, lora
    from jaxembed.encode import Encoder
    from jaxembed.models.tiny import tiny_model_dir

    base = tiny_model_dir(arch)
    loaded = loading.load(base)
    spec = lora.LoRASpec(rank=4, alpha=8.0)
    picked = lora.apply(loaded.model, spec, seed=0)
    assert len(picked) == 2 * 7 if arch != "bert" else len(picked) == 2 * 6  # q k v o + the MLP, every layer
    for layer in lora.adapters(loaded.model).values():
        layer.lora_b.value = 0.2 * jax.random.normal(jax.random.key(layer.uid), layer.lora_b.shape)
    ours = Encoder(loaded.model, loaded.tokenizer).encode(TEXTS)
    plain = Encoder.from_loaded(loading.load(base)).encode(TEXTS)
    assert np.abs(ours - plain).max() > 100 * TOL  # the adapters move the embeddings
    export.export_lora(loaded.model, loaded.tokenizer, tmp_path / "out", spec=spec, base=str(base), kind="both")
    cfg = json.loads((tmp_path / "out" / "adapter" / "adapter_config.json").read_text())
    assert (cfg["peft_type"], cfg["r"], cfg["lora_alpha"], cfg["base_model_name_or_path"]) == ("LORA", 4, 8, str(base))
    assert not (tmp_path / "out" / "adapter" / "model.safetensors").exists()  # no base weights in the adapter
    diffs = _peft_checks(base, tmp_path / "out" / "adapter", ours, len(picked), merged=tmp_path / "out")
    print(f"{arch} parity (max |diff|, float32): {diffs}")
    assert max(diffs.values()) <= TOL, diffs


def test_target_modules_name_exactly_the_adapted_layers():
    """PEFT's target_modules: short suffixes when they pick exactly the adapted modules, else the full names."""
    from jaxembed import lora

    every = [f"layers.{i}.{m}" for i in range(12) for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj")]
    assert lora.target_modules([m for m in every if "q_proj" in m], every) == ["self_attn.q_proj"]
    one = ["layers.1.self_attn.q_proj"]
    assert lora.target_modules(one, every) == ["layers.1.self_attn.q_proj"]  # not the bare "1.self_attn.q_proj"
    bert = [f"encoder.layer.{i}.{m}" for i in range(2) for m in ("attention.output.dense", "output.dense")]
    assert lora.target_modules([m for m in bert if "attention" not in m], bert + ["pooler.dense"]) == \
        ["layer.0.output.dense", "layer.1.output.dense"]  # "output.dense" would pick attention.output.dense


def test_lora_dropout_in_train_mode_only():
    """The adapters' dropout acts with deterministic=False and rngs (train.dropout), and only on the adapter path
    (Qwen2's attention dropout is 0: the base model is deterministic either way)."""
    from flax import nnx

    from jaxembed import loading, lora
    from jaxembed.models.tiny import tiny_model_dir

    ids = np.arange(1, 17, dtype=np.int32).reshape(2, 8) + 100
    mask = np.ones_like(ids)

    def run(rate, deterministic, seed=0):
        loaded = loading.load(tiny_model_dir("qwen2"))
        lora.apply(loaded.model, lora.LoRASpec(rank=4, alpha=8.0, dropout=rate), seed=0)
        for layer in lora.adapters(loaded.model).values():
            layer.lora_b.value = 0.2 * jax.random.normal(jax.random.key(layer.uid), layer.lora_b.shape)
        return np.asarray(loaded.model(ids, mask, deterministic=deterministic,
                                       rngs=nnx.Rngs(dropout=seed)))

    ref = run(0.0, True)
    np.testing.assert_array_equal(run(0.5, True), ref)       # eval mode: no dropout
    np.testing.assert_array_equal(run(0.0, False), ref)      # no LoRA dropout: train mode changes nothing here
    a, b = run(0.5, False, 0), run(0.5, False, 1)
    assert np.abs(a - ref).max() > 1e-3 and np.abs(a - b).max() > 1e-3  # masks drawn, a new key per call
    np.testing.assert_array_equal(a, run(0.5, False, 0))     # the same key: the same masks


# ------------------------------------------------------------------------------------------ config errors


def _base_config(model_dir, data: Path, **lora_kw):
    from jaxembed.data.config import dataset_config

    c = cfglib.default_config()
    c.model.name = str(model_dir)
    c.model.max_length = 64
    c.model.lora.enabled = True
    c.model.lora.rank = 4
    for k, v in lora_kw.items():
        c.model.lora[k] = v
    c.data.datasets = [
        dataset_config(name="stsb", path=str(data / "train/stsb_pairs.jsonl"), format="scored_pairs",
                       task_type="sts", score_threshold=3.0, num_negatives=0, max_query_length=16, max_doc_length=16),
        dataset_config(name="wikiqa", path=str(data / "train/wikiqa.jsonl"), task_type="retrieval", num_negatives=1,
                       max_query_length=16, max_doc_length=16)]
    c.plan.global_batch_size = 8
    c.optim.lr = 1e-2
    c.train.progress = False
    return c


@pytest.mark.parametrize("key,value,match", [
    ("rank", 0, r"config\.model\.lora\.rank = 0 is not valid: an integer >= 1"),
    ("alpha", -1.0, r"config\.model\.lora\.alpha = -1\.0 is not valid: a positive number"),
    ("dropout", 1.0, r"config\.model\.lora\.dropout = 1\.0 is not valid: a probability in \[0, 1\)"),
    ("export", "peft", r"config\.model\.lora\.export = 'peft' is not valid: allowed: merged, adapter, both"),
    ("target", "q_proj(", r"config\.model\.lora\.target = 'q_proj\(' is not valid: a regular expression"),
    ("base_dtype", "float16", r"config\.model\.lora\.base_dtype = 'float16' is not valid: allowed: float32, bfloat16"),
])
def test_bad_lora_values_are_one_line_errors(key, value, match, shared_data):
    from jaxembed.models.tiny import tiny_model_dir

    c = _base_config(tiny_model_dir("qwen2"), shared_data, **{key: value})
    with pytest.raises(UserError, match=match) as e:
        cfglib.validate(c)
    assert "\n" not in str(e.value)


def test_lora_dropout_needs_train_mode(shared_data):
    from jaxembed.models.tiny import tiny_model_dir

    c = _base_config(tiny_model_dir("qwen2"), shared_data, dropout=0.1)
    c.train.dropout = False
    with pytest.raises(UserError, match=r"lora\.dropout = 0\.1 acts only in train mode.*fix: set train\.dropout=True"):
        cfglib.validate(c)


def test_a_target_that_matches_nothing_stops_before_any_work(shared_data, tmp_path):
    """One line listing real paths, raised by setup before the run directory gets a config (or a store)."""
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import setup

    c = _base_config(tiny_model_dir("qwen2"), shared_data, target=r"self_attn\.q_proj")  # HF's name, not ours
    with pytest.raises(UserError, match=r"config\.model\.lora\.target = 'self_attn\\\\.q_proj' matches no linear "
                                        r"layer of the model, e\.g\. backbone\.layers\.0\.attention\.") as e:
        setup(c, tmp_path / "run")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "config.json").exists() and not (tmp_path / "run" / "store").exists()


# ------------------------------------------------------------------------------------------ a training run

STEPS = 4


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, shared_data):
    """4 LoRA steps on a tiny random 1-layer BERT (a copy, so that a test can change it), packed batches, a
    checkpoint every 2 steps, export both (merged + adapter)."""
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import train

    root = tmp_path_factory.mktemp("lora_run")
    base = root / "base"
    shutil.copytree(tiny_model_dir("bert", num_layers=1), base)
    c = _base_config(base, shared_data, export="both", alpha=8.0)
    c.plan.steps = STEPS
    c.train.checkpoint_every = 2
    c.train.log_every = 1
    assert cfglib.packing_enabled(c)
    summary = train(c.copy_and_resolve_references(), root / "run")
    assert summary["status"] == "completed" and summary["step"] == STEPS and summary["skipped"] == 0
    return c, root / "run", base


def _checkpoint(workdir: Path, step: int) -> dict:
    import orbax.checkpoint as ocp

    with ocp.CheckpointManager(workdir.absolute() / "checkpoints") as mgr:
        return mgr.restore(step, args=ocp.args.StandardRestore())


def _flat(tree) -> dict:
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def test_lora_run_trains_the_adapters_only(lora_run):
    from safetensors.numpy import load_file

    from jaxembed import loading, lora
    from jaxembed.encode import Encoder

    c, wd, base = lora_run
    state = _checkpoint(wd, STEPS)
    params = _flat(state["params"])
    assert params and all(k.endswith(("['lora_a']", "['lora_b']")) for k in params), list(params)[:4]
    n_adapters = len(params) // 2
    assert n_adapters == 6  # BERT: query, key, value, attention output, intermediate, output
    adapter_size = sum(v.size for v in params.values())
    moments = [v for v in _flat(state["opt_state"]).values() if v.ndim >= 1]
    assert sum(v.size for v in moments) == 2 * adapter_size  # Adam's mu and nu of the adapters, nothing else
    assert all(np.abs(v).max() > 0 for k, v in params.items() if k.endswith("['lora_b']"))  # B moved off 0
    assert json.loads((wd / lora.BASE_FILE).read_text())["source"] == str(base)

    # the merged export: the base weights bit for bit, adapted kernels W0 + (alpha / r) A B
    w0, w1 = load_file(str(base / "model.safetensors")), load_file(str(wd / "export" / "model.safetensors"))
    assert w0.keys() == w1.keys()
    adapted = {"attention.self.query": ("attention", "query"), "attention.self.key": ("attention", "key"),
               "attention.self.value": ("attention", "value"), "attention.output.dense": ("attention", "output"),
               "intermediate.dense": ("ffn", "intermediate"), "output.dense": ("ffn", "output")}
    seen = 0
    for key in w0:
        layer, rest = (key.split(".")[2], ".".join(key.split(".")[3:])) if key.startswith("encoder.layer.") \
            else (None, key)
        hit = adapted.get(rest[: -len(".weight")]) if layer is not None and rest.endswith(".weight") else None
        if hit is None:
            np.testing.assert_array_equal(w1[key], w0[key], err_msg=key)
            continue
        p = f"['backbone']['layers']['{layer}']['{hit[0]}']['{hit[1]}']"  # orbax keys a list index as a string
        delta = 2.0 * params[p + "['lora_a']"] @ params[p + "['lora_b']"]  # alpha / r = 8 / 4
        np.testing.assert_allclose(w1[key] - w0[key], delta.T, atol=1e-6, err_msg=key)
        seen += 1
    assert seen == n_adapters

    # the trained adapter on its base, in PyTorch: our embeddings
    ours = Encoder.from_loaded(loading.load(wd / "export")).encode(TEXTS)
    diffs = _peft_checks(base, wd / "export" / "adapter", ours, n_adapters)
    print(f"trained BERT adapter parity (max |diff|, float32): {diffs}")
    assert max(diffs.values()) <= TOL, diffs
    prompts = lambda d: json.loads((d / "config_sentence_transformers.json").read_text())["prompts"]  # noqa: E731
    assert prompts(wd / "export" / "adapter") == prompts(wd / "export") and "wikiqa-query" in prompts(wd / "export")


def _card(path: Path) -> tuple[dict, str]:
    """(front matter, body) of a README.md whose front matter the hub accepts (tests/fake_hub_server.py)."""
    import re

    import yaml

    from fake_hub_server import front_matter_errors

    text = path.read_text(encoding="utf-8")
    assert front_matter_errors(text) == []
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    return yaml.safe_load(m.group(1)), m.group(2)


def _files(folder: Path, leave_out=("README.md", "jaxembed_export.json")) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in leave_out}


def test_lora_export_layout_and_cards(lora_run):
    """export 'both': the merged model is the export folder, the PEFT adapter its adapter/; each has its card, whose
    usage snippet loads that folder (run here for the adapter: the base model, then the adapter)."""
    from jaxembed import export

    _, wd, base = lora_run
    out = wd / "export"
    assert (out / "model.safetensors").is_file() and (out / "adapter" / "adapter_config.json").is_file()
    assert export.loadable_folder(out) == out
    meta, body = _card(out / "README.md")
    assert body.startswith("\n# base fine-tuned with LoRA on stsb and wikiqa\n") and "lora" in meta["tags"]
    assert "`bert`, 1 layer, hidden size" in body  # the 1-layer model
    assert "The LoRA adapter alone (PEFT, no base weights) is in the subfolder `adapter/`." in body
    meta, body = _card(out / "adapter" / "README.md")
    assert body.startswith("\n# LoRA adapter for base, trained on stsb and wikiqa\n")
    assert {"lora", "peft"} <= set(meta["tags"]) and "base_model" not in meta  # a local base: no hub id
    code = body.split("## Usage\n\n```python\n", 1)[1].split("```", 1)[0]
    assert f"SentenceTransformer({str((out / 'adapter').resolve())!r})" in code and repr(str(base)) in code
    scope: dict = {}
    exec(code, scope)
    assert scope["emb"].shape == (2, 32)


def test_adapter_only_export_is_the_adapter_folder_and_pushes_it(lora_run, tmp_path, monkeypatch, capsys, caplog):
    """model.lora.export='adapter': `jaxembed export --workdir` writes the adapter in adapter/ (the files of the
    'both' export's adapter/) and nothing else but a README.md saying so; --push-to-hub uploads the
    adapter folder, whose card names the repository and passes the hub's checks."""
    from huggingface_hub import constants

    from fake_hub_server import FakeHub
    from jaxembed import cli

    _, wd, _ = lora_run
    copy = tmp_path / "run"
    shutil.copytree(wd, copy, ignore=shutil.ignore_patterns("export", "tensorboard"))
    cfg = json.loads((copy / "config.json").read_text())
    cfg["model"]["lora"]["export"] = "adapter"
    (copy / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    with FakeHub(token="hf_test") as hub:
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        rc = cli.main(["export", "--workdir", str(copy), "--out", str(out), "--push-to-hub", "org/tiny-adapter"])
        said = capsys.readouterr()
        assert rc == 0, said.err
        pushed = hub.files("org/tiny-adapter", "main")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter", "jaxembed_export.json"]
    assert "`adapter/` is the PEFT adapter" in (out / "README.md").read_text()
    leave_out = ("README.md", "tokenizer.json")  # the trainer's export keeps the tokenizer's last truncation
    assert _files(out / "adapter", leave_out) == _files(wd / "export" / "adapter", leave_out)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert pushed == _files(out / "adapter", leave_out=())  # the adapter folder is the repository
    assert f"exported to {out}: the LoRA adapter alone, in {out / 'adapter'}" in said.out
    assert f"pushed {out / 'adapter'} to {hub.url}/org/tiny-adapter" in said.out
    meta, body = _card(out / "adapter" / "README.md")
    assert body.startswith("\n# org/tiny-adapter\n") and "SentenceTransformer('org/tiny-adapter')" in body
    # the tiny base is a local folder without a hub id: its path stays in the config, and the push says so
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        cfg["model"]["name"])
    assert "org/tiny-adapter: the adapter's base model is the local folder" in caplog.text


def test_a_pushed_adapter_names_its_base_by_hub_id(minilm_dir, tmp_path, caplog):
    """adapter_config.json's base_model_name_or_path (where PEFT and sentence-transformers load the base from): the
    folder as given for a local export (it loads offline), the hub id for an adapter to be pushed where the base has
    one (the bundled all-MiniLM-L6-v2, a hub cache folder); a local base without one stays a path, with a warning."""
    from jaxembed.base_model import adapter_base

    assert adapter_base(str(minilm_dir), None) == str(minilm_dir)
    assert adapter_base(str(minilm_dir), "org/x") == "sentence-transformers/all-MiniLM-L6-v2"
    snap = tmp_path / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    assert adapter_base(str(snap), "org/x") == "BAAI/bge-small-en-v1.5"
    assert adapter_base("BAAI/bge-small-en-v1.5", "org/x") == "BAAI/bge-small-en-v1.5"
    assert not caplog.records
    with caplog.at_level("WARNING", logger="jaxembed.base_model"):
        assert adapter_base(str(tmp_path), "org/x") == str(tmp_path)
    assert "has no hub id, so users of the hub cannot load the adapter" in caplog.text


def test_lora_resume_is_bitwise_and_needs_the_same_base(lora_run, tmp_path):
    from jaxembed.train import train

    c, wd, base = lora_run
    wd2 = tmp_path / "resumed"
    shutil.copytree(wd, wd2, ignore=shutil.ignore_patterns("summary.json", "tensorboard", "export"))
    shutil.rmtree(wd2 / "checkpoints" / str(STEPS))
    c2 = c.copy_and_resolve_references()
    c2.export.at_end = False
    assert train(c2, wd2)["step"] == STEPS
    a, b = _checkpoint(wd, STEPS), _checkpoint(wd2, STEPS)
    fa, fb = _flat(a), _flat(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)

    # the checkpoints hold the adapters only: a resume on changed base weights is refused, in one line
    shutil.rmtree(wd2 / "checkpoints" / str(STEPS))
    weights = base / "model.safetensors"
    original = weights.read_bytes()
    try:
        from safetensors.numpy import load_file, save_file

        w = load_file(str(weights))
        w["encoder.layer.0.output.dense.bias"] = w["encoder.layer.0.output.dense.bias"] + 1e-3
        save_file(w, str(weights))
        with pytest.raises(UserError, match=r"lora_base\.json: the base model's weights changed since the run "
                                            r"started .*fix: restore the base model folder") as e:
            train(c2, wd2)
        assert "\n" not in str(e.value)
    finally:
        weights.write_bytes(original)


def test_a_bfloat16_base_halves_the_base_and_merges_in_float32():
    """model.lora.base_dtype=bfloat16: the frozen base weights take half the bytes, the adapters stay float32; the
    merged model is float32, its kernels the rounded base + (alpha / r) A B, and it computes what the adapted
    model computes."""
    from flax import nnx

    from jaxembed import loading, lora
    from jaxembed.models.tiny import tiny_model_dir

    ids = np.arange(1, 17, dtype=np.int32).reshape(2, 8) + 100
    sizes = {}
    for dt in lora.BASE_DTYPES:
        model = loading.load(tiny_model_dir("qwen2")).model
        w0 = np.asarray(model.backbone.layers[0].attention.q_proj.kernel[...])
        lora.apply(model, lora.LoRASpec(rank=4, alpha=8.0, base_dtype=dt))
        _, adapters, base, _ = nnx.split(model, lora.TRAINABLE, nnx.Param, ...)
        assert {x.dtype for x in jax.tree.leaves(adapters)} == {np.dtype("float32")}
        assert {str(x.dtype) for x in jax.tree.leaves(base)} == {dt}
        sizes[dt] = sum(x.nbytes for x in jax.tree.leaves(base))
        for layer in lora.adapters(model).values():
            layer.lora_b.value = 0.2 * jax.random.normal(jax.random.key(layer.uid), layer.lora_b.shape)
        merged = lora.merged(model)
        assert {x.dtype for x in jax.tree.leaves(nnx.state(merged, nnx.Param))} == {np.dtype("float32")}
        q = lora.adapters(model)["backbone.layers.0.attention.q_proj"]
        want = w0.astype(dt).astype(np.float32) + lora.delta(q)
        np.testing.assert_array_equal(np.asarray(merged.backbone.layers[0].attention.q_proj.kernel[...]), want)
    mask = np.ones_like(ids)  # the bfloat16 base's merged model computes what the adapted one does
    np.testing.assert_allclose(np.asarray(merged(ids, mask)), np.asarray(model(ids, mask)), atol=1e-6)
    assert sizes["bfloat16"] * 2 == sizes["float32"]


def test_a_bfloat16_base_trains_like_the_float32_base_and_exports_float32(lora_run, tmp_path):
    """The run of ``lora_run`` with model.lora.base_dtype=bfloat16: the step takes the base in bfloat16 (half the
    bytes), the adapters and their moments stay float32, each step's loss is finite and within 1 % of the
    float32-base run's, and the merged export is float32: the rounded base + (alpha / r) A B, which loads and
    encodes as the trained model does."""
    from safetensors.numpy import load_file

    from jaxembed import loading
    from jaxembed.encode import Encoder
    from jaxembed.train import train

    c, wd, base = lora_run
    c2 = c.copy_and_resolve_references()
    c2.model.lora.base_dtype = "bfloat16"
    c2.model.lora.export = "merged"
    c2.train.checkpoint_every = 0
    wd2 = tmp_path / "bf16"
    assert train(c2, wd2)["skipped"] == 0
    losses = [[json.loads(x)["loss"] for x in (w / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
              for w in (wd, wd2)]
    print(f"step losses, float32 base: {losses[0]}; bfloat16 base: {losses[1]}")
    assert len(losses[1]) == STEPS and all(np.isfinite(losses[1]))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-2)
    state = _checkpoint(wd2, STEPS)
    assert {v.dtype for v in _flat(state).values() if v.dtype.kind == "f"} == {np.dtype("float32")}

    w0, w1 = load_file(str(base / "model.safetensors")), load_file(str(wd2 / "export" / "model.safetensors"))
    assert w0.keys() == w1.keys() and {v.dtype for v in w1.values()} == {np.dtype("float32")}
    rounded = lambda x: x.astype(jax.numpy.bfloat16).astype(np.float32)  # noqa: E731
    words = "embeddings.word_embeddings.weight"
    np.testing.assert_array_equal(w1[words], rounded(w0[words]))
    p = _flat(state["params"])
    key, prefix = "encoder.layer.0.attention.self.query.weight", "['backbone']['layers']['0']['attention']['query']"
    delta = 2.0 * p[prefix + "['lora_a']"] @ p[prefix + "['lora_b']"]
    np.testing.assert_allclose(w1[key], rounded(w0[key]) + delta.T, atol=1e-6)

    trained = loading.load(base)  # the trained model in memory: the bf16 base and the run's adapters
    from jaxembed import lora

    lora.apply(trained.model, lora.spec_from_config(c2))
    for path, layer in lora.adapters(trained.model).items():
        at = "".join(f"['{x}']" for x in path.split("."))
        layer.lora_a.value, layer.lora_b.value = p[at + "['lora_a']"], p[at + "['lora_b']"]
    ours = Encoder.from_loaded(trained).encode(TEXTS)
    np.testing.assert_allclose(Encoder.from_loaded(loading.load(wd2 / "export")).encode(TEXTS), ours, atol=1e-5)


# --------------------------------------------------------------------------------- MoTE, packing, gradient cache


def _b_per_expert(state: dict) -> dict:
    """B != 0 and different for every adapter and expert: zero B would hide a wrong route or a missing term. numpy
    noise: no XLA compilation per shape."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state["params"])
    out = []
    for i, (path, x) in enumerate(leaves):
        if getattr(path[-1], "key", None) == "lora_b":
            noise = 0.1 * np.random.default_rng(i).standard_normal(x.shape)
            x = jax.device_put(noise.astype(x.dtype), x.sharding)
        out.append(x)
    return {**state, "params": jax.tree_util.tree_unflatten(treedef, out)}


def test_lora_with_mote_packing_and_the_gradient_cache(shared_data, tmp_path):
    """Adapters per expert (every expert's feed-forward adapters stacked [E, ...]); the train step on packed rows
    with the gradient cache (sub-batches of 16 token slots) and experts mixed within the packs gives the loss and
    the adapters' gradients of the padded step (<= 1e-5); an unrouted expert's adapters get exactly zero gradient,
    and routed AdamW leaves its adapters and their moments untouched."""
    import dataclasses

    import optax

    from jaxembed import mote, parallel
    from jaxembed.runs import optim
    from jaxembed.data import pipeline as P
    from jaxembed.train import init_state, make_train_step, setup
    from jaxembed.models.tiny import tiny_model_dir
    from packed_reference import packed_and_padded, slice_data, small_config

    c = small_config(slice_data(shared_data, tmp_path), gradcache_chunk=2)
    c.plan.strategy = "homogeneous"  # one task per batch: MoTE's one-expert-per-call path (TA-CL's)
    c.model.name = str(tiny_model_dir("bert", num_layers=1))  # a third of the compile time
    c.model.mote.enabled = True
    c.model.lora.enabled = True
    c.model.lora.rank = 4
    run = setup(c, tmp_path / "run")
    run = dataclasses.replace(run, packing=dataclasses.replace(
        run.packing, min_row_length=16, sub_tokens=(16,) * len(run.packing.packs)))
    E = run.loaded.model.config.mote.num_experts
    state = init_state(run)
    flat = _flat(state["params"])
    experts = {k: v for k, v in flat.items() if "['experts']" in k}
    assert experts and all(v.shape[0] == E for v in experts.values())  # feed-forward adapters: one per expert
    assert all(k.endswith(("['lora_a']", "['lora_b']")) for k in flat)

    packed, padded = packed_and_padded(run)
    tasks = set(packed["task_id"].tolist())
    assert len(tasks) == 1

    def grads(host_batch):  # SGD at rate 1: the gradient = adapters before - after
        r = dataclasses.replace(run, tx=optax.with_extra_args_support(optax.sgd(1.0)))
        s = _b_per_expert(init_state(r))
        before = _flat(jax.device_get(s["params"]))
        s, m = make_train_step(r)(s, P.to_global(host_batch, parallel.batch_sharding(r.mesh)), single_task=True)
        return float(m["loss"]), {k: before[k] - v for k, v in _flat(jax.device_get(s["params"])).items()}

    (lp, gp), (ld, gd) = grads(packed), grads(padded)
    assert lp == pytest.approx(ld, abs=1e-5)
    worst = max(float(np.abs(gp[k] - gd[k]).max()) for k in gp)
    assert worst <= 1e-5 and max(float(np.abs(v).max()) for v in gd.values()) > 1e-3, worst
    routes = [np.asarray(r) for r in run.routes]
    used = {int(routes[0][t]) for t in tasks} | {int(routes[1][t]) for t in tasks}
    idle = next(e for e in range(E) if e not in used)
    for k, g in gp.items():
        if "['experts']" in k:
            assert all(not np.any(g[e]) for e in range(E) if e not in used), k
            assert all(np.abs(g[e]).max() > 0 for e in used), k

    # routed AdamW (MoTE's optimizer) on the adapters: the idle expert's slices and moments stay as they were (one
    # jitted update: op by op, each operation would compile on its own)
    params = jax.device_get(_b_per_expert(state)["params"])
    opt = run.tx.init(params)
    g = jax.tree.map(np.ones_like, params)
    active = np.arange(E) != idle
    update = jax.jit(lambda g, opt, params, active: run.tx.update(g, opt, params, active=active))
    updates, opt2 = jax.device_get(update(g, opt, params, active))
    adam = [x for x in jax.tree.leaves(opt2, is_leaf=lambda x: isinstance(x, optim.RoutedAdamState))
            if isinstance(x, optim.RoutedAdamState)]
    assert len(adam) == 1 and adam[0].expert_count.tolist() == active.astype(int).tolist()
    for (path, u), m in zip(jax.tree_util.tree_leaves_with_path(updates), jax.tree.leaves(adam[0].mu)):
        if mote.is_expert_path(path):
            assert not np.any(u[idle]) and not np.any(m[idle]) and np.all(m[active] != 0)
