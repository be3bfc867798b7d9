"""PEG: progressively learned embeddings with ~80k in-batch candidates (Wu et al. 2023, arXiv:2311.11691;
docs/design.md, PEG).

    jaxembed train --config peg --workdir runs/peg                  # PEG loss, 13,824 queries x 6 texts
    jaxembed train --config peg:infonce --workdir runs/peg_infonce  # the same run with plain InfoNCE
    jaxembed train --config peg:tiny --workdir runs/peg_tiny        # 2 steps on CPU

The batch (paper 4.1: 432 queries per GPU x 32 GPUs = 13,824 queries; each with 1 positive + 5 hard negatives =
82,944 candidates, "~80k"). How it maps onto devices:
- ``plan.global_batch_size = 13824`` queries over all devices of all hosts: the loader gives each host its rows,
  and each device of the ``train.mesh_data`` axis (all devices) holds 13,824 / #devices queries and 6x as many
  candidate rows (432 + 2,592 on each of 32 devices, as in the paper).
- ``train.gradcache_chunk = 864``: the encoder runs 864 global query rows (5,184 candidate rows) at a time under
  scan + checkpoint, 16 sub-batches per step; only one sub-batch's activations are alive. Choose it as
  27 x #devices (27 queries + 162 candidates of 256 tokens per device per sub-batch: by estimate ~55 GB of
  BERT-large activations in bf16 on an 80 GB GPU): 864 on 32 devices, --config.train.gradcache_chunk=216 on 8.
  It must divide 13,824 (validation checks). Add --config.model.remat=true to trade compute for memory.
- ``loss.tiled = True``: the [13,824 x 82,944] logits (4.6 GB in float32) are never built; blocks of
  ``block_q`` x ``block_c`` with an online log-sum-exp (README "Scaling the batch").
- The loss sees every candidate of the global batch, gathered from all devices (``loss.impl='jit'``).

Variants (combine with commas, e.g. ``peg:tiny,infonce``):
- ``tiny``: 2 steps of 8 queries x 6 texts on CPU, real shared data (wikiqa, trecqa, stsb), a tiny random BERT
  (jaxembed.models.tiny), with the tiled loss (4 x 16 blocks) switched on.
- ``infonce``: plain InfoNCE instead of the progressive loss (the paper's baseline, Eq. 2).
- ``retromae``: start from a RetroMAE pre-trained encoder (PEG's pre-training stage), the export folder of
  ``jaxembed pretrain retromae`` at ``retromae_dir`` (default runs/peg/retromae/export):
      jaxembed pretrain retromae --config retromae --workdir runs/peg/retromae \\
          --set model.name=bert-large-uncased --set model.max_length=512 --set optim.lr=2e-5 \\
          --set train.batch_size=1024 --set train.steps=N     # paper 4.1: lr 2e-5, 32 x 32 texts, 512 tokens, 3 epochs
- ``mined``: wikiqa and trecqa with PEG's own hard negatives: the top-5 of a retrieval model, false negatives
  removed by an LLM judge, read from ``mined_dir`` (default runs/peg/mined); see configs/README.md for the
  ``jaxembed mine`` + ``jaxembed judge`` commands.

Our data is not the paper's: PEG trains on 110M Chinese retrieval pairs with LLM-written queries; the shared data
has 124k examples of 6 task types (2 of them retrieval-like, 935 queries), so a 13,824-query batch covers the data
in 9 steps and 5 epochs are 44 steps. Batches mix every dataset (``random``), as PEG's do.
"""

from pathlib import Path

from ml_collections import FieldReference

from jaxembed import paths
from jaxembed.config import default_config
from jaxembed.config.io import recipe_spec
from jaxembed.data.shared_train import shared_train_config
from jaxembed.errors import UserError

NAME = recipe_spec(__file__)  # 'peg' (a copy of this file: its path), for the messages
VARIANTS = ("tiny", "infonce", "retromae", "mined")
TINY_DATASETS = ("wikiqa", "trecqa", "stsb")
MINED = ("wikiqa", "trecqa")  # PEG mines retrieval data; the classification negatives are the other labels
#: BGE's English retrieval instruction (PEG 4.1: "we refer to BGE to add an instruction in front of each query")
BGE_INSTRUCTION = "Represent this sentence for searching relevant passages: "


def _variants(arg):
    variants = [v.strip() for v in (arg or "").split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"{NAME}: unknown variant(s) {', '.join(map(repr, unknown))} (variants: "
                        f"{', '.join(VARIANTS)}; combine with commas, e.g. {NAME}:tiny,infonce)")
    if "tiny" in variants and "retromae" in variants:
        raise UserError(f"{NAME}: variants tiny and retromae both choose the model; pick one (or set "
                        "--config.model.name to a tiny RetroMAE export)")
    return variants


def _retromae_model(folder):
    """model.name of the ``retromae`` variant, computed when read: the export folder of jaxembed pretrain."""
    if not (Path(folder) / "config.json").is_file():
        raise UserError(f"{NAME}:retromae: {folder} holds no RetroMAE export (fix: run `jaxembed pretrain "
                        "retromae --config retromae --workdir runs/peg/retromae --set "
                        "model.name=bert-large-uncased ...` (configs/README.md), or set --config.retromae_dir to an "
                        "export folder)")
    return str(folder)


def _mined_file(d, name):
    """A mined dataset's path, computed when read: ``mined_dir``/<name>.jsonl (the judged file)."""
    missing = [n for n in MINED if not (Path(d) / f"{n}.jsonl").is_file()]
    if missing:
        train = paths.shared_data_dir() / "train"
        raise UserError(f"{NAME}:mined: {', '.join(f'{d}/{n}.jsonl' for n in missing)} missing (fix: for "
                        f"NAME in {' '.join(missing)}: `jaxembed mine --model BAAI/bge-large-en-v1.5 --input "
                        f"{train}/NAME.jsonl --query-instruction '{BGE_INSTRUCTION}' --top-k 1000000 --window 0:6 "
                        f"--num-negatives 5 --out {d}/raw/NAME.jsonl` then `jaxembed judge --input "
                        f"{d}/raw/NAME.jsonl --out {d}/NAME.jsonl --model LLM --base-url URL`; configs/README.md)")
    return str(Path(d) / f"{name}.jsonl")


def _lazy(section, key, fn, ref, *args):
    """section[key] = fn(ref value, *args), computed when read (see configs/datacube.py): an override of the
    folder moves the path, and a missing file is reported at validation."""
    section[key] = FieldReference("", field_type=str)
    section[key] = ref._apply_op(fn, *args)


def get_config(arg=None):
    variants = _variants(arg)
    tiny = "tiny" in variants
    c = default_config()

    # ---- model: BERT-large (paper 4.1: 24 layers, 16 heads, hidden 1024). bert-large-uncased is that architecture
    # with no contrastive training, so the PEG / InfoNCE comparison measures the losses; BGE-large (a BERT-large
    # already trained contrastively on 300M pairs) would mask it. PEG's own start is a RetroMAE pre-trained
    # BERT-large: the `retromae` variant. For a strong start instead: --config.model.name=BAAI/bge-large-en-v1.5.
    c.model.name = "bert-large-uncased"
    c.model.pooling = "cls"                         # [CLS]: RetroMAE's sentence embedding and BGE's (PEG follows BGE)
    c.model.max_length = 256                        # paper 4.1: documents 256 tokens (queries 64, below)
    c.model.dtype = "bfloat16"                      # mixed precision (paper: H800s, precision not stated)
    c.retromae_dir = "runs/peg/retromae/export"
    if "retromae" in variants:
        _lazy(c.model, "name", _retromae_model, c.get_ref("retromae_dir"))

    # ---- data: the 14 shared training sets; BGE's instruction on retrieval queries, none elsewhere (BGE v1.5)
    c.data = shared_train_config(paths.shared_data_dir())
    c.data.store = ""
    c.data.packing = True        # several texts per row, no compute on padding (data.packing)
    for d in c.data.datasets:
        d.query_instruction = BGE_INSTRUCTION if d.task_type in ("retrieval", "reranking") else ""
        d.num_negatives = min(int(d.num_negatives), 5)  # paper 3: five hard negatives per query (fewer where the
        #                                                 data has fewer: 1 for NLI and binary labels, 0 for pairs)
        d.max_query_length = 64                     # paper 4.1: query 64 tokens
        d.max_doc_length = 256                      # paper 4.1: document 256 tokens
        d.temperature = None
    c.mined_dir = "runs/peg/mined"
    if "mined" in variants:
        for d in c.data.datasets:
            if d.name in MINED:                     # paper 3: top-5 of a retrieval model, LLM-judged false negatives
                d.format = "triplets"
                _lazy(d, "path", _mined_file, c.get_ref("mined_dir"), d.name)
    c.data.sampling = "size"                        # every example each epoch (PEG: all data, 5 epochs)
    c.plan.global_batch_size = 13824                # paper 4.1: 432 per GPU x 32 GPUs; x 6 texts = 82,944 candidates
    c.plan.epochs = 5.0                             # paper 4.1: 5 epochs of fine-tuning
    c.plan.strategy = "random"                      # PEG batches mix all its data (no task-homogeneous batches)

    # ---- loss (paper 3, Eq. 3-6)
    c.loss.type = "infonce" if "infonce" in variants else "peg"
    c.loss.temperature = 0.01                       # paper 4.1: tau 0.01
    c.loss.peg_alpha = 0.5                          # paper 4.1: alpha 0.5 (momentum of t)
    c.loss.peg_beta = 0.1                           # paper 4.1: beta 0.1 (margin of sigma)
    c.loss.tiled = True                             # jaxembed: 13,824 x 82,944 logits never materialised
    c.loss.block_q, c.loss.block_c = 1024, 8192     # README defaults: 32 MB of fp32 logits per block
    c.train.gradcache_chunk = 864                   # 27 queries per device on 32 devices (module docstring)

    # ---- optimizer (paper 4.1: AdamW, lr 1e-5, linear decay, as pre-training)
    c.optim.lr = 1e-5
    c.optim.schedule = "linear"
    c.optim.warmup_ratio = 0.1                      # not stated; FlagEmbedding's (BGE) usual warm-up ratio
    c.train.log_every = 1                           # 44 large steps in all
    c.train.checkpoint_every = 5
    c.train.checkpoint_minutes = 30.0

    # ---- evaluation: retrieval first (PEG reports retrieval and reranking)
    c.eval.tasks = ("WikiQA-dev", "TrecQA-dev", "STSBenchmark-dev")
    c.eval.every = 10
    c.eval.best_metric = "WikiQA-dev/main_score"

    if tiny:                                        # CPU / CI: the real data, a tiny random BERT
        from jaxembed.models.tiny import tiny_model_dir

        c.model.name = str(tiny_model_dir("bert", num_layers=1, pooling="cls", max_length=64))
        c.model.max_length = 64
        c.model.dtype = "float32"
        c.data.datasets = [d for d in c.data.datasets if d.name in TINY_DATASETS]
        for d in c.data.datasets:
            d.max_query_length = 16
            d.max_doc_length = 32
        c.plan.global_batch_size = 8                # x 6 texts = 48 candidates
        c.plan.steps = 2
        c.plan.epochs = 1.0
        c.train.gradcache_chunk = 0                 # its compilation doubles the step's; tests/test_gradcache.py
        #                                             covers it (--config.train.gradcache_chunk=4 switches it on)
        c.loss.block_q, c.loss.block_c = 4, 16      # the tiled loss: 2 x 3 blocks of the 8 x 48 logits
        c.optim.lr = 1e-3                           # a random model: a visible step
        c.train.dropout = False
        c.train.checkpoint_every = 0
        c.train.checkpoint_minutes = 0.0
        c.eval.tasks = ()
        c.eval.every = 0
        c.eval.best_metric = ""
    return c


def get_hyper(arg=None):
    """The loss ablation: PEG vs InfoNCE, and PEG's beta (paper 4.1 sets alpha 0.5, beta 0.1 "empirically")."""
    return [{"loss.type": "infonce", "loss.peg_beta": 0.1}, {"loss.type": "peg", "loss.peg_beta": 0.1},
            {"loss.type": "peg", "loss.peg_beta": 0.05}, {"loss.type": "peg", "loss.peg_beta": 0.2}]
