"""The sentence-transformers side of benchmarks/quality_parity.py computes jaxembed's loss: ST's
MultipleNegativesRankingLoss plus jaxembed's two masks (empty negative slots, duplicates of the own positive), and
the batch sampler replays the plan's batches in order. Random embeddings, no model."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

# torch, sentence-transformers and the benchmark are imported by the tests that run, not at collection (each test
# process collects every file: these imports cost ~7 CPU-s there)
torch = qp = None


@pytest.fixture(scope="module", autouse=True)
def _st_side():
    global torch, qp
    import sentence_transformers  # noqa: F401  (the test extra installs it, and torch)
    import torch as torch_module

    torch = torch_module
    import quality_parity

    qp = quality_parity


def _labels_and_hashes(B, K, rng):
    """Text ids per (row, slot) with duplicated positives (shared label descriptions) and empty slots (-1)."""
    ids = rng.integers(0, 5, size=(B, K))          # few distinct texts: many duplicates
    ids[rng.random((B, K)) < 0.2] = -1              # empty negative slots
    ids[:, 0] = rng.integers(0, 5, size=B)          # a positive is never empty
    return ids


@pytest.mark.parametrize("K", [2, 3])
def test_masked_loss_matches_jaxembed(K):
    import jax.numpy as jnp

    from jaxembed.losses import CandidateInfo, QueryInfo, layout_pos_index
    from jaxembed.losses.infonce import contrastive_loss

    rng = np.random.default_rng(K)
    B, D = 8, 16
    q = rng.normal(size=(B, D)).astype(np.float32)
    docs = rng.normal(size=(B, K, D)).astype(np.float32)
    ids = _labels_and_hashes(B, K, rng)
    # jaxembed layout: doc rows r*K + j, hash = text id (0 for an empty slot), valid = not empty
    flat_ids = ids.reshape(-1)
    hashes = np.stack([np.where(flat_ids >= 0, flat_ids + 1, 0), np.zeros_like(flat_ids)], 1).astype(np.uint32)
    ci = CandidateInfo(jnp.asarray(flat_ids >= 0), jnp.asarray(hashes), None)
    qi = QueryInfo(pos_hash=jnp.asarray(hashes[::K]))
    ref, _ = contrastive_loss(jnp.asarray(q), jnp.asarray(docs.reshape(B * K, D)), layout_pos_index(B, K),
                              temperature=0.05, qi=qi, ci=ci)
    loss = qp.make_masked_mnrl()(None, scale=20.0)
    labels = torch.as_tensor(np.concatenate([ids, np.zeros((B, 1), np.int64)], 1))
    got = loss.compute_loss_from_embeddings([torch.as_tensor(q)] + [torch.as_tensor(docs[:, j]) for j in range(K)],
                                            labels)
    assert float(got) == pytest.approx(float(ref), rel=1e-5, abs=1e-5)


def test_plan_batch_sampler_and_public_argv():
    assert list(qp.PlanBatchSampler(3, 2)) == [[0, 1], [2, 3], [4, 5]]
    assert len(qp.PlanBatchSampler(3, 2)) == 3
    assert qp._public_argv(["--steps", "5", "--workdir", "/x", "--name=n", "--no-readme", "--seeds", "0"]) == \
        ["--steps", "5", "--seeds", "0"]


# ------------------------------------------------------------------------------------------------ records

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def test_result_files_are_named_by_run_and_carry_their_environment(tmp_path):
    import json
    import re

    import _record

    a = _record.save_result("bench_x", {"figure": 1.0}, results_dir=tmp_path)
    b = _record.save_result("bench_x", {"figure": 2.0}, results_dir=tmp_path)
    assert a != b and a.exists() and b.exists()  # a second run never overwrites the first
    assert re.fullmatch(r"bench_x_\d{4}-\d{2}-\d{2}_\d{6}(_\d+)?\.json", a.name), a.name
    rec = json.loads(a.read_text())
    assert rec["figure"] == 1.0 and rec["run"] in a.name
    for when in ("at_start", "at_save"):
        env = rec["environment"][when]
        assert len(env["load_average"]) == 3 and env["cpu_count"] >= 1 and "threads_env" in env
    readme = tmp_path / "README.md"
    line = _record.record_line("| date | bench | figures | `cmd` |", readme=readme)
    assert line.endswith(f"`results/{b.name}` |") and readme.read_text() == line + "\n"


def test_stock_st_datasets_keep_every_plan_row():
    """The stock-ST arm's DatasetDict: the plan's rows grouped by dataset, no empty negative column; rows whose
    negative slot is empty form their own pair dataset; nothing is lost."""
    from types import SimpleNamespace

    store = SimpleNamespace(datasets=[SimpleNamespace(name="wiki"), SimpleNamespace(name="stsb")])
    plan = SimpleNamespace(global_batch_size=2, dataset_ids=np.array([[0, 0], [1, 1], [0, 0]]))
    rows = [{"anchor": f"q{i}", "positive": f"p{i}", "negative_1": "" if i in (2, 3, 5) else f"n{i}"}
            for i in range(6)]
    groups = qp.stock_datasets(store, plan, rows, K=2)
    assert groups == {"wiki": [{"anchor": "q0", "positive": "p0", "negative_1": "n0"},
                               {"anchor": "q1", "positive": "p1", "negative_1": "n1"},
                               {"anchor": "q4", "positive": "p4", "negative_1": "n4"}],
                      "stsb_pairs": [{"anchor": "q2", "positive": "p2"}, {"anchor": "q3", "positive": "p3"}],
                      "wiki_pairs": [{"anchor": "q5", "positive": "p5"}]}


def _table(text: str, header: str) -> list[list[str]]:
    """The rows (cells) of the markdown table that starts with ``header``."""
    rows = []
    for ln in text[text.index(header):].splitlines()[2:]:
        if not ln.startswith("|"):
            break
        rows.append([c.strip() for c in ln.strip("|").split("|")])
    return rows


def _num(cell: str) -> list[float]:
    import re

    return [float(x) for x in re.findall(r"[-+]?\d+\.\d+", cell.replace("**", ""))]


def test_benchmark_figures_match_their_records():
    """Every figure of the benchmark tables (docs/benchmarks.md, moved there from the README) equals its result file
    (rounded as printed); the file exists."""
    import json

    readme = (ROOT / "docs" / "benchmarks.md").read_text()
    rows = _table(readme, "| what | jaxembed | sentence-transformers | record |")
    assert len(rows) >= 6
    for row in rows:
        assert (RESULTS / row[3].strip("`")).exists(), row
    rec = {n: json.loads((RESULTS / f"{n}.json").read_text()) for n in (
        "quality_parity_cpu", "train_throughput_cpu", "train_throughput_quiet_cpu", "encode_throughput_cpu",
        "quality_ablations_cpu")}
    par = rec["quality_parity_cpu"]["parity"]
    loaded = rec["train_throughput_cpu"]["throughput"]
    quiet = rec["train_throughput_quiet_cpu"]["throughput"]
    gib = lambda tool, key: [r[tool][key] / 1024 for r in quiet]  # noqa: E731
    want = [
        ([par["jaxembed"]["average"], par["jaxembed"]["spread"]], [par["st"]["average"], par["st"]["spread"]]),
        ([r["ratio_per_cpu_s_jaxembed_over_st"] for r in loaded], []),
        ([r["ratio_jaxembed_over_st"] for r in quiet], []),
        (gib("jaxembed", "peak_rss_mib"), gib("st", "peak_rss_mib")),
        (gib("jaxembed", "rss_end_mib"), gib("st", "rss_end_mib")),
        ([rec["encode_throughput_cpu"]["ratio_jaxembed_over_st"]], []),
    ]
    for row, (ours, theirs) in zip(rows, want):
        assert _num(row[1]) == [round(x, 2) for x in ours], row
        if theirs:
            assert _num(row[2]) == [round(x, 2) for x in theirs], row

    abl = rec["quality_ablations_cpu"]["ablations"]
    names = {"PEG": "peg", "Matryoshka": "mrl", "MoTE": "mote"}
    cur = {"task order + E2D": "curriculum", "task order alone": "curriculum_shuffled", "Eq. 9 mask": "curriculum_masked"}
    seen = 0
    for row in _table(readme, "| ablation | 384 dims | 256 | 128 | 64 | per seed (384) |"):
        key = next((v for k, v in names.items() if row[0].startswith(k)), None)
        a = abl.get(key) if key else abl[next(v for k, v in cur.items() if k in row[0])]
        if key:
            dims = [a["difference"]] + [a[f"dim{d}"]["difference"] for d in (256, 128, 64)]
            seeds = [x - y for x, y in zip(a["arm_average_seeds"], a["baseline_average_seeds"])]
        else:  # the curriculum rows are against Vanilla, at 384 only
            dims, seeds = [a["difference_vs_vanilla"]], a["difference_vs_vanilla_seeds"]
        assert _num(" ".join(row[1:5])) == [round(x, 2) for x in dims], row
        assert _num(row[5]) == [round(x, 2) for x in seeds], row
        seen += 1
    assert seen == 6


def _record_file(cell: str) -> Path:
    """The record of a results-table cell: a markdown link to it, or its name in backticks."""
    import re

    m = re.fullmatch(r"\[[^\]]*\]\(([^)]+)\)", cell.strip())
    return (ROOT / m.group(1)) if m else RESULTS / cell.strip("`")


def _values(obj) -> list[float]:
    """Every number in a record (nested dicts / lists)."""
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _values(x)]
    if isinstance(obj, list):
        return [v for x in obj for v in _values(x)]
    return [float(obj)] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def test_readme_results_figures_are_in_their_records():
    """The README's results table: each row links its record under benchmarks/results/, the file exists, and every
    figure of the row is a value of that record as printed (rounded to the printed decimals; GiB figures from the
    record's MiB). A row that restates a row of docs/benchmarks.md (same record, same figures) is checked strictly
    there."""
    readme = (ROOT / "README.md").read_text()
    rows = _table(readme, "| what | jaxembed | sentence-transformers | record |")
    assert len(rows) >= 3
    assert any(r[0].startswith("train throughput vs ST (packed)") for r in rows), "the packed throughput row is gone"
    for row in rows:
        _assert_figures_in_record(row, row[1:3], row[3], gib=True)


def _assert_figures_in_record(row: list[str], cells: list[str], record_cell: str, gib: bool = False) -> None:
    """The record of ``record_cell`` exists under benchmarks/results/ and holds every figure of ``cells`` as
    printed (rounded to the printed decimals; with ``gib`` also a MiB value printed in GiB)."""
    import json
    import re

    rec = _record_file(record_cell)
    assert rec.parent == RESULTS and rec.exists(), row
    values = _values(json.loads(rec.read_text()))
    for cell in cells:
        for text in re.findall(r"[-+]?\d+\.\d+", cell.replace("**", "")):
            fig, d = float(text), len(text.split(".")[1])
            ok = any(round(v, d) == fig or (gib and round(v / 1024, d) == fig) for v in values)
            assert ok, f"{row[0]}: {text} is not a value of {rec.name} (rounded to {d} decimals)"


def test_readme_method_table_figures_are_in_their_record():
    """The README's 'Does each method help?' table: six arms, each row's record exists and holds every
    figure of the row as printed."""
    readme = (ROOT / "README.md").read_text()
    rows = _table(readme, "| arm | average (spread of 3 seeds) | vs base | vs its reference | STS average | record |")
    assert len(rows) == 6
    for row in rows:
        _assert_figures_in_record(row, row[1:5], row[5])
