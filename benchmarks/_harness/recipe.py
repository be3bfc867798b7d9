"""The run configs of the benchmarks and the texts their plans give: a recipe file (configs/demo.py by default), the
natural-length setting (shared snli_triplets or the demo's 14-dataset mix, every text <= N tokens) and its store,
and the loader's choice of texts for each plan step (so that sentence-transformers trains on exactly the strings
jaxembed's loader builds: the instruction + query, the chosen positive and negatives)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPERATURE = 0.05  # InfoNCE temperature of every setting here; sentence-transformers' MNRL scale 20
NATURAL_DATA = ("snli", "demo")


def load_recipe(spec: str = "configs/demo.py"):
    """A config file[:variant], relative to the repository root unless absolute -> its config."""
    from jaxembed import config as cfglib

    path, _, variant = spec.partition(":")
    if not Path(path).is_absolute():
        path = str(ROOT / path)
    return cfglib.load_config_file(f"{path}:{variant}" if variant else path)


def no_eval(c) -> None:
    """No evaluation during or before training (a benchmark evaluates, or times, on its own)."""
    c.eval.tasks, c.eval.every, c.eval.best_metric, c.eval.before = (), 0, "", False


# ------------------------------------------------------------------------------------------------ plan texts


def loader_tables(store, plan, tok, num_candidates: int | None = None):
    """The loader's per-dataset tables (instructions, lengths, candidates per query ``K``: ``num_candidates``, or
    the datasets' own) of the plan's datasets."""
    import numpy as np

    from jaxembed.data.pipeline import StepTables

    return StepTables(store.datasets, tok, np.unique(plan.dataset_ids).tolist(), num_candidates)


def step_items(tables, store, plan, s: int):
    """The loader's items of plan step ``s``: (query items, document items (row r's slot j at r * K + j, None for an
    empty slot), _, the documents' raw texts), exactly as jaxembed's loader chooses them."""
    import numpy as np

    from jaxembed.data.pipeline import fetch_examples, row_items

    ds, ex = plan.dataset_ids[s], plan.example_ids[s]
    return row_items(tables, fetch_examples(store, ds, ex), ds, np.arange(plan.global_batch_size), s, plan.seed,
                      plan.config.get("negatives", "first"))


# ------------------------------------------------------------------------------------------------ natural lengths


def natural_config(data: str, folder: str, B: int, max_len: int, plan_steps: int, packing: bool, store: str = ""):
    """The trainer's config for the natural-length setting: ``snli`` (shared snli_triplets: premise -> entailment,
    contradiction as the hard negative) or ``demo`` (configs/demo.py's 14 datasets, their instructions, sampling
    and one hard negative); every text at most ``max_len`` tokens, ``B`` queries, AdamW (the defaults: weight decay
    0.01, clip 1.0), temperature 0.05, dropout on, float32; data.packing as given (``jaxembed train``'s default is
    True)."""
    from jaxembed import paths
    from jaxembed.config import default_config
    from jaxembed.data.config import dataset_config

    if data == "demo":
        c = load_recipe("configs/demo.py")
        for d in c.data.datasets:
            d.max_query_length = d.max_doc_length = max_len
    elif data == "snli":
        c = default_config()
        c.data.datasets = [dataset_config(name="snli", path=str(paths.shared_data_dir() / "train" /
                                                                "snli_triplets.jsonl"),
                                          task_type="nli", num_negatives=1, max_query_length=max_len,
                                          max_doc_length=max_len)]
    else:
        raise SystemExit(f"error: --natural-data {data!r}: unknown (known: {', '.join(NATURAL_DATA)})")
    c.model.name = str(folder)
    c.model.max_length = max_len
    c.data.store = store
    c.data.packing = bool(packing)
    c.plan.global_batch_size = B
    c.plan.steps = plan_steps
    c.loss.temperature = TEMPERATURE
    c.train.dropout = True
    no_eval(c)
    c.export.at_end = False
    return c


def natural_store(data: str, max_len: int, cache: Path) -> Path:
    """The dataset store of the setting (written once under --cache; every tool reads the same rows from it)."""
    from jaxembed import config as cfglib
    from jaxembed.data.store import write_store

    out = cache / f"store_{data}_{max_len}"
    if not (out / "manifest.json").exists():
        write_store(cfglib.data_section(natural_config(data, "unused", 8, max_len, 1, True)), out)
    return out


#: which steps of the plan the natural-length setting runs: the first ones, or spread evenly over the plan (a
#: run's average: the steps' lengths, and so their padding and packed shapes, vary along the plan)
NATURAL_PICKS = ("first", "spread")


def natural_steps(plan_steps: int, steps: int, pick: str = "first") -> list[int]:
    """The plan's step numbers of the setting: ``first`` 0 .. steps-1; ``spread`` steps evenly spaced over the
    plan (i x plan_steps // steps)."""
    if pick not in NATURAL_PICKS:
        raise SystemExit(f"error: --natural-pick {pick!r}: unknown (known: {', '.join(NATURAL_PICKS)})")
    if pick == "first":
        return list(range(steps))
    return [i * plan_steps // steps for i in range(steps)]


def natural_texts(c, steps: list[int]) -> list[dict]:
    """The texts of the plan's ``steps`` (step numbers), as the loader builds them (instruction + text, the chosen
    positive and negatives): per step {"anchor": [...], "positive": [...], "negative_1": [...], ...}; an empty
    negative slot is the empty text (jaxembed encodes the empty text there too)."""
    from jaxembed import config as cfglib
    from jaxembed.data.plan import build_plan
    from jaxembed.data.store import Store
    from jaxembed.tokenizer import Tokenizer

    store = Store.open(c.data.store)
    plan = build_plan(store, c.plan, data_config=cfglib.data_section(c))
    tok = Tokenizer.from_folder(c.model.name, c.model.max_length)
    tables = loader_tables(store, plan, tok)
    G, K_ = plan.global_batch_size, tables.K
    out = []
    for s in steps:
        q, d, _, _ = step_items(tables, store, plan, s)
        cols = {"anchor": [t for t, _ in q]}
        for j in range(K_):
            cols["positive" if j == 0 else f"negative_{j}"] = [d[r * K_ + j][0] if d[r * K_ + j] is not None else ""
                                                              for r in range(G)]
        out.append(cols)
    return out
