"""The steps of benchmarks/scale.py, each run as ``python -c STEP ARGS...`` in a fresh process (its own wall time,
CPU time and peak RSS; ``--rev``: the code of another revision first on PYTHONPATH). Each prints one JSON line.

- ``PREPARE data store``: ``write_store`` of a triplet file (one process);
- ``PLAN store plan batch epochs``: the plan (epoch mode) as the trainer builds it (``build_plan_file``: in blocks,
  into the file; before it ``build_plan`` and ``Plan.save``);
- ``FIRST_STEP store plan tokenizer cache host hosts batches chunk``: the data side of ``jaxembed train`` up to
  its first step, as one host of a pod (``hosts`` > 1: joined by ``jaxembed.parallel.initialize`` from the
  JAXEMBED_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID variables, as the trainer joins one), then ``batches``
  more batches; ``chunk`` > 0: the gradient cache's queries per sub-batch, and every batch's packs are checked
  against the sub-batches the step splits them into (``sub_batches``, as ``jaxembed.train.encode`` calls it);
- ``SHAPES store plan tokenizer shards``: every window's packed shapes against one choice over the whole plan.
"""

PREPARE = r"""
import json, resource, sys, time
from jaxembed.data import config as dc
from jaxembed.data.store import write_store
data, out = sys.argv[1], sys.argv[2]
cfg = dc.default_data_config()
cfg.datasets = [dc.dataset_config(name="big", path=data, format="triplets", task_type="retrieval",
                                  num_negatives=1)]
t0 = time.time()
rep = write_store(cfg, out, progress=False)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.time() - t0, "written": rep.written, "cpu_s": ru.ru_utime + ru.ru_stime,
                  "maxrss_kib": ru.ru_maxrss}))
"""

PLAN = r"""
import json, os, resource, sys, time
t0 = time.time()
from jaxembed.data.store import Store
from jaxembed.data import plan as P
store, out, batch, epochs = Store.open(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
config = {"global_batch_size": batch, "epochs": epochs, "seed": 0}
if hasattr(P, "build_plan_file"):  # as the trainer builds it (prepare_plan): in blocks, into the file
    plan, how = P.build_plan_file(out, store, config), "build_plan_file"
else:
    plan, how = P.build_plan(store, config), "build_plan"
    plan.save(out)
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": time.time() - t0, "steps": plan.steps, "built_by": how,
                  "cpu_s": ru.ru_utime + ru.ru_stime, "bytes": os.path.getsize(out), "maxrss_kib": ru.ru_maxrss}))
"""

# what the trainer does on the data side before its first step, then a few more batches
FIRST_STEP = r"""
import inspect, json, os, resource, sys, time
t0 = time.time()
store_dir, plan_path, tok_dir, cache = sys.argv[1:5]
host, hosts, more, chunk = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8])
if hosts > 1:  # one process of a pod, joined the trainer's way (jax.distributed)
    from jaxembed import parallel
    parallel.initialize()
    import jax
    if (jax.process_index(), jax.process_count()) != (host, hosts):
        raise SystemExit(f"joined as process {jax.process_index()} of {jax.process_count()}, not {host} of {hosts}")
t_join = time.time() - t0
import numpy as np
from jaxembed.data.store import Store
from jaxembed.data.plan import Plan
from jaxembed.data import pipeline as P
from jaxembed.tokenizer import Tokenizer
t_import = time.time() - t0
store, plan, tok = Store.open(store_dir), Plan.load(plan_path), Tokenizer.from_folder(tok_dir)
K = 1 + max(int(d.num_negatives) for d in store.datasets)
t_open = time.time() - t0


def takes(fn, name):
    return name in inspect.signature(fn).parameters


if chunk and not takes(P.packing_for, "gradcache_chunk"):
    raise SystemExit("this revision's packing_for has no gradient cache (gradcache_chunk)")
extra = {k: v for k, v in (("gradcache_chunk", chunk), ("num_candidates", K)) if takes(P.packing_for, k)}
packing = P.packing_for(store, plan, tok, shards=hosts, **extra)
if hasattr(P, "StepTable"):  # the loader computes the table in windows of steps as it goes
    if takes(P.StepTable, "write"):  # as jaxembed.train.state.step_table: process 0 writes the cache file
        table = P.StepTable(store, plan, tok, packing=packing, num_candidates=K, cache=cache, write=host == 0)
    else:
        table = P.StepTable(store, plan, tok, packing=packing, cache=cache if host == 0 else None)
    loader = P.make_loader(store, plan, tok, process_index=host, process_count=hosts, packing=packing,
                           step_table=table)
    first_window = table.window_steps
else:  # the whole plan's table before the first step (process 0 writes it, the others read it)
    if host == 0:
        table = P.cached_step_table(store, plan, tok, cache, packing=packing)
    else:
        while not os.path.exists(cache):
            time.sleep(0.5)
        time.sleep(1.0)
        table = P.cached_step_table(store, plan, tok, cache, packing=packing)
    loader = P.make_loader(store, plan, tok, process_index=host, process_count=hosts, packing=packing,
                           pack_table=table)
    first_window = plan.steps
t_table = time.time() - t0
local_shards = max(1, packing.shards // hosts)


def chunks(x):
    # each pack's rows of this host: [local shards x rows, L]; the step splits a shard's rows into sub-batches
    out = {}
    for i, name in enumerate(packing.packs):
        rows, L = x[f"{name}_input_ids"].shape
        n = P.sub_batches(rows // local_shards, L, packing.sub_tokens[i]) if chunk else 1
        real = int(np.count_nonzero(x[f"{name}_segment_ids"]))
        out[name] = {"rows": int(rows), "row_length": int(L), "sub_batches": int(n), "real_tokens": real}
    return out


b = loader.batch(0)
t_first = time.time() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
rss_first, cpu_first = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
packs = [chunks(b)]
n = min(more, plan.steps - 1)
t1, c1 = time.time(), time.process_time()
texts = tokens = 0
for s in range(1, 1 + n):
    x = loader.batch(s)
    packs.append(chunks(x))
    texts += len(x["query_prompt_length"]) + len(x["doc_prompt_length"])
    tokens += sum(p["real_tokens"] for p in packs[-1].values())
dt, dc = time.time() - t1, time.process_time() - c1
shapes = loader.shapes.get("packed_shapes", [])
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"join_s": t_join, "import_s": t_import, "open_s": t_open, "table_s": t_table,
                  "first_batch_s": t_first, "cpu_s_first": cpu_first, "maxrss_kib_first": rss_first,
                  "steps": plan.steps, "table_steps_before_first": first_window, "shards": packing.shards,
                  "sub_tokens": list(packing.sub_tokens), "packs": packs,
                  "later_batches": n, "later_s": dt, "later_cpu_s": dc,
                  "texts": texts, "real_tokens": tokens, "texts_per_s": texts / dt if dt > 0 else None,
                  "texts_per_cpu_s": texts / dc if dc > 0 else None, "packed_shapes_seen": len(shapes),
                  "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kib": ru.ru_maxrss}))
"""

# every window's shapes of a plan against the whole plan's choice (the compilations a run makes)
SHAPES = r"""
import json, sys, time
import numpy as np
from jaxembed.data.store import Store
from jaxembed.data.plan import Plan
from jaxembed.data import pipeline as P
from jaxembed.tokenizer import Tokenizer
store, plan, tok = Store.open(sys.argv[1]), Plan.load(sys.argv[2]), Tokenizer.from_folder(sys.argv[3])
packing = P.packing_for(store, plan, tok, shards=int(sys.argv[4]))
t0 = time.time()
table = P.StepTable(store, plan, tok, packing=packing)
windowed = [table.shape(s) for s in range(plan.steps)]
keys = ("row_length", *(f"{n}_rows" for n in packing.packs), "query_len", "doc_len")
whole_table = {k: np.concatenate([table.window(w)[k] for w in range(table.windows)]) for k in keys}
whole = P.StepTable.of_arrays(plan, whole_table, table.tables, packing)
once = [whole.shape(s) for s in range(plan.steps)]
slots = lambda shapes: sum(sum(x[:-1]) * x[-1] for x in shapes)
print(json.dumps({"steps": plan.steps, "windows": table.windows, "window_steps": table.window_steps,
                  "shards": packing.shards, "shapes_windowed": sorted(set(windowed)),
                  "shapes_whole_plan": sorted(set(once)),
                  "slots_windowed_over_whole_plan": slots(windowed) / slots(once),
                  "seconds": time.time() - t0}))
"""
