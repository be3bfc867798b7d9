"""The recipes (configs/datacube.py, mote.py, peg.py, kalm.py, demo.py), loaded by name as a user types them
(``datacube:tiny,mqmin``), and the tiny models they run on.

- Every config and every variant (also combined with ``tiny``) loads and passes ``jaxembed.config.validate``, with
  the settings its paper asks for; an unknown variant is an error, led by the recipe's name, that lists the
  variants. Each tiny is what configs/README.md's table says (steps, batch, model, datasets).
- Offline files a run needs (Data-CUBE's curriculum, KaLM's stage-1 model and mined data, PEG's RetroMAE export and
  judged negatives) are looked up when the config is validated, not when it is loaded, and a missing one is an
  error that prints the commands that make it; ``--config.<dir>`` overrides (and sweeps) move them.
- The tiny variants train their few steps on the real shared data, in process, with their method switched on, and
  every dataset they name has rows in their plans:
  Data-CUBE (``jaxembed score`` + ``jaxembed curriculum`` on the tiny store with the tiny T5, then the curriculum
  plan with the Eq. 9 mask), PEG (progressive loss, gradient cache, tiled loss), KaLM (stage 1 with
  semi-homogeneous batches, ``jaxembed mine`` with ranking-consistency filtering, stage 2 from stage 1's export
  with Matryoshka) and MoTE (every expert routed and trained; tests/test_mote.py checks that an expert no step
  routes to stays untouched). The Data-CUBE tiny has four curriculum units: its task orders score differently.
- ``jaxembed.models.tiny``: deterministic cached folders, safe under concurrent creation.
"""

from __future__ import annotations

import concurrent.futures
import copy
import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"

VARIANTS = {
    "datacube": ["", "mqmin", "mqrand", "no_task_curriculum", "no_instance_curriculum", "d2e", "random", "mask",
                 "mqmin,d2e,mask", "random,mask", "tiny", "tiny,mqmin", "tiny,mqrand", "tiny,no_task_curriculum",
                 "tiny,no_instance_curriculum", "tiny,d2e", "tiny,random", "tiny,mask", "task_unit", "balanced",
                 "random,task_unit", "task_unit,balanced,mqmin", "tiny,balanced", "tiny,task_unit,random"],
    "peg": ["", "infonce", "retromae", "mined", "infonce,retromae,mined", "tiny", "tiny,infonce", "tiny,mined"],
    "kalm": ["", "stage1", "stage2", "stage1,semi50", "stage2,semi25,no_mrl,no_instructions", "no_instructions",
             "tiny", "tiny,stage1", "tiny,stage2", "tiny,stage1,semi0", "tiny,stage2,semi100", "tiny,stage2,no_mrl",
             "tiny,stage1,no_instructions", "lora", "stage2,lora", "tiny,lora", "tiny,stage2,lora"],
    "mote": ["", "tiny", "cpu", "ic", "static", "eob", "tiny,static", "tiny,ic", "tiny,eob", "cpu,ic,eob",
             "no_clustering", "cpu,ic,no_clustering"],
    "demo": ["", "tiny"],
}
DIR_KEYS = ("curriculum_dir", "stage1_dir", "mined_dir", "retromae_dir")


def _spec(recipe: str, variant: str = "") -> str:
    """The recipe by name, as a user types it (the loader finds it from any folder)."""
    return recipe + (f":{variant}" if variant else "")


def _tiny_table() -> dict[str, dict]:
    """configs/README.md's table of the tiny variants: spec -> steps, batch, model, datasets."""
    import re

    rows = {}
    for line in (CONFIGS / "README.md").read_text().splitlines():
        m = re.match(r"^\| `(\w+:tiny(?:,\w+)?)`[^|]*\| (\d+) x (\d+)[^|]*\| ([^|]+)\| ([^|]+)\|$", line)
        if m:
            names = re.sub(r"\([^)]*\)", "", m.group(5)).replace("+", ",")
            rows[m.group(1)] = {"steps": int(m.group(2)), "batch": int(m.group(3)), "model": m.group(4).strip(),
                                "datasets": {n.strip() for n in names.split(",") if n.strip()}}
    return rows


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    """A fresh cache for the tiny models (JAXEMBED_CACHE) for this module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JAXEMBED_CACHE", str(tmp_path_factory.mktemp("jaxembed_cache")))
        yield


@pytest.fixture(scope="module")
def offline(tmp_path_factory, shared_data):
    """Stand-ins for the offline outputs (validation only checks that they exist)."""
    root = tmp_path_factory.mktemp("offline")
    cur = root / "curriculum"
    for sub in ("", "min", "random"):
        (cur / sub).mkdir(parents=True, exist_ok=True)
        (cur / sub / "task_order.json").write_text('{"order": []}')
    np.savez(cur / "scores.npz", x=np.zeros(1))
    (root / "stage1" / "export").mkdir(parents=True)
    (root / "stage1" / "export" / "config.json").write_text("{}")
    (root / "retromae").mkdir()
    (root / "retromae" / "config.json").write_text("{}")
    (root / "mined").mkdir()
    for name in ("snli", "sick_nli", "sick_sts", "stsb", "mrpc", "wikiqa", "trecqa"):
        (root / "mined" / f"{name}.jsonl").write_text("")
    return {"curriculum_dir": str(cur), "stage1_dir": str(root / "stage1"), "mined_dir": str(root / "mined"),
            "retromae_dir": str(root / "retromae")}


def _load(recipe, variant, dirs=None):
    c = cfglib.load_config_file(_spec(recipe, variant))
    for k, v in (dirs or {}).items():
        if k in c:
            c[k] = v
    return c


# ------------------------------------------------------------------------------------------ configs and variants


def _check_recipe(recipe, variants, c, dirs):
    """The paper's settings and what each variant switches."""
    tiny = "tiny" in variants
    if tiny:  # CPU-sized: batches of 8, a few steps, no evaluation (configs/README.md's table: _check_tiny)
        assert (c.plan.global_batch_size, tuple(c.eval.tasks)) == (8, ()) and 2 <= c.plan.steps <= 17
        assert Path(c.model.name, "config.json").is_file()
    if recipe == "datacube":
        cur = c.plan.curriculum
        assert (c.loss.temperature, c.optim.warmup_ratio) == (0.01, 0.1) and (tiny or c.optim.lr == 2e-5)
        assert c.plan.global_batch_size == (8 if tiny else 64)
        assert c.model.name.endswith("hkunlp/instructor-large") or tiny
        assert cur.enabled == ("random" not in variants)
        objective = "min" if "mqmin" in variants else "random" if {"mqrand", "no_task_curriculum"} & variants else ""
        assert cur.task_order == str(Path(dirs["curriculum_dir"], objective, "task_order.json"))
        order = "d2e" if "d2e" in variants else "random" if "no_instance_curriculum" in variants else "e2d"
        assert cur.instance_order == order
        needs_phi = "mask" in variants or (cur.enabled and order != "random")
        assert c.plan.scores == (str(Path(dirs["curriculum_dir"], "scores.npz")) if needs_phi else "")
        assert c.plan.mask.delta == (0.0 if "mask" in variants else None)
        # the unit is the dataset (a MEDI task); Vanilla batches hold one unit, as the curriculum's do
        assert cur.unit == ("task" if "task_unit" in variants else "dataset")
        assert cur.walk == ("balanced" if "balanced" in variants else "cyclic")
        assert c.plan.strategy == (None if cur.enabled else "heterogeneous" if "task_unit" in variants
                                   else "homogeneous")
        assert all(d.query_instruction.startswith("Represent the ") and d.doc_instruction.startswith("Represent the ")
                   for d in c.data.datasets)  # INSTRUCTOR-style, both sides
    elif recipe == "peg":
        assert c.loss.type == ("infonce" if "infonce" in variants else "peg")
        assert (c.loss.peg_alpha, c.loss.peg_beta, c.loss.temperature) == (0.5, 0.1, 0.01)
        assert tiny or c.optim.lr == 1e-5
        assert c.loss.tiled
        if not tiny:  # 13,824 queries x (1 + 5) texts; the gradient cache's sub-batch divides the batch
            assert c.plan.global_batch_size == 13824 and 1 + max(d.num_negatives for d in c.data.datasets) == 6
            assert c.train.gradcache_chunk > 0 and c.plan.global_batch_size % c.train.gradcache_chunk == 0
            assert {(d.max_query_length, d.max_doc_length) for d in c.data.datasets} == {(64, 256)}
        if "retromae" in variants:
            assert c.model.name == dirs["retromae_dir"]
        elif tiny:  # jaxembed.models.tiny: a 1-layer random BERT with CLS pooling
            hf_cfg = json.loads(Path(c.model.name, "config.json").read_text())
            assert (hf_cfg["model_type"], hf_cfg["num_hidden_layers"]) == ("bert", 1)
        else:  # PEG fine-tunes BERT-large (its RetroMAE pre-training is the `retromae` variant)
            assert c.model.name == "bert-large-uncased"
        mined = {d.name: d.path for d in c.data.datasets if d.path.startswith(dirs["mined_dir"])}
        assert set(mined) == ({"wikiqa", "trecqa"} & {d.name for d in c.data.datasets} if "mined" in variants
                              else set())
    elif recipe == "kalm":
        stage2 = "stage2" in variants
        assert (c.loss.temperature, c.model.pooling) == (0.01, "mean") and (
            tiny or c.optim.lr == (2e-4 if "lora" in variants else 1e-4))  # LoRA: a larger rate (configs/kalm.py)
        assert c.model.causal is True and c.plan.strategy == "semi_homogeneous"
        semi = [int(v[4:]) / 100 for v in variants if v.startswith("semi")]
        assert c.plan.semi_homogeneous_proportion == (semi[0] if semi else 0.0)
        if not tiny:
            assert c.plan.global_batch_size == (48 if stage2 else 512)
            assert c.model.max_length == 512 and c.model.dtype == "bfloat16"
        negs = {d.num_negatives for d in c.data.datasets}
        assert negs == {0} if not stage2 else max(negs) == (5 if tiny else 7)
        mrl = stage2 and "no_mrl" not in variants
        assert bool(c.loss.matryoshka_dims) == mrl
        if mrl and not tiny:
            assert c.loss.matryoshka_dims == (896, 512, 256, 128, 64)
            assert c.loss.matryoshka_weights == (1.0, 0.3, 0.2, 0.1, 0.1)
        if stage2:
            assert c.model.init_from == dirs["stage1_dir"]  # model.init_from chains the stages
            assert any(d.path.startswith(dirs["mined_dir"]) for d in c.data.datasets)
        assert c.model.lora.enabled == ("lora" in variants)  # LoRA adapters, the base frozen (docs/lora.md)
        instructed = [d for d in c.data.datasets if d.query_instruction]
        if "no_instructions" in variants:
            assert not instructed
        else:  # KaLM Table 1: asymmetric tasks instructed, symmetric ones not
            assert all(d.task_type not in ("sts", "pair_classification", "nli") for d in instructed)
            assert all(d.query_instruction.startswith("Instruct: ") for d in instructed)
    elif recipe == "mote":
        assert c.model.mote.enabled == ("ic" not in variants)
        clu = {d.name: (d.task, d.batching, d.temperature) for d in c.data.datasets if d.task_type == "clustering"}
        want = set() if "no_clustering" in variants else {"trec_clustering"} if tiny else {"trec_clustering",
                                                                                          "sst5_clustering"}
        assert set(clu) == want  # clustering sets from train/ classification files, under TA-CL (or static)
        assert set(clu.values()) <= {("clustering", "heterogeneous", 0.06 if "static" not in variants else 0.03)}
        assert all(Path(d.path).parent.name == "clustering" for d in c.data.datasets if d.name in clu)


def _check_tiny(spec, c):
    """A tiny is what configs/README.md's table says: steps x queries, the model, the datasets."""
    row = _tiny_table()[spec]
    assert (c.plan.steps, c.plan.global_batch_size) == (row["steps"], row["batch"]), (spec, row)
    assert {d.name for d in c.data.datasets} == row["datasets"], (spec, row)
    hf_cfg = json.loads(Path(c.model.name, "config.json").read_text())
    if row["model"].startswith("random "):  # jaxembed.models.tiny: 1 layer, 32 wide
        arch = row["model"].split()[1].strip(",").lower()
        assert hf_cfg["model_type"] == arch and (hf_cfg.get("num_hidden_layers") or hf_cfg["num_layers"]) == 1
        assert (hf_cfg.get("hidden_size") or hf_cfg["d_model"]) == 32
    else:
        from jaxembed import paths

        assert row["model"].startswith("all-MiniLM-L6-v2") and c.model.name == str(paths.demo_model_dir())


@pytest.mark.parametrize("recipe,variant", [(r, v) for r, vs in VARIANTS.items() for v in vs])
def test_every_config_and_variant_validates(recipe, variant, tiny_cache, offline):
    c = _load(recipe, variant, offline)
    cfglib.validate(c)
    _check_recipe(recipe, {v for v in variant.split(",") if v}, c, offline)
    if f"{recipe}:{variant}" in _tiny_table():
        _check_tiny(f"{recipe}:{variant}", c)
    json.loads(cfglib.to_json(c))  # the resolved config (config.json of a run) is plain JSON


def test_the_tiny_table_names_every_tiny():
    """configs/README.md's table has a row for each recipe's tiny (KaLM: both stages), so _check_tiny checks each."""
    assert set(_tiny_table()) == {"demo:tiny", "datacube:tiny", "peg:tiny", "kalm:tiny", "kalm:tiny,stage2",
                                  "mote:tiny", "retromae:tiny"}
    row, c = _tiny_table()["retromae:tiny"], cfglib.load_config_file("retromae:tiny")
    assert (c.train.steps, c.train.batch_size, c.model.init) == (row["steps"], row["batch"], "random")
    assert (c.model.overrides["num_hidden_layers"], c.model.overrides["hidden_size"]) == (1, 32)
    assert [Path(p).stem for p in c.data.paths] == sorted(row["datasets"]) == ["wikiqa"]


@pytest.mark.parametrize("recipe,bad", [("datacube", "tiny,mqmni"), ("peg", "infonse"), ("kalm", "semi150"),
                                        ("kalm", "stage1,stage2"), ("datacube", "random,d2e"),
                                        ("datacube", "mqmin,mqrand"), ("datacube", "random,balanced"),
                                        ("mote", "huge"), ("mote", "tiny,cpu"), ("kalm", "semiNN"),
                                        ("demo", "huge"), ("retromae", "huge")])
def test_bad_variants_are_clear_errors(recipe, bad):
    with pytest.raises(UserError) as e:
        cfglib.load_config_file(_spec(recipe, bad))
    msg = str(e.value)
    assert msg.startswith(f"{recipe}: ") and "\n" not in msg
    if "unknown" in msg:
        assert "variants: tiny" in msg and f"e.g. {recipe}:tiny" in msg
        assert "combine with commas" in msg or recipe in ("demo", "retromae")  # the two with one variant


def test_missing_offline_files_name_the_commands(tmp_path, offline, shared_data):
    """Loading never needs the offline files (jaxembed score loads the Data-CUBE config to make them); validation
    does, and names the commands."""
    nowhere = str(tmp_path / "nowhere")
    c = _load("datacube", "mqmin", {"curriculum_dir": nowhere})
    with pytest.raises(UserError) as e:
        cfglib.validate(c)
    assert (f"{nowhere}/min/task_order.json, {nowhere}/scores.npz are missing" in str(e.value)
            and f"`jaxembed score --config datacube --out {nowhere}` then `jaxembed curriculum --scores-dir "
                f"{nowhere} --out {nowhere}/min --objective min`" in str(e.value))
    c = _load("datacube", "tiny,task_unit")   # its unit's files, and score sees the unit (the variant)
    with pytest.raises(UserError) as e:
        cfglib.validate(c)
    assert ("runs/datacube_tiny/curriculum_task/task_order.json" in str(e.value)
            and "`jaxembed score --config datacube:tiny,task_unit --out runs/datacube_tiny/curriculum_task`"
            in str(e.value))
    c = _load("datacube", "mqmin", {"curriculum_dir": nowhere})
    c.curriculum_dir = offline["curriculum_dir"]   # an override moves every derived path
    cfglib.validate(c)
    c.task_order_objective = "max"
    assert c.plan.curriculum.task_order == f"{offline['curriculum_dir']}/task_order.json"
    c.task_order_objective = "best"
    with pytest.raises(UserError, match="task_order_objective = 'best' is not valid: allowed: max, min, random"):
        cfglib.validate(c)
    # the curriculum switched off by an override needs no file
    c = _load("datacube", "", {"curriculum_dir": nowhere})
    cfglib.apply_overrides(c, ["plan.curriculum.enabled=false", "plan.strategy=heterogeneous"])
    cfglib.validate(c)
    assert c.plan.scores == ""

    c = _load("kalm", "stage2", {"stage1_dir": nowhere, "mined_dir": offline["mined_dir"]})
    with pytest.raises(UserError, match=rf"no stage-1 run in {nowhere} \(fix: run `jaxembed train --config "
                                        rf"kalm:stage1 --workdir {nowhere}` first"):
        cfglib.validate(c)
    c = _load("kalm", "stage2", {"stage1_dir": offline["stage1_dir"], "mined_dir": nowhere})
    with pytest.raises(UserError) as e:
        cfglib.validate(c)
    assert (f"the mined data {nowhere}/snli.jsonl, {nowhere}/sick_nli.jsonl" in str(e.value) and
            f"for NAME in snli sick_nli sick_sts stsb mrpc wikiqa trecqa: `jaxembed mine --model "
            f"{offline['stage1_dir']}/export --store {offline['stage1_dir']}/store --dataset NAME --out "
            f"{nowhere}/NAME.jsonl`" in str(e.value))
    for variant, key, expect in (("retromae", "retromae_dir", "jaxembed pretrain retromae"),
                                 ("mined", "mined_dir", "jaxembed judge --input")):
        c = _load("peg", variant, {key: nowhere})
        with pytest.raises(UserError, match=expect):
            cfglib.validate(c)


def test_get_hyper_sweeps_expand_and_validate(tmp_path, tiny_cache, offline):
    """Each recipe's ablation sweep (get_hyper) expands into valid runs; a sweep deep-copies the config, and the
    derived paths follow the copy's own overrides."""
    from jaxembed import sweep

    names = {}
    for recipe in ("datacube", "peg", "kalm"):
        fixed = [f"{k}={v}" for k, v in offline.items() if k in _load(recipe, "tiny")]
        s = sweep.plan_sweep(_spec(recipe, "tiny"), tmp_path / recipe, fixed=fixed)
        names[recipe] = [r.name for r in s.runs]
        if recipe == "datacube":
            s_datacube = s
            orders = [r.config.plan.curriculum.task_order for r in s.runs]
            assert orders[1] == f"{offline['curriculum_dir']}/min/task_order.json"
            assert not s.runs[-1].config.plan.curriculum.enabled and s.runs[-1].config.plan.scores == ""
    assert len(names["datacube"]) == 7 and len(names["peg"]) == 4 and len(names["kalm"]) == 4
    assert s_datacube.runs[5].config.plan.curriculum.walk == "balanced"
    assert s_datacube.runs[-1].config.plan.strategy == "homogeneous"  # Vanilla: one dataset per batch
    assert names["kalm"][0] == "semi_homogeneous_proportion=0.0"
    c = _load("datacube", "", offline)
    d = copy.deepcopy(c)
    d.curriculum_dir = str(shutil.copytree(offline["curriculum_dir"], tmp_path / "elsewhere"))
    assert c.plan.scores == f"{offline['curriculum_dir']}/scores.npz"
    assert d.plan.curriculum.task_order == f"{tmp_path}/elsewhere/task_order.json"


# ------------------------------------------------------------------------------------------------- tiny models


def test_tiny_models_cached_deterministic_and_safe_under_concurrency(tmp_path):
    from jaxembed import loading
    from jaxembed.models.tiny import MARKER, spec_hash, tiny_model_dir, tiny_spec

    a, b = tmp_path / "a", tmp_path / "b"
    with concurrent.futures.ThreadPoolExecutor(4) as ex:  # four creators race for one folder
        dirs = list(ex.map(lambda _: tiny_model_dir("t5", include_prompt=False, cache_dir=a), range(4)))
    assert len(set(dirs)) == 1 and dirs[0].parent == a and dirs[0].name.startswith("t5-")
    assert sorted(p.name for p in a.iterdir()) == [dirs[0].name]  # the losers' temporary folders are gone
    assert (dirs[0] / MARKER).is_file()
    again = tiny_model_dir("t5", include_prompt=False, cache_dir=b)  # same settings elsewhere: the same bytes
    digest = lambda d: hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest()
    assert again.name == dirs[0].name and digest(again) == digest(dirs[0])
    mtime = (again / "model.safetensors").stat().st_mtime_ns
    assert tiny_model_dir("t5", include_prompt=False, cache_dir=b) == again  # cached: not written again
    assert (again / "model.safetensors").stat().st_mtime_ns == mtime
    assert tiny_model_dir("t5", include_prompt=False, seed=1, cache_dir=b) != again
    loaded = loading.load(again)
    assert loaded.model.config.model_type == "t5" and not loaded.model.head.include_prompt
    assert loaded.tokenizer.hf.vocab_size == 30522
    with pytest.raises(UserError, match="arch='gpt2' is not one of bert, gemma2, gemma3, llama, mistral, qwen2, t5$"):
        tiny_model_dir("gpt2", cache_dir=b)
    half = b / f"t5-{spec_hash(tiny_spec('t5', seed=2))}"  # a folder in the way that is not a finished model
    half.mkdir()
    with pytest.raises(UserError, match="not a finished tiny model"):
        tiny_model_dir("t5", seed=2, cache_dir=b)


# ------------------------------------------------------------------------------------------- the tiny runs
#
# The tiny runs, in this process (the `runs` fixture, once for the module): compiling is nearly all the cost of a
# tiny run, and a process of their own would add its imports (seconds of CPU) to each.


def _train(cfg, workdir):
    from jaxembed.train import train

    cfg.train.progress = False
    s = train(cfg, workdir)
    assert s["status"] == "completed" and s["step"] == cfg.plan.steps and s["skipped"] == 0, s


def _run_datacube(d: Path):
    """The Data-CUBE chain on the tiny store: jaxembed score, jaxembed curriculum, then the tiny's curriculum steps
    with the Eq. 9 mask (tiny,mask)."""
    from jaxembed.cli import main

    cur = d / "curriculum"
    assert main(["score", "--config", _spec("datacube", "tiny"), "--out", str(cur), "--n-task-queries", "32",
                 "-q"]) == 0
    assert main(["curriculum", "--scores-dir", str(cur), "--out", str(cur), "--solver", "exact"]) == 0
    cfg = _load("datacube", "tiny,mask", {"curriculum_dir": str(cur)})
    cfg.data.store = str(cur / "store")              # the store jaxembed score prepared
    # Eq. 9 with delta = the median phi of the first batch (E2D: the easiest of its task's share), so that half of
    # it is masked
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store

    store = Store.open(cur / "store")
    plan = build_plan(store, cfg.plan, data_config=cfglib.data_section(cfg))
    first = json.loads((cur / "task_order.json").read_text())["order"][0]
    assert plan.meta["units"][plan.unit_ids[0]]["name"] == first and plan.meta["curriculum"]["unit"] == "dataset"
    with np.load(cur / "scores.npz") as z:
        phi = np.array([z[plan.dataset_names[k]][e] for k, e in zip(plan.dataset_ids[0], plan.example_ids[0])])
    assert np.all(np.diff(phi) <= 0)  # E2D
    cfg.plan.mask.delta = float(np.median(phi))
    _train(cfg, d / "run")


def _run_peg(d: Path):
    _train(_load("peg", "tiny"), d)


def _run_kalm(d: Path):
    """Stage 1 (semi-homogeneous, in-batch negatives); jaxembed mine on sick_nli with the stage-1 model and store;
    stage 2 from stage 1's export with the mined negatives and Matryoshka, as LoRA adapters (the lora variant)."""
    from jaxembed.cli import main

    dirs = {"stage1_dir": str(d / "stage1"), "mined_dir": str(d / "mined")}
    _train(_load("kalm", "tiny,stage1,semi50", dirs), d / "stage1")
    assert main(["mine", "--model", str(d / "stage1" / "export"), "--store", str(d / "stage1" / "store"),
                 "--dataset", "sick_nli", "--top-k", "100", "--window", "10:40",
                 "--out", str(d / "mined" / "sick_nli.jsonl"), "-q"]) == 0
    c2 = _load("kalm", "tiny,stage2,lora", dirs)
    from jaxembed.train import init_source

    assert init_source(c2, d / "stage2") == str(d / "stage1" / "export")  # stage 2 starts from stage 1's weights
    _train(c2, d / "stage2")


def _run_mote(d: Path):
    """mote:tiny as it is (a 1-layer random BERT up-cycled; tests/test_mote.py up-cycles the real model)."""
    _train(_load("mote", "tiny"), d)


@pytest.fixture(scope="module")
def runs(tiny_cache, shared_data, tmp_path_factory):
    """The four tiny runs' folders (out/<recipe>/...)."""
    out = tmp_path_factory.mktemp("runs")
    for recipe in ("datacube", "mote", "kalm", "peg"):
        globals()[f"_run_{recipe}"](out / recipe)
    return out


def _metrics(workdir):
    """The train rows of metrics.jsonl, checked: every step of the config's, finite losses, a completed run; and every
    dataset of the run has rows in its plan (each tiny exercises every dataset it names)."""
    from jaxembed.data.plan import Plan

    steps = json.loads((Path(workdir) / "config.json").read_text())["plan"]["steps"]
    s = json.loads((Path(workdir) / "summary.json").read_text())
    assert s["status"] == "completed" and s["step"] == steps and s["skipped"] == 0, s
    rows = [json.loads(x) for x in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("split") == "train"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1)) and all(math.isfinite(r["loss"]) for r in rows), rows
    plan = Plan.load(Path(workdir) / "plan.npz")
    rows_of = {name: int((plan.dataset_ids == k).sum()) for k, name in enumerate(plan.dataset_names)}
    assert plan.steps == steps and all(rows_of.values()), rows_of  # the plan's datasets: the config's
    assert set(rows_of) == {x["name"] for x in json.loads((Path(workdir) / "config.json").read_text())["data"]
                            ["datasets"]}
    return s, rows


def test_datacube_tiny_curriculum_run(runs):
    from jaxembed.data.plan import Plan

    cur, run = runs / "datacube" / "curriculum", runs / "datacube" / "run"
    _, rows = _metrics(run)
    order = json.loads((cur / "task_order.json").read_text())["order"]
    plan = Plan.load(run / "plan.npz")
    assert plan.meta["mode"] == "curriculum" and plan.meta["curriculum"]["order"] == order, plan.meta
    assert set(plan.meta["strategies"].values()) == {"curriculum"}
    delta = json.loads((run / "config.json").read_text())["plan"]["mask"]["delta"]
    # Algorithm 1: the walk follows the task order over all four datasets (the tiny's steps are a compressed
    # curriculum, a random subset of each dataset, each with a batch at least), one dataset per batch
    walked = [plan.meta["units"][u]["name"] for u in plan.unit_ids]
    first_visits = [order.index(t) for k, t in enumerate(walked) if t not in walked[:k]]
    assert first_visits == sorted(first_visits) and plan.meta["curriculum"]["fraction_of_one_pass"] < 0.1
    assert first_visits == [0, 1, 2, 3] and walked[:4] == order, (walked, order)
    assert all(len(set(row)) == 1 for row in plan.dataset_ids)
    # four units: the task orders score differently (with three, every cyclic order ties), and the exact solver's
    # order is the best of them (Eq. 6)
    from itertools import permutations

    from jaxembed.curriculum.order import cyclic_objective

    with np.load(cur / "task_similarity.npz") as z:
        S, names = z["matrix"], [str(n) for n in z["names"]]
    values = {perm: cyclic_objective(S, perm) for perm in permutations(range(len(names)))}
    assert len(names) == 4 and max(values.values()) - min(values.values()) > 1e-6, values
    assert cyclic_objective(S, [names.index(t) for t in order]) == pytest.approx(max(values.values()))
    # E2D: every task's rows run from easy to difficult (phi descending, Eq. 8)
    with np.load(cur / "scores.npz") as z:
        phi = {k: z[k] for k in z.files}
    task_rows = {}
    for s in range(plan.steps):
        batch_phi = [phi[plan.dataset_names[d]][e] for d, e in zip(plan.dataset_ids[s], plan.example_ids[s])]
        task_rows.setdefault(int(plan.task_ids[s]), []).extend(batch_phi)
        # Eq. 9 (the text's reading): weight 0 exactly where phi < delta; masked rows leave the loss
        np.testing.assert_array_equal(plan.weights[s], (np.array(batch_phi) >= delta).astype(np.float32))
        assert rows[s]["active_queries"] == plan.weights[s].sum()
    assert all(np.all(np.diff(r) <= 0) for r in task_rows.values())
    assert int((plan.weights[0] == 0).sum()) == 4 and plan.meta["masked_rows"] == int((plan.weights == 0).sum())


def test_peg_tiny_run(runs):
    d = runs / "peg"
    _, rows = _metrics(d)
    c = json.loads((d / "config.json").read_text())
    assert c["loss"]["type"] == "peg" and c["loss"]["tiled"] and c["loss"]["block_c"] == 16
    for r in rows:
        assert {"peg_t", "peg_sigma", "peg_mean_weight"} <= set(r) and 0 < r["peg_mean_weight"] <= 1
    # Eq. 5-6: sigma = mean sim(q, p) - beta; t_s = alpha * mean + (1 - alpha) * t_(s-1), t_0 = 0, alpha = 0.5
    assert rows[0]["peg_t"] == pytest.approx(0.5 * rows[0]["pos_sim"], abs=1e-5)
    assert rows[0]["peg_sigma"] == pytest.approx(rows[0]["pos_sim"] - 0.1, abs=1e-5)
    assert rows[1]["peg_t"] == pytest.approx(0.5 * rows[1]["pos_sim"] + 0.5 * rows[0]["peg_t"], abs=1e-5)


def test_kalm_tiny_two_stages(runs, tmp_path):
    from jaxembed.data.plan import Plan
    from jaxembed.data.store import Store

    d = runs / "kalm"
    _, rows1 = _metrics(d / "stage1")
    _, rows2 = _metrics(d / "stage2")
    plan1 = Plan.load(d / "stage1" / "plan.npz")
    assert plan1.meta["semi_homogeneous"]["proportion"] == 0.5
    assert plan1.meta["semi_homogeneous"]["rows_per_batch"] == 4
    c1 = json.loads((d / "stage1" / "config.json").read_text())
    assert {x["num_negatives"] for x in c1["data"]["datasets"]} == {0}  # in-batch negatives only
    c2 = json.loads((d / "stage2" / "config.json").read_text())
    assert c2["model"]["init_from"] == str(d / "stage1")  # stage 2 starts from stage 1 (its export/)
    report = json.loads((d / "mined" / "sick_nli.report.json").read_text())
    assert 8 <= report["kept"] < report["examples"]  # the ranking-consistency filter dropped some
    store = Store.open(d / "stage2" / "store")
    assert store.dataset("sick_nli").size == report["kept"]
    assert len(store.example("sick_nli", 0)["neg"]) == 7  # mined: 7 negatives from ranks 10-40
    for r in rows2:
        assert r["loss"] == pytest.approx(r["loss_dim32"] + .3 * r["loss_dim16"] + .2 * r["loss_dim8"]
                                          + .1 * r["loss_dim4"] + .1 * r["loss_dim2"], rel=1e-5)
    assert all("loss_dim32" not in r for r in rows1)  # Matryoshka only in fine-tuning (KaLM 3.1)
    # stage 2 trained LoRA adapters on stage 1's export: merged weights in export/, the PEFT folder in adapter/
    assert c2["model"]["lora"]["enabled"] and json.loads((d / "stage2" / "lora_base.json").read_text())["source"] \
        == str(d / "stage1" / "export")
    assert (d / "stage2" / "export" / "model.safetensors").is_file()
    assert json.loads((d / "stage2" / "export" / "adapter" / "adapter_config.json").read_text())["r"] == 4
    # before mining, stage 2 stops at validation with the command
    stage2 = _load("kalm", "tiny,stage2", {"stage1_dir": str(d / "stage1"), "mined_dir": str(tmp_path)})
    with pytest.raises(UserError, match=rf"`jaxembed mine --model {d}/stage1/export --store {d}/stage1/store "
                                        rf"--dataset NAME --top-k 100 --window 10:40 --out {tmp_path}/NAME.jsonl`"):
        cfglib.validate(stage2)


def test_mote_tiny_run_routes_experts(runs):
    """The trained experts are those the plan's tasks route to: every expert, as the tiny's 4 steps take every unit
    (the clustering expert among them: the clustering sets built from the classification files reach it). That an
    expert no task routes to keeps the dense model's feed-forward weights: tests/test_mote.py, between two
    checkpoints of the same plan."""
    from safetensors.numpy import load_file

    from jaxembed.data.plan import Plan
    from jaxembed.data.store import Store

    d = runs / "mote"
    summary, _ = _metrics(d)
    spec = json.loads((Path(summary["export"]) / "mote_config.json").read_text())
    experts = load_file(str(Path(summary["export"]) / "mote_experts.safetensors"))
    dense = load_file(str(Path(json.loads((d / "config.json").read_text())["model"]["name"]) / "model.safetensors"))
    plan, store = Plan.load(d / "plan.npz"), Store.open(d / "store")
    types = {i.task: i.task_type for i in store.datasets}
    routing = {t: tuple(qd) for t, *qd in spec["routing"]} if isinstance(spec["routing"], list) else spec["routing"]
    used = {e for t in plan.task_ids for e in routing[types[plan.task_names[t]]]}
    changed = {}
    for key, w in experts.items():
        _, name, hf_key = key.split(".", 2)
        changed[name] = changed.get(name, False) or not np.array_equal(w, dense[hf_key])
    assert used and {e for e, c in changed.items() if c} == used, (used, changed)
    assert used == set(spec["experts"]) and all(changed.values())  # every unit, so every expert, trains

