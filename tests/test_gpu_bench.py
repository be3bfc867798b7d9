"""The GPU benchmark (benchmarks/gpu) and the trainer's device figures.

On the CPU: MFU and device memory in the trainer's metrics from a (faked) device kind and allocator; the whole
benchmark run end to end through its entry script with tiny sizes (--dry-run: every part, every worker, the
same code as on a GPU), and its results recorded. On an accelerator only (marked ``gpu``, run by the benchmark's
part 1): the device-memory count, bf16 train steps against float32, and a gradient-cache + tiled-loss step with
more than 80,000 candidates against the plain step.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_BENCH = ROOT / "benchmarks" / "gpu"

# ------------------------------------------------------------------------------------------------ trainer metrics


class _FakeDevice:
    def __init__(self, kind: str, stats: dict | None):
        self.device_kind, self._stats = kind, stats

    def memory_stats(self):
        return self._stats


def _fake_jax(monkeypatch, kind: str, stats: dict | None):
    """jaxembed.flops sees one device of ``kind`` whose allocator reports ``stats`` (the rest of JAX is real)."""
    from jaxembed import flops

    dev = _FakeDevice(kind, stats)
    monkeypatch.setattr(flops, "jax", SimpleNamespace(devices=lambda: [dev], local_devices=lambda: [dev]))


def _metrics(monkeypatch, elapsed: float, flops_per_step: list[float]) -> dict:
    """The trainer's logged figures of len(flops_per_step) steps that took ``elapsed`` seconds."""
    import jax.numpy as jnp

    from jaxembed.train import metrics as train_metrics

    monkeypatch.setattr(train_metrics, "time", SimpleNamespace(time=lambda: 100.0 + elapsed))
    pending = [(s, {"loss": jnp.asarray(1.0), "ok": jnp.asarray(True)},
                {"examples": 8, "tokens": 100, "padded_tokens": 128}) for s in range(len(flops_per_step))]
    out, _ = train_metrics.host_metrics(pending, None, 100.0, flops_per_step)
    return out


def test_peak_flops_by_device_kind():
    from jaxembed.flops import peak_flops_for

    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("NVIDIA H200") == 989e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12  # before the SXM entry it contains
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("cpu") is None


def test_trainer_logs_mfu_and_device_memory_on_a_known_accelerator(monkeypatch):
    """An H100 whose allocator peaked at 3 GiB: MFU = the steps' FLOPs / the time / the datasheet peak, and the
    peak memory in GiB, in the logged line."""
    _fake_jax(monkeypatch, "NVIDIA H100 80GB HBM3", {"peak_bytes_in_use": 3 * 2**30, "bytes_in_use": 2**30})
    out = _metrics(monkeypatch, 2.0, [4e14, 6e14])
    assert out["mfu"] == pytest.approx(1e15 / 2.0 / 989e12)
    assert out["device_memory_peak_gib"] == pytest.approx(3.0)
    assert out["step_time_s"] == pytest.approx(1.0)


def test_trainer_logs_no_mfu_or_device_memory_where_unknown(monkeypatch):
    """An unknown device (no datasheet peak) whose backend counts no memory -- the CPU -- gets neither figure."""
    _fake_jax(monkeypatch, "SomeNewChip 9000", None)
    out = _metrics(monkeypatch, 2.0, [4e14])
    assert "mfu" not in out and "device_memory_peak_gib" not in out
    monkeypatch.undo()
    out = _metrics(monkeypatch, 2.0, [4e14])  # the real CPU backend
    assert "mfu" not in out and "device_memory_peak_gib" not in out


# ------------------------------------------------------------------------------------------------ the dry run


@pytest.mark.timeout(900)  # one shared worker process, 8 tiny compilations; the margin is for a busy machine
def test_gpu_benchmark_dry_run_end_to_end(shared_data, tmp_path):
    """benchmarks/gpu/run.sh --dry-run on the CPU: the smoke step, pytest -m gpu (skipped here), part 2 (tiny
    BERT: jaxembed fixed / packed / padded, compiled side by side, with a profile; sentence-transformers fixed /
    natural / padding-free), part 5 (long documents in packed rows, xla and a kernel that cannot run here), part 6
    (a tiny decoder with LoRA, remat and the gradient cache; ST's recipe with PEFT at two batches), part 3 (the
    gradient cache + tiled loss, and the plain step), part 4 (encode); every JSON written, the same texts for both
    tools, MFU from the given peak, nothing left to do, every job in one worker process; then the results
    recorded."""
    out, root = tmp_path / "out", tmp_path / "root"
    # cheap compilation (the figures of a dry run mean nothing: the suite's XLA_FLAGS, tests/conftest.py FAST_XLA)
    # and one compute thread per framework
    env = dict(os.environ, GPU_BENCH_NO_WHEELS="1", PYTHON=sys.executable, JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip())
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    p = subprocess.run(["bash", str(GPU_BENCH / "run.sh"), str(out), "--dry-run", "--peak-flops", "1e12",
                        "--root", str(root)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    files = sorted(x.name for x in out.iterdir())
    assert files == ["log.txt", "part1_pytest.json", "part2_train.json", "part3_batch.json", "part4_encode.json",
                     "part5_long.json", "part6_llm.json", "summary.json"]
    load = lambda n: json.loads((out / n).read_text())
    s = load("summary.json")
    assert s["dry_run"] and s["todo"] == {} and s["next_command"] is None, (s["todo"], p.stdout[-3000:])
    assert [x for x in s["smoke"][0]["results"] if x["kind"] == "step"][0]["ok"]
    assert s["device"]["jax"]["platform"] == "cpu" and "jax" in s["versions"]
    # the software each tool ran on; CUDA / cuDNN as JAX and torch report them: none on the CPU
    assert {"jax", "jaxlib", "torch", "transformers", "sentence-transformers"} <= set(s["versions"])
    assert all(s["versions"][k] is None for k in ("jax_cuda_runtime", "jax_cudnn", "jax_cuda_driver", "torch_cuda",
                                                  "torch_cudnn"))
    assert s["workers"]["shared_process"] and s["parts"] == ["train", "long", "llm", "batch", "encode", "pytest"]

    t1 = load("part1_pytest.json")
    assert "tests/test_gpu_bench.py" in t1["files"] and "tests/test_attention.py" in t1["files"]
    assert "tests/test_ci_policy.py" not in t1["files"]  # it names the marker in a string only
    assert t1["rc"] == 0 and t1["counts"].get("skipped", 0) >= 5 and not t1["counts"].get("failed")

    e = load("part2_train.json")["models"]["tiny-bert"]
    for tool, settings in (("jaxembed", ("fixed", "packed", "padded")), ("st", ("fixed", "natural", "flat"))):
        for k in settings:
            r = e[tool][k]
            assert r["finite"] and r["step_s"] > 0 and r["examples_per_s"] > 0, (tool, k, r)
            assert len(r["round_times_s"]) == 2  # the dry run's rounds: the median of two
            assert r["mfu"] == pytest.approx(r["flops_per_round"] / statistics.median(r["round_times_s"]) / 1e12)
    j, st = e["jaxembed"], e["st"]
    # the fixed arms time 4 back-to-back steps a round (one device sync a round), as the natural arms time theirs
    assert j["fixed"]["steps_per_round"] == st["fixed"]["steps_per_round"] == 4
    assert j["fixed"]["examples_per_round"] == st["fixed"]["examples_per_round"] == 4 * 8
    # each arm names its optimizer; ST's its attention (the CPU has no fused AdamW kernel here: foreach)
    assert all(st[k]["optimizer"] == "torch.optim.AdamW(foreach=True)" for k in st if "step_s" in st[k])
    assert all("optax" in j[k]["optimizer"] for k in j if "step_s" in j[k])
    assert st["fixed"]["attention_implementation"] == st["natural"]["attention_implementation"] == "sdpa"
    assert st["flat"]["attention_implementation"] == "sdpa" and "dense" in st["flat"]["kernel_ran"]["kernel"]
    # every timed arm's round-to-round spread in the summary, those above 5 % flagged
    sp = s["round_spread"]
    assert {f"train/models/tiny-bert/{t}/{k}" for t, arms in (("jaxembed", j), ("st", st)) for k in arms
            if "step_s" in arms[k]} <= set(sp["arms"])
    assert sp["limit"] == 0.05 and sp["flagged"] == {k: v for k, v in sp["arms"].items() if v > 0.05}
    assert (("SPREAD " in p.stdout) == bool(sp["flagged"])), p.stdout[-2000:]
    # the same steps' texts for every natural arm: the same real tokens; packing computes fewer slots than padding,
    # padding-free none but the real ones
    assert j["packed"]["real_tokens_per_round"] == j["padded"]["real_tokens_per_round"] == \
        st["natural"]["real_tokens_per_round"] == st["flat"]["real_tokens_per_round"]
    assert j["packed"]["token_slots_per_round"] < j["padded"]["token_slots_per_round"]
    assert st["flat"]["token_slots_per_round"] == st["flat"]["real_tokens_per_round"]
    assert j["fixed"]["real_fraction"] == st["fixed"]["real_fraction"] == 1.0
    assert j["fixed"]["real_tokens_per_round"] == st["fixed"]["real_tokens_per_round"]
    # the flat arm: no varlen kernel on the CPU, said so, and the same function as ST's own forward
    assert st["flat"]["attention"] == "sdpa_block_mask" and "CPU" in st["flat"]["tried"]["torch_varlen"]
    assert st["flat"]["agreement"]["min_cosine"] > 0.9999
    # the device's path (transformers' AttentionInterface + a varlen kernel fed cu_seq_lens), with the kernel's CPU
    # stand-in: BERT here, Qwen2 in part 6
    assert st["flat"]["varlen_wiring"]["min_cosine"] > 0.9999
    ran = st["flat"]["varlen_wiring"]["kernel_ran"]  # the registered varlen function computed the layers
    assert ran["kernel"].endswith("_varlen_reference") and ran["calls"] >= 1 and ran["cast"] == {}
    assert {"ratio_packed_over_st", "ratio_packed_over_padded", "ratio_fixed_over_st"} <= set(e)
    for key in ("fixed_vs_st_fixed", "packed_vs_st_natural", "padded_vs_st_natural", "packed_vs_st_flat"):
        c = e["compare"][key]
        assert c["examples_ratio"] == pytest.approx(c["slots_saved"] * c["speed_per_slot"])
    # the controls' wave (fixed, packed) compiled side by side, then padded
    assert e["compile"]["fixed+packed"]["threads"] == 2 and set(e["compile"]["fixed+packed"]["per_setting_s"]) == \
        {"fixed", "packed"} and e["compile"]["padded"]["wave"] == ["padded"]
    assert e["profile"]["packed"]["total_ms"] > 0 and e["profile"]["packed"]["top"]

    lg = load("part5_long.json")["models"]["tiny-bert"]
    assert lg["setup"]["lengths"]["source"] == "eval/newsgroups_mini.jsonl"
    row = lg["rows"]["64"]
    assert row["xla"]["finite"] and row["xla"]["step_s"] > 0 and row["xla"]["largest_batch_predicted"] > 8
    assert "interpret mode" in row["pallas"]["error"]  # a GPU kernel on the CPU: a recorded failure, not a crash
    assert row["choice"]["fastest"] == "xla" and row["layout"]["segment_bound"] >= 2

    llm = load("part6_llm.json")["models"]["tiny-qwen2"]
    jl = llm["jaxembed"]
    assert jl["finite"] and jl["step_s"] > 0 and jl["mode"] == "lora" and jl["remat"] and jl["chunk"] == 8
    assert llm["setup"]["jaxembed"]["trainable_params"] == llm["setup"]["st"]["trainable_params"]  # the same adapters
    assert [b for b, r in llm["st"].items() if "step_s" in r] == ["4", "8"] and llm["st_largest_batch"] == 8
    assert llm["tokens_ratio"] > 0 and llm["varlen_wiring"]["min_cosine"] > 0.9999
    assert llm["varlen_wiring"]["kernel_ran"]["calls"] >= 1  # Qwen2's layers called the registered varlen function

    b = load("part3_batch.json")
    assert [t["global_batch"] for t in b["trials"] if "step_s" in t] == [16]
    assert b["largest_global_batch"] == 16 and b["largest_candidates"] == 16 * 6
    assert b["trials"][0]["finite"] and b["trials"][0]["mfu"] > 0
    assert {t["setting"] for t in b["overhead"] if "step_s" in t} == {"plain", "cached"} and b["cache_overhead"] > 0

    enc = load("part4_encode.json")["models"]["tiny-bert"]
    assert enc["ratio"] > 0 and enc["min_cosine"] > 0.99  # the same random model in both tools

    lines = subprocess.run([sys.executable, str(GPU_BENCH / "bench.py"), "--record", str(out), "--results-dir",
                            str(tmp_path / "results"), "--readme", str(tmp_path / "README.md")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert lines.returncode == 0, lines.stderr[-2000:]
    readme = (tmp_path / "README.md").read_text().splitlines()
    assert len(readme) == 6 and all(x.startswith("| ") and "dry run" in x for x in readme)
    assert "packed/ST" in readme[1] and "slots saved" in readme[1] and "largest global batch **16**" in readme[2]
    assert "fastest **xla**" in readme[4] and "ST + PEFT largest B=8" in readme[5]
    assert len(list((tmp_path / "results").glob("gpu_*_cpu_*.json"))) == 7


def test_gpu_benchmark_figures_targets_and_the_next_call():
    """The summary's arithmetic on made-up figures: step time relative to the reference batch, the cache's
    overhead, each target (bench.TARGETS) met or not, and the second call that measures what did not fit."""
    sys.path.insert(0, str(GPU_BENCH))
    import bench

    trial = lambda B, t: {"global_batch": B, "candidates": 6 * B, "step_s": t}
    res = {"sizes": [1024, 16384, 8192], "trials": [trial(1024, 1.0), trial(16384, 17.6), {"global_batch": 8192,
           "skipped": "time"}], "overhead": [dict(trial(256, 0.3), setting="plain"),
                                             dict(trial(256, 0.39), setting="cached")]}
    f = bench.batch_figures(res)
    assert f["largest_global_batch"] == 16384 and f["largest_candidates"] == 98304
    assert f["relative_to_reference"]["16384"] == {"step_time_ratio": 17.6, "ideal": 16.0,
                                                  "per_example_ratio": pytest.approx(1.1)}
    assert f["cache_overhead"] == pytest.approx(1.3)
    entry = lambda packed, st, mfu: {"jaxembed": {"packed": {"examples_per_s": packed, "mfu": mfu,
                                                             "mfu_real_tokens": mfu / 2}},
                                     "st": {"natural": {"examples_per_s": st}}}
    models = {"minilm": entry(3000, 1500, 0.2), "bert-base": entry(900, 700, 0.45), "bert-large": entry(300, 200, 0.5)}
    for e in models.values():
        e.update(bench.ratios(e))
    t = bench.targets({"train": {"models": models}, "batch": dict(res, **f)})
    assert t["throughput"]["met"] is False and t["throughput"]["values"]["minilm"] == 2.0  # BERT-base: 1.29x
    assert t["mfu"]["met"] is True and t["candidates"]["met"] is True and t["cache_overhead"]["met"] is True
    assert bench.targets({})["mfu"]["met"] is None  # not measured
    assert bench.next_command({}) is None
    assert bench.next_command({"train": ["qwen2-0.5b:64"], "batch": [8192]}) == (
        "bash benchmarks/gpu/run.sh $OUT --parts 2,3 --models qwen2-0.5b:64 --sizes 8192")


def test_gpu_benchmark_engine_split_and_the_issue_targets():
    """Part 2's summary on made-up figures: each jaxembed / ST pair as slots saved x speed per computed slot (and
    by FLOPs), the engine targets (speed per computed token >= 1.2x ST at fixed and natural lengths, MFU on computed
    slots per model, real tokens >= 1.3x ST's padding-free arm), parts 5 / 6's specs, figures and next call."""
    sys.path.insert(0, str(GPU_BENCH))
    import bench

    def arm(ex, slots, flops, real, t=1.0, mfu=None):  # one round of 4 steps of `ex` examples in t seconds
        return {"examples_per_round": 4 * ex, "examples_per_s": 4 * ex / t, "token_slots_per_round": slots,
                "flops_per_round": flops, "real_tokens_per_s": real / t, "real_fraction": real / slots, "mfu": mfu}

    # ST pads to 4,000 slots per round, jaxembed packs the same texts (1,000 real tokens) in 1,250 slots and runs
    # them in 0.2 s against ST's 1 s: 5x = 3.2x slots saved x 1.5625x speed per computed slot
    j = {"packed": arm(64, 1250, 2e12, 1000, 0.2, 0.41), "fixed": arm(64, 4000, 8e12, 4000, 0.5, 0.46),
         "padded": arm(64, 2000, 3e12, 1000, 0.5)}
    st = {"natural": arm(64, 4000, 6e12, 1000, 1.0), "fixed": arm(64, 4000, 8e12, 4000, 0.75),
          "flat": arm(64, 1000, 1.5e12, 1000, 0.3)}
    e = {"jaxembed": j, "st": st}
    e.update(bench.ratios(e))
    c = e["compare"]["packed_vs_st_natural"]
    assert c["examples_ratio"] == pytest.approx(5.0) and c["slots_saved"] == pytest.approx(3.2)
    assert c["speed_per_slot"] == pytest.approx(5.0 / 3.2) and c["flops_saved"] == pytest.approx(3.0)
    assert c["summary"] == "5.00x = 3.20x slots saved x 1.56x speed per computed slot"
    assert e["compare"]["fixed_vs_st_fixed"]["speed_per_slot"] == pytest.approx(1.5)
    assert e["compare"]["packed_vs_st_flat"]["real_tokens_ratio"] == pytest.approx(1.5)
    models = {m: dict(e) for m in bench.ENGINE_MODELS}
    t = bench.targets({"train": {"models": models}})
    assert t["engine_fixed"]["met"] is True and t["engine_natural"]["met"] is True
    assert t["vs_padding_free"]["met"] is True
    assert t["mfu_computed"]["met"] is False  # BERT-large: 41 % packed, 46 % fixed; the target is 45 % for both
    assert t["mfu_computed"]["values"]["bert-large packed"] == 0.41
    slow = dict(e, compare=dict(e["compare"], packed_vs_st_flat=dict(c, real_tokens_ratio=1.1)))
    assert bench.targets({"train": {"models": dict(models, minilm=slow)}})["vs_padding_free"]["met"] is False
    assert bench.targets({"train": {"models": {"minilm": e}}})["engine_fixed"]["met"] is None  # three not measured

    assert bench.long_specs("bert-base:512:64:512+2048") == [{"model": "bert-base", "cap": 512, "batch": 64,
                                                             "rows": [512, 2048]}]
    spec = bench.llm_specs("qwen2-7b:lora:128:16:remat,qwen2-1.5b:full:256:32")
    assert spec[0] == {"model": "qwen2-7b", "mode": "lora", "batch": 128, "chunk": 16, "remat": True}
    assert not spec[1]["remat"]
    assert bench.next_command({"long": [{"model": "bert-base", "cap": 512, "batch": 64, "rows": [2048]}],
                               "llm": spec[:1]}) == ("bash benchmarks/gpu/run.sh $OUT --parts 5,6 --long "
                                                     "bert-base:512:64:2048 --llm qwen2-7b:lora:128:16:remat")
    f = bench.llm_figures({"jaxembed": {"real_tokens_per_s": 3000.0},
                           "st": {"8": {"global_batch": 8, "step_s": 1, "real_tokens_per_s": 1000.0},
                                  "16": {"global_batch": 16, "step_s": 1.5, "real_tokens_per_s": 1500.0},
                                  "32": {"global_batch": 32, "oom": True}}})
    assert f == {"st_largest_batch": 16, "st_best_tokens_per_s": 1500.0, "tokens_ratio": 2.0}
    rule = bench.auto_rule({"models": {"bert-base": {"rows": {"2048": {"choice": {"fastest": "pallas",
                                                                                  "over_xla": {"pallas": 1.4}}}}}}})
    assert rule == {"bert-base": {"2048": {"fastest": "pallas", "over_xla": {"pallas": 1.4}}}}


def test_long_documents_have_the_sampled_lengths_and_the_kernel_bounds(shared_data, tmp_path):
    """Part 5 / 6's data: documents with the long-passage sample's token counts (cut at the cap) in the model's
    own tokenizer, the cuDNN segment bound of packed rows, and a kernel forced into the model only inside its
    context."""
    sys.path.insert(0, str(GPU_BENCH))
    import harness as H

    from jaxembed.models import attention as A
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.tokenizer import Tokenizer

    ll = H.long_lengths()
    assert ll["source"] == "eval/newsgroups_mini.jsonl" and len(ll["lengths"]) == 200
    assert np.mean(ll["lengths"]) > 500  # the longest-passage set of the shared data
    for arch, cap in (("bert", 96), ("qwen2", 128)):
        folder = tiny_model_dir(arch)
        path, stats = H.long_data_file(tmp_path, folder, rows=6, cap=cap, seed=3)
        tok = Tokenizer.from_folder(folder, 4096)
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        docs = [r["pos"][0] for r in rows] + [r["neg"][0] for r in rows]
        n = [len(x) for x in tok.tokenize(docs)]
        specials = len(tok.tokenize(["a"])[0]) - 1
        rng = np.random.default_rng(3)
        want = np.minimum(rng.choice(np.asarray(ll["lengths"]), size=(6, 2)), cap)
        assert n == [max(int(x) - 2, 1) + specials for x in list(want[:, 0]) + list(want[:, 1])], (arch, n)
        assert stats["cap"] == cap and stats["doc_at_cap"] == pytest.approx((want >= cap).mean())
    ids = np.array([[1, 1, 2, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]])
    assert H.segment_bound([{"pack_segment_ids": ids}]) == 4  # texts 1-3 and the padding run
    assert H.plan_segment_bound({"row_length": np.array([8, 8])}, np.array([2, 5])) == 5
    orig = A.attention
    with H.forced_attention("pallas", max_runs=4):
        assert A.attention is not orig and A.cudnn_attention.keywords == {"max_runs": 4}
    assert A.attention is orig and not hasattr(A.cudnn_attention, "keywords")


# ------------------------------------------------------------------------------------------------ accelerator only


def _steps(tmp_path: Path, *, dtype: str, B: int, K: int, chunk: int, tiled: bool, lq: int, ld: int, steps: int,
           lr: float = 2e-5):
    """(loss, grad_norm) of ``steps`` train steps of a tiny BERT (dropout off, no warm-up, learning rate ``lr``)
    on one fixed batch, the benchmark's harness (benchmarks/gpu/harness.py) building the run."""
    sys.path.insert(0, str(GPU_BENCH))
    import harness as H

    from jaxembed import parallel
    from jaxembed.data.pipeline import to_global
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import init_state, make_train_step

    # the plan's global batch (the template's rows) must be a multiple of the cache's sub-batch
    c = H.run_config(tiny_model_dir("bert"), chunk or 8, data=H.natural_data_file(tmp_path),
                     store=tmp_path / f"store_k{K}", K=K, packing=False, chunk=chunk, tiled=tiled, plan_steps=2,
                     dtype=dtype)
    c.train.dropout = False
    c.optim.lr, c.optim.warmup_steps, c.optim.schedule = lr, 0, "constant"
    _, run = H.make_runs(c, tmp_path / f"run_{dtype}_{B}x{K}_{chunk}_{tiled}")
    host = H.fixed_batch(H.loader_of(run, "padded").batch(0), B, K, lq, ld, 30522)
    state, step = init_state(run), make_train_step(run)
    batch = to_global(host, parallel.batch_sharding(run.mesh))
    out = []
    for _ in range(steps):
        state, m = step(state, batch)
        out.append((float(m["loss"]), float(m["grad_norm"])))
    return np.array(out)


@pytest.mark.gpu
def test_device_memory_peak_counts_an_allocation_on_the_accelerator():
    import jax
    import jax.numpy as jnp

    from jaxembed.flops import device_memory_peak_gib

    x = jax.block_until_ready(jnp.ones((64, 1024, 1024), jnp.float32))  # 0.25 GiB
    assert device_memory_peak_gib() >= 0.25
    del x


@pytest.mark.gpu
def test_bf16_train_steps_learn_as_float32_on_the_accelerator(shared_data, tmp_path):
    """Eight steps (learning rate 1e-3) of a tiny BERT from the same random weights on one batch: bf16 compute
    (float32 master weights) starts at float32's loss and fits the batch as float32 does. (Step by step the two
    drift apart: a random model's embeddings nearly coincide, so its gradients are mostly rounding, and bf16's
    differ from float32's already at step 1 -- measured on the CPU: grad norm 2.5 vs 0.82, loss equal.)"""
    kw = dict(B=64, K=2, chunk=0, tiled=False, lq=32, ld=64, steps=8, lr=1e-3)
    f32 = _steps(tmp_path, dtype="float32", **kw)
    bf16 = _steps(tmp_path, dtype="bfloat16", **kw)
    assert np.isfinite(bf16).all() and np.isfinite(f32).all()
    assert bf16[0, 0] == pytest.approx(f32[0, 0], rel=1e-3)
    assert f32[-1, 0] < 0.6 * f32[0, 0] and bf16[-1, 0] < 0.6 * bf16[0, 0], (f32[:, 0], bf16[:, 0])


@pytest.mark.gpu
def test_step_with_80k_candidates_equals_the_plain_step_on_the_accelerator(shared_data, tmp_path):
    """14,336 queries x 6 candidates = 86,016 candidates in one step of a tiny BERT: the gradient cache (8
    sub-batches) with the tiled loss gives the loss and gradient norm of the plain step (the [B, N] logits built
    whole, 4.9 GB), float32 with full-precision matrix products (no TF32)."""
    import jax

    kw = dict(dtype="float32", B=14336, K=6, lq=8, ld=16, steps=1)
    with jax.default_matmul_precision("highest"):
        plain = _steps(tmp_path, chunk=0, tiled=False, **kw)
        cached = _steps(tmp_path, chunk=1792, tiled=True, **kw)
    assert np.isfinite(cached).all()
    np.testing.assert_allclose(cached[:, 0], plain[:, 0], rtol=1e-5)
    np.testing.assert_allclose(cached[:, 1], plain[:, 1], rtol=1e-3)


def test_diag_kernel_summary_sums_device_kernels_by_name(tmp_path):
    """benchmarks/gpu/diag.py's trace summary: device-stream events summed per kernel, host events left out, the
    trace copied flat beside the profile folder (a flat output folder copies back whole from a remote machine)."""
    import gzip
    import importlib.util

    spec = importlib.util.spec_from_file_location("diag", ROOT / "benchmarks" / "gpu" / "diag.py")
    diag = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diag)
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
              {"ph": "X", "pid": 1, "name": "input_scatter_fusion", "dur": 300.0, "args": {"hlo_op": "scatter.1"}},
              {"ph": "X", "pid": 1, "name": "input_scatter_fusion", "dur": 200.0},
              {"ph": "X", "pid": 1, "name": "gemm", "dur": 100.0},
              {"ph": "X", "pid": 2, "name": "PjitFunction", "dur": 10000.0}]
    folder = tmp_path / "trace" / "plugins" / "profile" / "x"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    s = diag.kernel_summary(tmp_path / "trace")
    assert s["processes"] == ["/device:GPU:0"] and s["total_us"] == 600.0
    top = s["kernels"][0]
    assert (top["name"], top["us"], top["calls"], top["hlo"]) == ("input_scatter_fusion", 500.0, 2, "scatter.1")
    assert top["share"] == pytest.approx(5 / 6)
    assert (tmp_path / "trace.json.gz").is_file()


def test_two_runs_on_one_machine_are_recorded_as_one_comparison(tmp_path):
    """sentence-transformers' arms measured in one run and jaxembed's in the next on the same machine (the H200 of
    2026-11-28): --record DIR1 DIR2 merges them arm by arm (each arm says its call), computes the split and the
    targets over the merged arms, and the README line names both calls' commands."""
    sys.path.insert(0, str(GPU_BENCH))

    def arm(ex, slots, flops, real, t, mfu):
        return {"examples_per_round": 4 * ex, "examples_per_s": 4 * ex / t, "token_slots_per_round": slots,
                "flops_per_round": flops, "real_tokens_per_s": real / t, "real_fraction": real / slots, "mfu": mfu,
                "xla_step_gib": 1.0}

    skipped = {"skipped": "-3 s left"}
    call1 = {"setting": {"jax_settings": ["fixed", "packed"], "st_settings": ["fixed", "natural", "flat"]},
             "models": {"bert-large": {"batch": 128, "jaxembed": {}, "st": {}},  # its jaxembed worker timed out
                        "bert-base": {"batch": 256, "jaxembed": {"fixed": skipped, "packed": skipped},
                                      "st": {"fixed": arm(64, 4000, 8e12, 4000, 0.75, 0.3),
                                             "natural": arm(64, 4000, 6e12, 1000, 1.0, 0.2),
                                             "flat": dict(arm(64, 1000, 1.5e12, 1000, 0.3, 0.1),
                                                          attention="torch_varlen")}}}}
    call2 = {"setting": {"jax_settings": ["fixed", "packed", "padded"], "st_settings": []},
             "models": {"bert-base": {"batch": 256, "jaxembed": {"fixed": arm(64, 4000, 8e12, 4000, 0.5, 0.46),
                                                                 "packed": arm(64, 1250, 2e12, 1000, 0.2, 0.41),
                                                                 "padded": skipped},
                                      "st": {}, "compile": {"fixed+packed": {"wall_s": 60.0}}}}}
    dirs = []
    for i, (part, argv) in enumerate([(call1, ["--out", "/o", "--parts", "2"]),
                                      (call2, ["--out", "/o", "--parts", "2", "--st-settings", "none"])]):
        d = tmp_path / f"call{i}"
        d.mkdir()
        (d / "part2_train.json").write_text(json.dumps(part))
        (d / "summary.json").write_text(json.dumps({"date": "2026-11-28", "argv": argv, "started": f"t{i}",
                                                    "device": {"nvidia_smi": "NVIDIA H200, 143771 MiB"}}))
        dirs.append(str(d))
    p = subprocess.run([sys.executable, str(GPU_BENCH / "bench.py"), "--record", *dirs, "--results-dir",
                        str(tmp_path / "results"), "--readme", str(tmp_path / "README.md")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    (line,) = (tmp_path / "README.md").read_text().splitlines()
    assert "2 runs on one machine merged" in line and "| NVIDIA H200 |" in line
    assert ("`bash benchmarks/gpu/run.sh $OUT --parts 2`; then `bash benchmarks/gpu/run.sh $OUT --parts 2 "
            "--st-settings none`") in line
    assert "packed vs ST natural 5.00x = 3.20x slots saved x 1.56x speed per computed slot" in line
    (rec,) = (tmp_path / "results").glob("gpu_train_h200_*.json")
    e = json.loads(rec.read_text())["models"]["bert-base"]
    assert e["jaxembed"]["packed"]["call"] == 1 and e["st"]["natural"]["call"] == 0
    assert e["compare"]["fixed_vs_st_fixed"]["speed_per_slot"] == pytest.approx(1.5)
    assert e["missing"] == ["jaxembed padded"] and e["compile"]["fixed+packed"]["call"] == 1
    (summ,) = (tmp_path / "results").glob("gpu_summary_h200_*.json")
    s = json.loads(summ.read_text())
    assert [c["started"] for c in s["calls"]] == ["t0", "t1"]
    assert s["targets"]["engine_fixed"]["values"]["bert-base"] == pytest.approx(1.5)
    assert s["todo"] == {"train": ["bert-large:128", "bert-base:256"]}
    assert json.loads(rec.read_text())["models"]["bert-large"]["missing"] == [
        "jaxembed fixed", "jaxembed packed", "jaxembed padded", "st fixed", "st natural", "st flat"]


def test_pytest_part_keeps_the_outcomes_of_a_run_stopped_at_its_cap():
    """pytest -v's per-test lines are parsed, so a part stopped at its cap (no final summary) still says which
    tests passed and failed (the first H200 call recorded '0 passed, 0 failed' for 7 finished tests)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    import record

    import bench

    text = ("tests/a.py::t1 PASSED                                          [ 50%]\n"
            "tests/a.py::t2[x] FAILED                                       [100%]\n"
            "tests/a.py::t3 ")  # stopped while t3 ran
    r = {"timed_out": True, "counts": {}, "outcomes": bench.pytest_outcomes(text)}
    assert r["outcomes"] == {"tests/a.py::t1": "passed", "tests/a.py::t2[x]": "failed"}
    assert record.line_pytest(r) == ("1 passed, 1 failed, 0 skipped; failing: tests/a.py::t2[x] (stopped at its "
                                     "time cap)")
    # the second H200 call: pytest's header ("N deselected") is parsed as counts; the per-test lines still count
    r["counts"] = {"deselected": 33}
    assert record.line_pytest(r).startswith("1 passed, 1 failed, 0 skipped")


def test_varlen_attention_casts_q_k_v_to_the_compute_dtype_and_records_the_kernel():
    """ST's padding-free arm: under bf16 autocast RoPE leaves q / k in float32 while v is bfloat16; torch's varlen
    kernel takes half precision only, so the registered attention casts all three to autocast's dtype before the
    call, and the record names the kernel, its calls and the casts."""
    import torch

    sys.path.insert(0, str(GPU_BENCH))
    import workers

    seen = []

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        seen.append((q.dtype, k.dtype, v.dtype))
        return workers._varlen_reference(q.float(), k.float(), v.float(), cu_q, cu_k, max_q, max_k, scale=scale,
                                         window_size=window_size).to(q.dtype)

    from transformers import AttentionInterface

    name = workers._register_torch_varlen(kernel, "test_cast_varlen")
    fn = AttentionInterface._global_mapping[name]
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(2))  # [batch 1, heads, T, D], float32
    v = torch.randn(1, 2, 5, 4, generator=g).bfloat16()
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    module = SimpleNamespace(is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = fn(module, q, k, v, None, cu_seq_lens_q=cu, max_length_q=3)
    assert seen == [(torch.bfloat16,) * 3] and out.dtype == torch.bfloat16 and out.shape == (1, 5, 2, 4)
    ran = workers.VARLEN_RAN[name]
    assert ran == {"kernel": f"{__name__}.kernel", "calls": 1,
                   "cast": {"q": "float32 -> bfloat16", "k": "float32 -> bfloat16"}}
    want = workers._varlen_reference(*(t[0].transpose(0, 1).bfloat16().float() for t in (q, k, v)), cu, cu, 3, 3,
                                     window_size=(-1, 0))
    assert torch.allclose(out[0].float(), want, atol=2e-2)
    # no autocast: the tensors' own dtype, nothing cast
    seen.clear()
    fn(module, q, k, v.float(), None, cu_seq_lens_q=cu, max_length_q=3)
    assert seen == [(torch.float32,) * 3] and workers.VARLEN_RAN[name]["calls"] == 2


def test_round_spread_flags_the_unsteady_arms():
    """The summary's round_spread: max / min - 1 of every arm's timed rounds, those above 5 % flagged; an arm of
    one round has no spread."""
    sys.path.insert(0, str(GPU_BENCH))
    import bench

    res = {"train": {"models": {"m": {"st": {"natural": {"round_times_s": [0.93, 1.0, 1.11]},
                                             "fixed": {"round_times_s": [1.0, 1.04, 1.02]}},
                                      "jaxembed": {"fixed": {"round_times_s": [1.0]}}}}},
           "llm": {"models": {"q": {"st": {"8": {"round_times_s": [2.0, 2.2]}}}}}}
    sp = bench.round_spreads(res)
    assert sp["arms"] == pytest.approx({"train/models/m/st/natural": 1.11 / 0.93 - 1,
                                        "train/models/m/st/fixed": 0.04, "llm/models/q/st/8": 0.1})
    assert set(sp["flagged"]) == {"train/models/m/st/natural", "llm/models/q/st/8"} and sp["limit"] == 0.05


def test_flex_attention_counts_only_when_transformers_compiled_it(monkeypatch):
    """ST's padding-free arm takes flex attention only compiled: transformers' WrappedFlexAttention singleton,
    made by the first call, says whether it holds a torch.compile'd flex_attention."""
    sys.path.insert(0, str(GPU_BENCH))
    import workers
    from transformers.integrations.flex_attention import WrappedFlexAttention

    monkeypatch.setattr(WrappedFlexAttention, "_instance", None)
    assert not workers._flex_compiled()  # never called: nothing compiled
    monkeypatch.setattr(WrappedFlexAttention, "_instance", SimpleNamespace(_is_flex_compiled=True))
    assert workers._flex_compiled()
