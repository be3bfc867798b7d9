"""Data-CUBE: task-level and instance-level curriculum for multi-task contrastive training (Min et al. 2024,
arXiv:2401.03563; docs/design.md, Data-CUBE). Backbone: INSTRUCTOR-large (T5 encoder, mean pooling over the text
without its instruction, INSTRUCTOR-style instructions on both sides).

Two offline jobs write the curriculum into ``curriculum_dir`` (default runs/datacube/curriculum), then train:

    jaxembed score --config datacube --out runs/datacube/curriculum        # Eq. 4-5 and Eq. 8 (INSTRUCTOR)
    jaxembed curriculum --scores-dir runs/datacube/curriculum --out runs/datacube/curriculum   # Eq. 6-7 (SA)
    jaxembed train --config datacube --workdir runs/datacube

    # the task orders of the Table 6 ablations (same scores, other objectives):
    jaxembed curriculum --scores-dir runs/datacube/curriculum --out runs/datacube/curriculum/min --objective min
    jaxembed curriculum --scores-dir runs/datacube/curriculum --out runs/datacube/curriculum/random --objective random

``jaxembed score`` writes scores.npz (phi of every example, Eq. 8) and task_similarity.npz (Eq. 4-5);
``jaxembed curriculum`` writes task_order.json (the SA solution of Eq. 6-7). The plan builds the instance order
itself from scores.npz (E2D = phi descending; D2E; random), so the Table 7 variants need no other file. A run
whose files are missing stops at validation with the two commands to run.

Variants (combine with commas, e.g. ``datacube:tiny,mqmin``):
- ``tiny``: 17 steps of 8 queries on CPU, a tiny random T5 encoder (jaxembed.models.tiny: 1 layer, 32 wide), real
  shared data of four tasks (trecqa, sick_nli, stsb, mrpc: four curriculum units, so that task orders score
  differently in Eq. 6); 17 steps are less than a pass, and the compressed curriculum gives each dataset its share
  of them by size: 1, 1, 1 and 14 batches (78, 81, 199 and 2,014 examples); curriculum in
  runs/datacube_tiny/curriculum (the same two commands with ``:tiny``).
- ``mqmin``: Table 6 MQMin, the task order that minimises Eq. 6 (``curriculum_dir``/min/task_order.json).
- ``mqrand`` = ``no_task_curriculum``: Table 6 MQRand = Table 3 "w/o Task" (the paper reports the same numbers
  for both: instances E2D, task order shuffled): ``curriculum_dir``/random/task_order.json.
- ``no_instance_curriculum``: Table 3 "w/o Inst" = Table 7 Random: the SA task order, instances shuffled.
- ``d2e``: Table 7 D2E, instances difficult to easy.
- ``random``: Table 3 "Vanilla", no curriculum at all: the same data and one-unit batches (one dataset per batch;
  one task per batch with ``task_unit``; as INSTRUCTOR trains), in random order. Mixed-task batches instead:
  --config.plan.strategy=random.
- ``task_unit``: the curriculum orders the data config's tasks (datasets sharing an instruction pooled) instead of
  single datasets; its files live in ``curriculum_dir`` + ``_task`` (``jaxembed score`` reads the unit from this
  config).
- ``balanced``: jaxembed's balanced walk (``plan.curriculum.walk='balanced'``, not the paper's): the same cycles over
  the task order as Algorithm 1, but each unit is visited in proportion to its size, so that all units end together
  instead of the largest one owning the end of training (``jaxembed.data.plan.walk_order``).
- ``mask``: the Eq. 9 instance mask, alpha = 0 where phi < delta (the paper's text; delta 0.0: the reference
  model ranks the negative above the positive); --config.plan.mask.delta=X changes delta,
  --config.plan.mask.direction=printed takes Eq. 9 as printed.

``get_hyper`` below is the ablation sweep of Tables 3, 6 and 7 plus the balanced walk (``jaxembed sweep --config
datacube --root runs/datacube_ablations``; needs all three task orders).

Our data is not the paper's: the shared training data has 14 datasets, 11 tasks and 6 task types (124k examples),
where MEDI has 330 tasks and 1.4M instances. A curriculum unit is a dataset, as the paper's task is a MEDI dataset
(330 tasks = 330 datasets, each with its instruction); ``task_unit`` pools the datasets of a task (e.g. sst2 + mr).
SST-2 alone is 54 % of the data: Algorithm 1's walk then ends with a long run of SST-2 batches, which the
``balanced`` walk spreads over the whole run.
"""

from pathlib import Path

from ml_collections import FieldReference

from jaxembed import paths
from jaxembed.config import default_config
from jaxembed.config.io import recipe_spec
from jaxembed.data.shared_train import shared_train_config
from jaxembed.errors import UserError

NAME = recipe_spec(__file__)  # 'datacube' (a copy of this file: its path), for the messages and the commands they print
VARIANTS = ("tiny", "mqmin", "mqrand", "no_task_curriculum", "no_instance_curriculum", "d2e", "random", "mask",
            "task_unit", "balanced")
OBJECTIVES = ("max", "min", "random")  # jaxembed curriculum --objective; 'max' is Data-CUBE (MQMax)
TINY_DATASETS = ("stsb", "sick_nli", "trecqa", "mrpc")

# INSTRUCTOR-style instructions ("Represent the {domain} {text type} for {objective}: ", Su et al. 2023, which
# Data-CUBE fine-tunes; MEDI gives every task its instruction): dataset -> (query, document).
_SENTIMENT_DOC = "Represent the sentiment description for retrieval: "
INSTRUCTIONS = {
    "snli": ("Represent the premise sentence for retrieving the hypotheses it entails: ",
             "Represent the hypothesis sentence for retrieval: "),
    "sick_nli": ("Represent the premise sentence for retrieving the hypotheses it entails: ",
                 "Represent the hypothesis sentence for retrieval: "),
    "sick_sts": ("Represent the sentence for retrieving semantically similar sentences: ",) * 2,
    "stsb": ("Represent the sentence for retrieving semantically similar sentences: ",) * 2,
    "mrpc": ("Represent the news sentence for retrieving its paraphrases: ",) * 2,
    "wikiqa": ("Represent the Wikipedia question for retrieving supporting sentences: ",
               "Represent the Wikipedia sentence for retrieval: "),
    "trecqa": ("Represent the news question for retrieving answer sentences: ",
               "Represent the news sentence for retrieval: "),
    "trec": ("Represent the question for classifying it by the type of its answer: ",
             "Represent the question type description for retrieval: "),
    "sst2": ("Represent the movie review for classifying its sentiment: ", _SENTIMENT_DOC),
    "mr": ("Represent the movie review for classifying its sentiment: ", _SENTIMENT_DOC),
    "sst5": ("Represent the movie review for classifying its sentiment on a five-point scale: ", _SENTIMENT_DOC),
    "cr": ("Represent the product review for classifying its sentiment: ", _SENTIMENT_DOC),
    "mpqa": ("Represent the opinion phrase for classifying its polarity: ",
             "Represent the polarity description for retrieval: "),
    "subj": ("Represent the movie text for classifying it as subjective or objective: ",
             "Represent the subjectivity description for retrieval: "),
}


def _variants(arg):
    variants = [v.strip() for v in (arg or "").split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise UserError(f"{NAME}: unknown variant(s) {', '.join(map(repr, unknown))} (variants: "
                        f"{', '.join(VARIANTS)}; combine with commas, e.g. {NAME}:tiny,mqmin)")
    orders = [v for v in variants if v in ("mqmin", "mqrand", "no_task_curriculum")]
    if "mqmin" in orders and len(orders) > 1:
        raise UserError(f"{NAME}: variants {', '.join(orders)} choose different task orders; pick one")
    if "d2e" in variants and "no_instance_curriculum" in variants:
        raise UserError(f"{NAME}: variants d2e and no_instance_curriculum choose different instance orders; pick "
                        "one")
    if "random" in variants and set(variants) & {"mqmin", "mqrand", "no_task_curriculum", "no_instance_curriculum",
                                                 "d2e", "balanced"}:
        raise UserError(f"{NAME}: variant 'random' has no curriculum; it does not combine with a task-order, "
                        "instance-order or walk variant")
    return variants


def _files(d, objective, enabled, instance_order, mask):
    """(task order, scores) the run reads: ``curriculum_dir``[/objective]/task_order.json when the curriculum is on,
    ``curriculum_dir``/scores.npz where the plan needs phi (E2D / D2E, or the Eq. 9 mask); None when not read."""
    if objective not in OBJECTIVES:
        raise UserError(f"config.task_order_objective = {objective!r} is not valid: allowed: {', '.join(OBJECTIVES)}")
    order = Path(d) / ("" if objective == "max" else objective) / "task_order.json"
    scores = Path(d) / "scores.npz"
    return (order if enabled else None,
            scores if mask or (enabled and instance_order in ("e2d", "d2e")) else None)


def _check(d, objective, enabled, instance_order, mask, spec):
    """UserError naming the missing curriculum files and the two commands that write them."""
    order, scores = _files(d, objective, enabled, instance_order, mask)
    missing = [str(p) for p in (order, scores) if p is not None and not p.is_file()]
    if missing:
        out = d if objective == "max" else f"{d}/{objective}"
        cmds = f"`jaxembed score --config {spec} --out {d}`"
        if order is not None:
            cmds += (f" then `jaxembed curriculum --scores-dir {d} --out {out}"
                     + ("" if objective == "max" else f" --objective {objective}") + "`")
        raise UserError(f"{NAME}: the curriculum file(s) {', '.join(missing)} are missing (fix: run "
                        f"{cmds}, or set --config.curriculum_dir to the folder that holds them)")


def _task_order_file(d, objective, enabled, instance_order, mask, spec):
    """plan.curriculum.task_order, computed when read."""
    _check(d, objective, enabled, instance_order, mask, spec)
    return str(_files(d, objective, True, instance_order, mask)[0])


def _scores_file(d, objective, enabled, instance_order, mask, spec):
    """plan.scores, computed when read; '' where phi is not needed (the plan loads any scores file it is given)."""
    _check(d, objective, enabled, instance_order, mask, spec)
    scores = _files(d, objective, enabled, instance_order, mask)[1]
    return "" if scores is None else str(scores)


def _lazy(section, key, fn, ref, *args):
    """section[key] = fn(ref value, *args), computed each time the field is read (an ml_collections
    FieldReference op): --config.curriculum_dir moves every derived path, and a missing file is reported when the
    run is validated, not when this file is loaded (jaxembed score loads it before the files exist)."""
    section[key] = FieldReference("", field_type=str)
    section[key] = ref._apply_op(fn, *args)


def get_config(arg=None):
    variants = _variants(arg)
    tiny = "tiny" in variants
    c = default_config()

    # ---- model: INSTRUCTOR-large (paper App. B: "we start training from the checkpoint of INSTRUCTOR-large (335M)")
    c.model.name = "hkunlp/instructor-large"        # T5-large encoder; its folder sets mean pooling over the text
    c.model.pooling = "mean"                        # INSTRUCTOR: mean pooling, instruction tokens excluded (folder)
    c.model.max_length = 512                        # INSTRUCTOR's max_seq_length (the paper states none)
    c.model.dtype = "bfloat16"                      # jaxembed: mixed precision on accelerators (paper: not stated)

    # ---- data: the 14 shared training sets (jaxembed.data.shared_train.shared_train_config), INSTRUCTOR instructions
    c.data = shared_train_config(paths.shared_data_dir())
    c.data.store = ""
    c.data.packing = True        # several texts per row, no compute on padding (data.packing)
    for d in c.data.datasets:
        d.query_instruction, d.doc_instruction = INSTRUCTIONS[d.name]  # INSTRUCTOR / MEDI: both sides instructed
        d.num_negatives = min(int(d.num_negatives), 1)  # MEDI: (query, positive, one negative); Eq. 8 uses one
        d.temperature = None                        # paper App. B: one tau for every task (loss.temperature)
    c.data.sampling = "size"                        # the curriculum takes every example once (1 epoch each);
    #                                                 'random' (Vanilla) then sees the same data
    c.plan.global_batch_size = 64                   # paper App. B: batch size 64
    c.plan.epochs = 1.0                             # one pass over the data (paper: MEDI once)
    c.loss.temperature = 0.01                       # paper App. B: softmax temperature 0.01
    c.optim.lr = 2e-5                               # paper App. B: AdamW, lr 2e-5
    c.optim.warmup_ratio = 0.1                      # paper App. B: warm-up ratio 0.1
    c.optim.schedule = "linear"                     # not stated; INSTRUCTOR's (HF Trainer) linear decay

    # ---- curriculum (paper 4.2-4.3, Algorithm 1 lines 18-25): files from `jaxembed score` + `jaxembed curriculum`
    task_unit = "task_unit" in variants
    c.curriculum_dir = ("runs/datacube_tiny/curriculum" if tiny else "runs/datacube/curriculum") + (
        "_task" if task_unit else "")                # the task order is over the units: one folder per unit
    c.task_order_objective = "max"                  # Table 6: MQMax (ours); 'min' = MQMin, 'random' = MQRand
    if "mqmin" in variants:
        c.task_order_objective = "min"
    if "mqrand" in variants or "no_task_curriculum" in variants:
        c.task_order_objective = "random"           # Table 3 w/o Task = Table 6 MQRand (identical rows)
    cur = c.plan.curriculum
    cur.enabled = "random" not in variants          # Table 3 Vanilla: no curriculum
    cur.unit = "task" if task_unit else "dataset"   # paper: a MEDI task = one dataset with its instruction
    cur.walk = "balanced" if "balanced" in variants else "cyclic"  # Algorithm 1 lines 18-25: cyclic
    cur.instance_order = "e2d"                      # paper 4.3.2: phi descending = easy to difficult (Table 7 E2D)
    if "d2e" in variants:
        cur.instance_order = "d2e"                  # Table 7 D2E
    if "no_instance_curriculum" in variants:
        cur.instance_order = "random"               # Table 7 Random = Table 3 w/o Inst (shuffled with the plan
        #                                             seed; the paper used seed 42)
    if "random" in variants:                        # Vanilla: one unit per batch, as the curriculum's, in random
        c.plan.strategy = "heterogeneous" if task_unit else "homogeneous"  # order
    mask = "mask" in variants
    if mask:
        c.plan.mask.delta = 0.0                     # Eq. 9 (paper: delta not given); alpha = 0 where phi < 0
        c.plan.mask.direction = "text"              # the text's reading of Eq. 9 (docs/design.md, Data-CUBE)
    # the data (and the unit) the two offline jobs must see
    spec = NAME + (":" + ",".join(v for v in ("tiny", "task_unit") if v in variants) if tiny or task_unit else "")
    d_ref = c.get_ref("curriculum_dir")
    args = (c.get_ref("task_order_objective"), cur.get_ref("enabled"), cur.get_ref("instance_order"), mask, spec)
    _lazy(cur, "task_order", _task_order_file, d_ref, *args)
    _lazy(c.plan, "scores", _scores_file, d_ref, *args)

    # ---- evaluation: Data-CUBE reports STS first (Tables 1, 3-7); the dev sets of every local task type
    c.eval.tasks = ("STSBenchmark-dev", "SICK-R-dev", "MRPC-dev", "WikiQA-dev", "TrecQA-dev", "SST2-dev")
    c.eval.every = 500
    c.eval.max_examples = 500                       # jaxembed: the trainer's cheap dev signal
    c.eval.best_metric = "STSBenchmark-dev/main_score"
    c.train.log_every = 20
    c.train.checkpoint_every = 500

    if tiny:                                        # CPU / CI: the real data, a tiny random T5 encoder
        from jaxembed.models.tiny import tiny_model_dir

        c.model.name = str(tiny_model_dir("t5", num_layers=1, pooling="mean", include_prompt=False, max_length=64))
        c.model.max_length = 64
        c.model.dtype = "float32"
        c.data.datasets = [d for d in c.data.datasets if d.name in TINY_DATASETS]
        for d in c.data.datasets:
            d.max_query_length = 32                 # the instructions take ~12 of these tokens
            d.max_doc_length = 32
        c.plan.global_batch_size = 8
        c.plan.steps = 17                           # less than a pass: each unit's share by size, one batch for the
        #                                             smallest (trecqa 78, sick_nli 81, stsb 199 and mrpc 2,014
        #                                             examples: 1, 1, 1, 14 batches)
        c.data.sampling = "weights"                 # `random` (Vanilla, drawn batches): every unit equally likely,
        c.plan.seed = 2                             # and a seed whose draws take all four (tests/test_recipes.py)
        c.optim.lr = 1e-3                           # a random model: a visible step
        c.train.dropout = False
        c.train.log_every = 1
        c.train.checkpoint_every = 0
        c.eval.tasks = ()
        c.eval.every = 0
        c.eval.best_metric = ""
    return c


def get_hyper(arg=None):
    """The curriculum ablations as one sweep: Data-CUBE, Table 6 (MQMin, MQRand = Table 3 w/o Task), Table 7 (D2E,
    Random = Table 3 w/o Inst), the balanced walk (jaxembed) and Table 3 Vanilla (no curriculum, one unit per batch).
    Needs the three task orders (module docstring)."""
    vanilla = "heterogeneous" if "task_unit" in _variants(arg) else "homogeneous"
    run = lambda objective, order, enabled=True, strategy=None, walk="cyclic": {
        "task_order_objective": objective, "plan.curriculum.instance_order": order,
        "plan.curriculum.enabled": enabled, "plan.strategy": strategy, "plan.curriculum.walk": walk}
    return [run("max", "e2d"), run("min", "e2d"), run("random", "e2d"), run("max", "d2e"), run("max", "random"),
            run("max", "e2d", walk="balanced"), run("max", "e2d", False, vanilla)]
