"""MoTE: mixture of task experts with task-aware contrastive learning (Romero et al. 2025, arXiv:2506.17781;
docs/design.md, MoTE).

    jaxembed train --config mote --workdir runs/mote              # the recipe (accelerators)
    jaxembed train --config mote:tiny --workdir runs/mote_tiny    # 4 steps on CPU (CI)
    jaxembed train --config mote:cpu --workdir runs/mote_cpu      # 100 steps on CPU (benchmarks/mote_run.py)
    jaxembed train --config mote:cpu,ic --workdir runs/ic_cpu     # the instruction-conditioning baseline

Variants, combined with commas (``tiny,static``):
- ``tiny``: 4 steps of 8 queries on CPU, a tiny random BERT (jaxembed.models.tiny: 1 layer, 32 wide, MiniLM's
  tokenizer) up-cycled, on 5 of the real shared sets in four TA-CL units, one batch each: wikiqa (retrieval: the
  search query / document experts), trec + sst5 (one classification unit), stsb (STS: the classification expert),
  trec_clustering (the clustering expert); queries <= 48 tokens, documents <= 32. Every expert trains.
- ``cpu``: 100 steps of 16 queries on CPU, evaluated on the dev tasks (the benchmark's setting).
- ``ic``: instruction conditioning only (MoTE's IC baseline): the dense model, with the same data, instructions
  and TA-CL.
- ``static``: the static baseline of MoTE Table 4: heterogeneous batches and temperature 0.03 for every task.
- ``eob``: MoTE blocks in every other transformer block (EOB) instead of every block (EB).
- ``no_clustering``: without the clustering sets below (the clustering expert then never trains).

Clustering data: the shared training data has no clustering set, so the clustering expert would stay the
up-cycled dense block. Two clustering sets are built from the shared train/ classification files
(``jaxembed.data.clustering``: query = a text with a clustering instruction, positive = another text of its label,
negatives = texts of other labels, seeded; TREC question types and SST-5 sentiment levels), task type clustering:
MoTE routes them to the clustering expert, TA-CL gives them heterogeneous batches and temperature 0.06.

Every value below says where it comes from. "Paper" is the MoTE paper: section 4 and App. D.
"""

from jaxembed import mote, paths
from jaxembed.config import default_config
from jaxembed.config.io import recipe_spec
from jaxembed.data.clustering import shared_clustering_datasets
from jaxembed.data.shared_train import shared_train_config
from jaxembed.errors import UserError

NAME = recipe_spec(__file__)  # 'mote' (a copy of this file: its path), for the messages
VARIANTS = ("tiny", "cpu", "ic", "static", "eob", "no_clustering")
TINY_DATASETS = ("wikiqa", "trec", "sst5", "stsb", "trec_clustering")


def get_config(arg=None):
    variants = [v.strip() for v in (arg or "").split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"{NAME}: unknown variant(s) {', '.join(map(repr, unknown))} (variants: "
                        f"{', '.join(VARIANTS)}; combine with commas, e.g. {NAME}:tiny,static)")
    if "tiny" in variants and "cpu" in variants:
        raise UserError(f"{NAME}: variants tiny and cpu both set the run size; pick one")
    c = default_config()
    try:
        c.model.name = str(paths.demo_model_dir())  # paper: nomic-bert-2048 (not available offline); jaxembed's
    except Exception:                                # bundled all-MiniLM-L6-v2 (BERT, 6 layers), like the demo
        c.model.name = "sentence-transformers/all-MiniLM-L6-v2"
    c.model.max_length = 128                         # jaxembed demo; the shared data is short sentences
    c.model.mote.enabled = "ic" not in variants      # paper 4: IC vs MoTE, same data / instructions / training
    c.model.mote.experts = mote.DEFAULT_EXPERTS      # paper App. D.1: four experts, one per instruction type
    c.model.mote.placement = "every_other" if "eob" in variants else "every"  # paper 4: every block (EB)
    c.model.mote.default = mote.DEFAULT_EXPERT       # paper 5.3: unseen symmetric tasks -> classification
    # routing: jaxembed.mote.DEFAULT_ROUTING (default_config): retrieval / reranking -> search query / search
    # document (paper 3.1, 5.3); classification, clustering -> their experts; sts, pair_classification, nli ->
    # classification (paper 5.3, after Nussbaum et al. 2024).

    c.data = shared_train_config(paths.shared_data_dir())  # the 14 shared training sets (jaxembed.data.shared_train)
    if "no_clustering" not in variants:              # + clustering sets from train/ classification files (above)
        c.data.datasets = list(c.data.datasets) + shared_clustering_datasets(paths.shared_data_dir())
    c.data.store = ""
    c.data.packing = True        # several texts per row, no compute on padding (data.packing)
    for d in c.data.datasets:
        d.max_query_length = 32                      # jaxembed demo (the shared data's queries are short)
        d.max_doc_length = 64                        # jaxembed demo
    # TA-CL (paper 3.2, App. D.2, Table 4): retrieval batches from one dataset, classification / clustering
    # batches across the task type's datasets; temperature 0.03 (retrieval, classification), 0.06 (clustering).
    # `static`: heterogeneous batches and 0.03 for every task (Table 4's baseline).
    mote.ta_cl(c.data, static="static" in variants)
    c.data.sampling = "temperature"                  # jaxembed demo: p ~ size^(1/2); paper: one epoch of its data
    c.data.sampling_temperature = 2.0
    c.loss.temperature = 0.03                        # paper App. D.2: mixed batches (none under TA-CL) get 0.03
    # Paper App. D.3: 6144 (16 nodes x 8 A100s). On the shared data the smallest TA-CL unit (sick_nli, 1,126
    # examples per pass after temperature sampling) caps a one-dataset batch at ~1,100: 512 here. Set 6144 with
    # the paper's data (the gradient cache keeps the memory of one sub-batch).
    c.plan.global_batch_size = 512
    c.plan.epochs = 1.0                              # paper 4: a single epoch
    c.train.gradcache_chunk = 128                    # jaxembed: sub-batches of 128 rows (paper: no cache; same loss)
    c.optim.lr = 5e-6                                # paper 4
    c.optim.weight_decay = 0.1                       # paper 4
    c.optim.warmup_ratio = 0.1                       # not stated in the paper: jaxembed's default
    c.train.log_every = 10
    c.eval.tasks = ("STSBenchmark-dev", "SICK-R-dev", "MRPC-dev", "WikiQA-dev", "TrecQA-dev", "SST2-dev", "SST5-dev")
    c.eval.every = 0                                 # at the end only (MTEB-style comparisons use the export)
    c.eval.max_examples = 500                        # jaxembed: the trainer's cheap dev signal

    if "cpu" in variants or "tiny" in variants:      # CPU runs: the demo's scale, not the paper's
        c.plan.global_batch_size = 16                # jaxembed demo
        c.plan.steps = 100
        c.train.gradcache_chunk = 0
        c.optim.lr = 2e-5                            # jaxembed demo: 5e-6 barely moves 100 small steps
        for d in c.data.datasets:
            d.num_negatives = min(int(d.num_negatives), 1)  # jaxembed demo: one hard negative per query
        c.train.checkpoint_every = 50
        c.eval.every = 50
        c.eval.before = True
    if "tiny" in variants:                           # CI: a few steps on the real data, a tiny random BERT
        from jaxembed.models.tiny import tiny_model_dir

        c.model.name = str(tiny_model_dir("bert", num_layers=1, pooling="mean", max_length=64))
        c.data.datasets = [d for d in c.data.datasets if d.name in TINY_DATASETS]
        c.data.sampling = "weights"                  # every kept dataset equally likely
        for d in c.data.datasets:                    # ... and so every unit: trec + sst5 share one (TA-CL)
            d.weight = 0.5 if d.task_type == "classification" else 1.0
        c.plan.seed = 53                             # jaxembed: a plan whose 4 steps take every unit, the clustering
        #                                              one in the last two (tests/test_mote.py compares steps 2 and 4)
        c.plan.global_batch_size = 8
        c.plan.steps = 4
        c.optim.lr = 1e-3                            # a random model: a visible step
        c.train.dropout = False
        c.model.max_length = 64
        for d in c.data.datasets:                    # short: few length buckets (compilations); queries keep
            d.max_query_length = 48                  # room for the instruction (~20 tokens) and the text
            d.max_doc_length = 32
        c.train.log_every = 1
        c.train.checkpoint_every = 2
        c.eval.tasks = ()
        c.eval.every = 0
        c.eval.before = False
    return c
