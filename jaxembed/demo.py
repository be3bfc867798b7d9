"""``jaxembed demo``: the main job on the built-in default. Fine-tune all-MiniLM-L6-v2 on the shared multi-task data
(the recipe ``demo``: configs/demo.py), evaluate before and after, export, load the export with
sentence-transformers."""

from __future__ import annotations

import json
import time
from typing import Sequence

from jaxembed.runs import atomic_files
from jaxembed.runs.rundir import rundir

DEMO_SENTENCES = [
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "A woman is slicing an onion.",
    "A person is cutting vegetables in the kitchen.",
    "The stock market fell sharply on Monday.",
    "Shares dropped at the start of the week.",
]


DEMO_TASKS = ("STSBenchmark", "SICK-R", "MRPC", "WikiQA", "TREC")



def run_demo(workdir, *, tiny: bool = False, overrides: Sequence[str] = (), tasks: Sequence[str] | None = None,
             max_examples: int | None = None, progress: bool = True) -> int:
    """The demo (module docstring), printing as it goes; ``overrides``: ``KEY=VALUE`` of the config. -> the exit
    status (0, or 143 when training stopped before the end)."""
    import numpy as np

    from jaxembed import config as cfglib
    from jaxembed import evaluate as evallib
    from jaxembed import loading
    from jaxembed.encode import Encoder
    from jaxembed.evaluate.runner import format_comparison
    from jaxembed.train import train

    spec = "demo" + (":tiny" if tiny else "")  # the recipe, found from any folder (jaxembed.config.io)
    cfg = cfglib.apply_overrides(cfglib.load_config_file(spec), list(overrides))
    tasks = tuple(tasks) if tasks else DEMO_TASKS
    rd = rundir(workdir)
    workdir = rd.root
    print(f"model: {cfg.model.name}")
    base = loading.load(cfg.model.name)
    packing = cfglib.packing_enabled(cfg)  # data.packing (default True): packed rows in training and evaluation
    enc = Encoder.from_loaded(base)
    enc.packing = packing
    emb = enc.encode(DEMO_SENTENCES, progress=False)
    sim = enc.similarity(emb, emb)
    print("\nbefore training, nearest neighbours by cosine similarity:")
    for i, s in enumerate(DEMO_SENTENCES):
        j = max((k for k in range(len(DEMO_SENTENCES)) if k != i), key=lambda k: sim[i, k])
        print(f"  {s:<48} -> {DEMO_SENTENCES[j]!r} ({sim[i, j]:.3f})")
    kw = dict(max_examples=max_examples or None, progress=progress)
    sample = f", a fixed sample of <= {max_examples} examples each" if max_examples else ""
    print(f"\n[1/3] evaluating the base model on {', '.join(tasks)} (../shared/data/eval{sample}; reporting only)")
    before = evallib.evaluate(enc, tasks, **kw)
    print(f"\n[2/3] training {spec} -> {workdir} ({cfg.plan.steps} steps of {cfg.plan.global_batch_size} queries, "
          f"{'packed' if packing else 'padded'} rows; rerun to resume)")
    t0 = time.time()
    summary = train(cfg, rd)
    print(f"  {summary['status']} in {time.time() - t0:.0f}s; export: {summary.get('export')}")
    if summary["status"] != "completed":
        return 143
    export_dir = summary["export"]
    print(f"\n[3/3] evaluating the export ({export_dir})")
    after_enc = Encoder.from_loaded(loading.load(export_dir))
    after_enc.packing = packing
    after = evallib.evaluate(after_enc, tasks, **kw)
    try:
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(export_dir, device="cpu")
        diff = float(np.abs(st.encode(DEMO_SENTENCES) - after_enc.encode(DEMO_SENTENCES, progress=False)).max())
        print(f"  sentence-transformers loads the export: max |difference| to jaxembed's embeddings {diff:.1e}")
    except ImportError:
        print("  (sentence-transformers is not installed: pip install -e '.[eval]' to check the export with it)")
    print("\n" + format_comparison(before, after))
    atomic_files.write_text(rd.demo_results_json, json.dumps({"before": before, "after": after}, indent=2))
    print(f"\nresults: {rd.demo_results_json}")
    return 0
