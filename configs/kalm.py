"""KaLM-Embedding: a Qwen2-0.5B embedder in two stages (Hu et al. 2025, arXiv:2501.01028;
docs/design.md, KaLM-Embedding).

    # stage 1: weakly-supervised pre-training, in-batch negatives only
    jaxembed train --config kalm:stage1 --workdir runs/kalm/stage1
    # hard negatives with ranking-consistency filtering (top-k 50, 7 negatives from ranks 50-100), one command per
    # dataset of MINED, with the stage-1 model and the stage-1 store:
    jaxembed mine --model runs/kalm/stage1/export --store runs/kalm/stage1/store --dataset wikiqa \\
        --out runs/kalm/mined/wikiqa.jsonl          # ... and snli, sick_nli, sick_sts, stsb, mrpc, trecqa
    # stage 2: fine-tuning with the mined negatives (and Matryoshka), from stage 1's weights
    jaxembed train --config kalm:stage2 --workdir runs/kalm/stage2

Stage 2 starts from ``stage1_dir`` (model.init_from; default runs/kalm/stage1: its export/) and ``mined_dir``/<dataset>.jsonl
(default runs/kalm/mined) as the data of the mined datasets; a missing folder or file stops the run at validation
with the command that makes it. The classification datasets keep their own negatives (the other labels'
descriptions: KaLM 2.1 samples classification negatives from the labels, not by mining).

Variants (combine with commas, e.g. ``kalm:tiny,stage2,semi50``):
- ``stage1`` (the default) / ``stage2``: the two training stages (paper 3.1).
- ``semiNN``: semi-homogeneous task batches with NN % of every batch shuffled across batches (KaLM Fig. 3 / 4b),
  e.g. ``semi0`` (= the default: the final KaLM model did not use it, paper 2.3), ``semi10``, ``semi25``,
  ``semi50``, ``semi100`` (an integer 0-100).
- ``no_mrl``: Table 3 "w/o Matryoshka Representation Learning" (stage 2 only has MRL).
- ``no_instructions``: Table 3 "w/o Task Instructions": no instruction on any query.
- ``lora``: parameter-efficient fine-tuning (not in the paper; jaxembed.lora, docs/lora.md): LoRA adapters of rank 16
  (alpha 32, dropout 0.05) on every attention and MLP projection of Qwen2, the base weights frozen, lr 2e-4; the
  export holds the merged model and the PEFT adapter (``export/adapter/``). ``tiny,lora``: rank 4, no dropout.
- ``tiny``: batches of 8 queries on CPU, real shared data, a tiny random Qwen2 (jaxembed.models.tiny: 1 layer, 32
  wide): stage 1 is 3 steps on stsb, sick_nli, trec; stage 2 is 2 steps from stage 1's export on sick_nli (mined from
  runs/kalm_tiny/stage1) and trec, Matryoshka 32..2; one batch of each dataset (every dataset equally likely, and a
  plan seed whose draws take every one).
  The tiny chain: train :tiny,stage1 into runs/kalm_tiny/stage1; then
  ``jaxembed mine --model runs/kalm_tiny/stage1/export --store runs/kalm_tiny/stage1/store --dataset sick_nli
  --top-k 100 --window 10:40 --out runs/kalm_tiny/mined/sick_nli.jsonl`` (the 162-text corpus of sick_nli is too
  small for the 50 / 50-100 of the paper); then train :tiny,stage2.

The other Table 3 rows: "w/o Weakly-supervised Pre-training" = stage 2 from the base model
(--config.model.init_from=Qwen/Qwen2-0.5B's local folder, or --config.stage1_dir=a folder whose export/ is it);
"w/o Ranking Consistency Filtering" = mining with --top-k larger than the corpus.

Our data is not the paper's: KaLM pre-trains on ~20 weakly-supervised sources (Table 8) and fine-tunes on 70
datasets plus 550k persona-based synthetic examples; the shared data has 14 datasets of 6 task types (124k
examples), used by both stages (stage 1 without their negatives). ``jaxembed synth personas`` makes KaLM-style
synthetic data to add.
"""

from pathlib import Path

from ml_collections import FieldReference

from jaxembed import paths
from jaxembed.config import default_config
from jaxembed.config.io import recipe_spec
from jaxembed.data.shared_train import shared_train_config
from jaxembed.errors import UserError

NAME = recipe_spec(__file__)  # 'kalm' (a copy of this file: its path), for the messages and the commands they print
VARIANTS = ("tiny", "stage1", "stage2", "no_mrl", "no_instructions", "lora", "semiNN")  # semiNN: NN in 0-100
#: the datasets mined for stage 2: every dataset with a text corpus (classification keeps its label negatives)
MINED = ("snli", "sick_nli", "sick_sts", "stsb", "mrpc", "wikiqa", "trecqa")
TINY_STAGE1 = ("stsb", "sick_nli", "trec")
TINY_STAGE2 = ("sick_nli", "trec")
TINY_MINED = ("sick_nli",)
MRL_DIMS = (896, 512, 256, 128, 64)              # paper 2.3: MRL dims (896 = Qwen2-0.5B's hidden size)
MRL_WEIGHTS = (1.0, 0.3, 0.2, 0.1, 0.1)          # paper 2.3: their loss weights
TINY_MRL_DIMS = (32, 16, 8, 4, 2)                # the tiny model is 32 wide; the paper's weights


def _variants(arg):
    variants = [v.strip() for v in (arg or "").split(",") if v.strip()]
    semi = [v for v in variants if v.startswith("semi")]
    unknown = [v for v in variants if not (v in VARIANTS and v != "semiNN" or v in semi and v[4:].isdigit() and
                                           0 <= int(v[4:]) <= 100)]
    if unknown:
        raise UserError(f"{NAME}: unknown variant(s) {', '.join(map(repr, unknown))} (variants: "
                        f"{', '.join(VARIANTS)}, with NN in 0-100 (e.g. semi0, semi50); combine with commas, "
                        f"e.g. {NAME}:tiny,stage2,semi50)")
    if "stage1" in variants and "stage2" in variants:
        raise UserError(f"{NAME}: variants stage1 and stage2 are two runs; pick one")
    if len(semi) > 1:
        raise UserError(f"{NAME}: variants {', '.join(semi)} set the same proportion; pick one")
    return variants, (int(semi[0][4:]) / 100 if semi else None)


def _stage1_run(d, spec):
    """model.init_from of stage 2, computed when read: the stage-1 workdir ``stage1_dir`` (its export/, or its
    latest checkpoint)."""
    if not ((Path(d) / "export" / "config.json").is_file() or (Path(d) / "checkpoints").is_dir()):
        stage1 = spec + (",stage1" if ":" in spec else ":stage1")
        raise UserError(f"{NAME}:stage2: no stage-1 run in {d} (fix: run `jaxembed train --config "
                        f"{stage1} --workdir {d}` first, or set --config.stage1_dir to its workdir)")
    return str(d)


def _mined_file(d, name, names, stage1, spec):
    """A mined dataset's path, computed when read: ``mined_dir``/<name>.jsonl (jaxembed mine)."""
    missing = [n for n in names if not (Path(d) / f"{n}.jsonl").is_file()]
    if missing:
        tiny = ":tiny" in spec
        extra = " --top-k 100 --window 10:40" if tiny else ""
        raise UserError(f"{NAME}:stage2: the mined data {', '.join(f'{d}/{n}.jsonl' for n in missing)} is "
                        f"missing (fix: for NAME in {' '.join(missing)}: `jaxembed mine --model {stage1}/export "
                        f"--store {stage1}/store --dataset NAME{extra} --out {d}/NAME.jsonl`; or set "
                        "--config.mined_dir to their folder)")
    return str(Path(d) / f"{name}.jsonl")


def _lazy(section, key, fn, ref, *args):
    """section[key] = fn(ref value, *args), computed when read (see configs/datacube.py): --config.mined_dir /
    --config.stage1_dir move the paths, and a missing file is reported at validation."""
    section[key] = FieldReference("", field_type=str)
    section[key] = ref._apply_op(fn, *args)


def get_config(arg=None):
    variants, semi = _variants(arg)
    tiny = "tiny" in variants
    stage = 2 if "stage2" in variants else 1
    spec = NAME + (":tiny" if tiny else "")
    c = default_config()

    # ---- model (paper 3.1): Qwen2-0.5B, mean pooling, bf16, 512 tokens
    c.model.name = "Qwen/Qwen2-0.5B"
    c.model.pooling = "mean"                        # paper 3.1: mean pooling
    c.model.causal = True                           # paper: no change of the attention mask is described, so
    #                                                 Qwen2's own causal attention (also what PyTorch transformers
    #                                                 runs for the exported folder); --config.model.causal=false
    #                                                 trains it bidirectionally
    c.model.dtype = "bfloat16"                      # paper 3.1: mixed precision with bf16
    c.model.max_length = 512                        # paper 3.1: inputs capped at 512 tokens
    c.stage1_dir = "runs/kalm_tiny/stage1" if tiny else "runs/kalm/stage1"
    c.mined_dir = "runs/kalm_tiny/mined" if tiny else "runs/kalm/mined"

    # ---- data: the 14 shared sets with KaLM's instructions (Table 1: `Instruct: {task} \n Query: {query}` on
    # the queries of retrieval, reranking, classification and clustering; none for STS, pair classification, NLI)
    c.data = shared_train_config(paths.shared_data_dir())
    c.data.store = ""
    c.data.packing = True        # several texts per row, no compute on padding (data.packing)
    if tiny:
        c.data.datasets = [d for d in c.data.datasets if d.name in (TINY_STAGE2 if stage == 2 else TINY_STAGE1)]
    if "no_instructions" in variants:              # Table 3: w/o task instructions
        for d in c.data.datasets:
            d.query_instruction = ""
            d.doc_instruction = ""
    if stage == 1:
        for d in c.data.datasets:
            d.num_negatives = 0                     # paper 3.1: pre-training uses in-batch negatives only
    else:
        mined = TINY_MINED if tiny else MINED
        for d in c.data.datasets:
            d.num_negatives = min(int(d.num_negatives) if d.name not in mined else 7, 7)  # paper 3.1: 7 negatives
            #                                         (classification: as many other labels as there are, <= 7)
            if d.name in mined:                     # paper 2.2: ranking-consistency filtered, mined negatives
                d.format = "triplets"
                d.score_threshold = None
                _lazy(d, "path", _mined_file, c.get_ref("mined_dir"), d.name, mined, c.get_ref("stage1_dir"), spec)
        _lazy(c.model, "init_from", _stage1_run, c.get_ref("stage1_dir"), spec)  # start from stage 1's weights
    c.data.sampling = "temperature"                 # shared config: p ~ size^(1/2) within one pass of the data
    c.data.sampling_temperature = 2.0

    # ---- batching: semi-homogeneous task batches (paper 2.3, Fig. 3) built on one-dataset batches
    c.plan.strategy = "semi_homogeneous"
    c.plan.semi_homogeneous_proportion = 0.0 if semi is None else semi  # the final model: none (paper 2.3)
    c.plan.epochs = 1.0                             # paper 3.1: 1 epoch per stage
    c.plan.global_batch_size = 512 if stage == 1 else 48  # paper 3.1: 512 (pre-training), 48 (fine-tuning)

    # ---- loss (paper 3.1): InfoNCE, tau 0.01; Matryoshka in fine-tuning (paper 3.1: "MRL is applied during
    # fine-tuning"), dims and weights of paper 2.3
    c.loss.temperature = 0.01
    if stage == 2 and "no_mrl" not in variants:
        c.loss.matryoshka_dims = TINY_MRL_DIMS if tiny else MRL_DIMS
        c.loss.matryoshka_weights = MRL_WEIGHTS
    c.optim.lr = 1e-4                               # paper 3.1: 1e-4 in both stages
    c.optim.warmup_ratio = 0.1                      # not stated: jaxembed's default
    c.train.log_every = 10
    if "lora" in variants:                          # not in the paper: LoRA on Qwen2's attention + MLP projections
        c.model.lora.enabled = True
        c.model.lora.rank = 16
        c.model.lora.alpha = 32.0
        c.model.lora.dropout = 0.05                 # acts with train.dropout (on by default)
        c.model.lora.target = ""                    # q/k/v/o_proj, gate/up/down_proj (jaxembed.lora.default_target)
        c.model.lora.export = "both"                # export/: merged weights; export/adapter/: the PEFT folder
        c.optim.lr = 2e-4                           # adapters take a larger rate (LoRA paper, App. D: 2e-4 on GPT-2)

    # ---- evaluation: every local dev task (KaLM reports all MTEB task types)
    c.eval.tasks = ("STSBenchmark-dev", "SICK-R-dev", "MRPC-dev", "WikiQA-dev", "TrecQA-dev", "SST2-dev", "SST5-dev")
    c.eval.every = 500 if stage == 2 else 0         # stage 1 (~240 steps): at the end
    c.eval.max_examples = 500

    if tiny:                                        # CPU / CI: the real data, a tiny random Qwen2
        from jaxembed.models.tiny import tiny_model_dir

        c.model.name = str(tiny_model_dir("qwen2", num_layers=1, pooling="mean", max_length=64))  # stage 2: init_from
        c.model.dtype = "float32"
        c.model.max_length = 64
        for d in c.data.datasets:
            d.max_query_length = 32
            d.max_doc_length = 32
            if stage == 2:
                d.num_negatives = 5                 # trec's 5 other labels; one candidate count for every dataset:
                #                                     the trainer sizes K by the store, the loader by the plan
        c.plan.global_batch_size = 8
        c.plan.steps = len(c.data.datasets)         # a batch of every dataset: 3 steps (stage 1), 2 (stage 2)
        c.data.sampling = "weights"                 # every dataset equally likely, and a seed whose draws take
        c.plan.seed = 2                             # every one, in both stages (tests/test_recipes.py)
        c.optim.lr = 1e-3                           # a random model: a visible step
        c.train.dropout = False
        if "lora" in variants:
            c.model.lora.rank = 4
            c.model.lora.dropout = 0.0              # no dropout in the tiny runs (train.dropout is off)
        c.train.log_every = 1
        c.train.checkpoint_every = 0
        c.eval.tasks = ()
        c.eval.every = 0
    return c


def get_hyper(arg=None):
    """Fig. 4b: the semi-homogeneous proportion (0 = the final KaLM model)."""
    return [{"plan.semi_homogeneous_proportion": p} for p in (0.0, 0.1, 0.25, 0.5)]
