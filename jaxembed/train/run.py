"""A run set up from its config (the first half of the trainer): ``setup`` validates the config, joins the
processes of a pod, checks the run directory and writes its config, loads the model (``init_source``: the model,
or ``model.init_from``, a previous stage; MoTE up-cycling; LoRA adapters), prepares the dataset store and the
batch plan, and builds the optimizer: a ``Run``. ``params_at`` gives the parameters of any step (the initial
state's placement and the loader's length table are jaxembed.train.state).

``export_from_workdir`` (``jaxembed export``) sets a run directory up again and exports one of its steps
(``resolve_step``: a checkpoint, 0, best, latest) through jaxembed.train.export. It is here because
``init_source`` exports a previous stage through it: setting a run up may set another one up, one recursion kept
in one module so that the imports go one way (run -> export).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from jaxembed import config as cfglib
from jaxembed import loading, lora, parallel, pod
from jaxembed.runs import atomic_files
from jaxembed.runs import optim
from jaxembed.train import encode as train_encode, saved_plan
from jaxembed.runs.checkpoints import Checkpointer
from jaxembed.errors import UserError
from jaxembed.train.export import export_params, host_model, host_params, run_card, task_prompts
from jaxembed.train.start import count, describe_model, describe_plan, describe_store, say
from jaxembed.train.state import init_state, shardings
from jaxembed.runs.rundir import RunDir, rundir
from jaxembed.runs.workdir_lock import WorkdirLock

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Run:
    config: Any
    workdir: Path
    mesh: Any
    loaded: loading.Loaded
    store: Any
    plan: Any
    graphdef: Any
    rest: Any
    tx: Any
    schedule: Callable
    K: int
    routes: tuple[np.ndarray, np.ndarray] | None = None  # MoTE: expert of each plan task's queries / documents [T]
    packing: Any = None  # jaxembed.data.pipeline.Packing of the run's batches (data.packing), None = padded
    lora: Any = None  # jaxembed.lora.LoRASpec (model.lora): params = the adapters, rest = the frozen base; None = off
    lora_base: str = ""  # LoRA: the base model (folder or hub id) the adapters apply to (the PEFT export's base)
    rundir: RunDir | None = None  # the layout of workdir (jaxembed.runs.rundir); None: derived from workdir

    def __post_init__(self):
        if self.rundir is None and self.workdir is not None:  # no workdir: a run that is only compiled (memory)
            self.rundir = RunDir(self.workdir)

    @property
    def task_names(self) -> list[str]:
        return list(self.plan.task_names) if hasattr(self.plan, "task_names") else []


def check_workdir(config, workdir: Path | RunDir) -> bool:
    """Refuse a resume with another config (naming each differing key); True when the config only grows
    plan.steps (the run is trained on: its plan is built again for the new total)."""
    from jaxembed.config import io as config_io

    rd = rundir(workdir)
    prev = rd.config_json
    if not prev.exists():
        return False
    # the old config through today's defaults: a key added to jaxembed since that run takes its default, so adding a
    # config key does not make earlier runs unresumable
    old = json.loads(cfglib.to_json(cfglib.from_json(json.dumps(_read_config_json(prev)))))
    new = json.loads(cfglib.to_json(config))
    keys = ("model", "data", "plan", "loss", "optim", "train.seed", "train.gradcache_chunk", "train.dropout")
    diffs = config_io.config_differences(old, new, keys)
    if diffs and not config_io.extends_steps(diffs):
        raise UserError(config_io.changed_config_message(rd.root, diffs))
    return bool(diffs)


def _read_config_json(path: Path) -> dict:
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a valid config ({e}); the run directory's config is damaged (fix: restore "
                        "it from config.txt by hand, or use a new --workdir)") from None
    if not isinstance(old, dict):
        raise UserError(f"{path}: not a config object (fix: use a new --workdir)")
    return old


def _same_config_as_main(config, main_config: str) -> None:
    """On processes other than 0: process 0's config (its JSON) must be this process's own (all hosts of a pod run
    the same --config and overrides)."""
    if pod.is_main():
        return
    from jaxembed.config import io as config_io

    written = json.loads(main_config)
    mine = json.loads(cfglib.to_json(config))
    diffs = config_io.config_differences(written, mine, tuple(sorted(set(written) | set(mine))))
    if diffs:
        raise UserError(f"process {pod.process_index()} has another config than process 0: "
                        f"{config_io.describe_differences(diffs)} (process 0's value -> this process's) (fix: start "
                        "every process with the same --config and --config.KEY=VALUE overrides)")


def prepare_store(config, rd: RunDir):
    """The dataset store: ``data.store``, or ``<workdir>/store``, written once: process 0 decides whether it is
    needed; then every process of a pod writes its share of the datasets (``write_store``: one temporary folder,
    renamed into place by process 0, ``jaxembed.data.store_pod``); all open it when it is complete."""
    from jaxembed.data.store import Store
    from jaxembed.data.store_pod import prepare

    if config.data.store:
        return Store.open(config.data.store)
    store_dir = rd.store

    def needed() -> bool:
        # not: the run's own store (its config was checked), or one a refused start left for this data config
        return not ((store_dir / "manifest.json").exists() and (
            rd.config_json.exists() or _store_config(store_dir) == _plain(cfglib.data_section(config))))

    need = pod.main_first("store", needed)  # process 0 reads the folder; its error stops every process
    if pod.broadcast("store-needed", "yes" if need else "no") == "yes":
        say(f"data: preparing the dataset store in {store_dir} ({count(len(config.data.datasets), 'dataset')}: "
            "every record is read and checked once)")
        with atomic_files.writing("preparing the dataset store", store_dir,
                                  fix="run the same command again (the store is prepared from the start)"):
            report = prepare(cfglib.data_section(config), store_dir)
        log.info("prepared the dataset store: %s", report.summary() if hasattr(report, "summary") else report)
    return Store.open(store_dir)


def _build_plan(config, store, path: Path | None = None, inputs: dict | None = None):
    """The config's plan: in memory, or (``path``) built in blocks into path (plan.npz + plan.json, recording
    ``inputs``) and returned memory-mapped."""
    from jaxembed.data.plan import build_plan, build_plan_file

    if path is None:
        return build_plan(store, config.plan, data_config=cfglib.data_section(config))
    return build_plan_file(path, store, config.plan, data_config=cfglib.data_section(config),
                           sidecar={"inputs": inputs})


def _plain(data_config) -> Any:
    from jaxembed.data import config as dc

    return json.loads(json.dumps(dc.to_plain(data_config)))


def _store_config(store_dir: Path) -> Any:
    """The data config a store was prepared with (its manifest's), or None when unreadable."""
    try:
        return json.loads((store_dir / "manifest.json").read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError, AttributeError):
        return None


def prepare_plan(config, store, workdir: Path | RunDir, replan: bool = False):
    """The batch plan, a pure function of the store's datasets, the config and the files it names
    (``plan_inputs``). Every process computes those inputs (cheap: no plan) and checks that they are process
    0's: a process that reads other data stops, named. Then process 0 alone builds the plan, in blocks
    (``build_plan_file``), into ``<workdir>/plan.npz``, or keeps the saved one: as is when it records the same
    inputs, else after building the config's plan beside it and comparing the two (``replan``: the saved plan is
    replaced). The others wait. Returns the saved plan, memory-mapped (``Plan.load``)."""
    from jaxembed.data.plan import Plan, inputs_differences
    from jaxembed.data.plan.identity import compact

    path = rundir(workdir).plan
    inputs = saved_plan.plan_inputs_of(config, store)
    main_inputs = json.loads(pod.broadcast("plan-inputs", json.dumps(compact(inputs)) if pod.is_main() else None))

    def same_as_main():
        diffs = inputs_differences(inputs, main_inputs)
        if diffs:
            raise UserError(f"process {pod.process_index()} reads other data than process 0: {'; '.join(diffs)} "
                            "(process 0's -> this process's); the hosts would build different batch plans (fix: "
                            "every host must see the same data files)")

    def build_or_check():
        if replan or not path.exists():
            with atomic_files.writing("saving the batch plan", path):
                _build_plan(config, store, path, inputs)
        elif saved_plan.saved_inputs(path).get("fingerprint") != inputs["fingerprint"]:
            saved_plan.check_saved(path, lambda tmp: _build_plan(config, store, tmp, inputs))

    pod.all_agree("plan-inputs-check", same_as_main)
    pod.main_first("plan", build_or_check)
    # training reads the saved file, memory-mapped: a host keeps only the pages of the steps and rows it reads
    return Plan.load(path)


def setup(config, workdir: str | Path | RunDir, lock: WorkdirLock | None = None, read_only: bool = False) -> Run:
    """Validate, join the other processes (a pod), load the model, the store and the plan, build the optimizer.

    Nothing is written to the run directory until every read-only check has passed (the config, the previous
    run's config, the export folder, the model), and its config.json only once the store and the plan are built
    too: a refused config leaves no config behind to refuse the corrected one. ``lock`` (a ``WorkdirLock``; the
    trainer's): taken by process 0 before the first write, so a second run on the same directory stops there.
    ``read_only`` (an export of the run): nothing is written in the run directory, which may be on read-only
    storage (a run whose store was deleted gets it prepared again, as a resume does)."""
    cfglib.validate(config)
    parallel.initialize()  # before any other JAX call: every process of a pod joins here
    rd = rundir(workdir)  # the run directory's layout, derived once and passed on
    lora_spec = lora.spec_from_config(config)
    if lora_spec is not None:  # a target regex that matches no layer: a one-line error before anything is written
        lora.check_targets(config)
    _checks_before_writing(config, rd, read_only)
    if lock is not None:
        pod.main_first("workdir-lock", lock.acquire)
    mesh = parallel.make_mesh(config.train.mesh_data, config.train.mesh_fsdp)
    kw = model_kwargs(config)
    source = init_source(config, rd)
    loaded = load_model(config, source=source, **kw)
    say(describe_model(loaded, source, config, mesh))
    if lora_spec is not None and not (read_only and not rd.lora_base_json.exists()):
        # the adapters apply to these base weights only: a resume on others is an error
        pod.main_first("lora-base", lambda: lora.check_base(rd, lora.base_fingerprint(loaded.model), source))
    store, plan = _store_plan_and_config(config, rd, read_only)
    K = 1 + max(int(d.num_negatives) for d in store.datasets)
    spec = getattr(loaded.model.config, "mote", None)
    routes = None if spec is None else mote_routes(spec, store, plan)
    graphdef, rest, tx, sched = _trainable(config, loaded, lora_spec, mesh, plan.steps, routed=spec is not None)
    packing = _packing(config, store, plan, loaded, mesh, routes, K) if cfglib.packing_enabled(config) else None
    base = source if not Path(os.path.expanduser(str(source))).is_dir() else str(Path(source).expanduser().resolve())
    return Run(config, rd.root, mesh, loaded, store, plan, graphdef, rest, tx, sched, K, routes, packing, lora_spec,
               base if lora_spec is not None else "", rd)


def _checks_before_writing(config, rd: RunDir, read_only: bool) -> None:
    """setup's read-only checks on process 0, then every process's config against process 0's."""

    def read_only_checks():  # on process 0; the others stop with its error
        n = pod.process_count()
        if n > 1 and config.eval.tasks:
            raise UserError(f"config.eval.tasks = {tuple(config.eval.tasks)}: dev evaluation during training runs "
                            f"in a single process, not on {n} (fix: set --config.eval.tasks=() for the pod run and "
                            "evaluate its export with `jaxembed eval`)")
        check_workdir(config, rd)
        if config.export.at_end and not read_only:
            from jaxembed.export import check_target

            check_target(export_dir(config, rd), "config.export.dir", workdir=rd)

    pod.main_first("workdir-check", read_only_checks)
    main_config = pod.broadcast("config", cfglib.to_json(config) if pod.is_main() else None)
    pod.all_agree("config-check", lambda: _same_config_as_main(config, main_config))


def _store_plan_and_config(config, rd: RunDir, read_only: bool):
    """(store, plan) of the run, each described; then process 0 writes the run's config (every check passed)."""
    store = prepare_store(config, rd)
    say(describe_store(store, config, rd))
    if read_only:
        plan = saved_plan.read_only_plan(config, store, rd, lambda: _build_plan(config, store))
    else:
        # a run trained on to more steps (check_workdir), or a plan that no run's config.json claims: built anew
        replan = pod.is_main() and (not rd.config_json.exists() or check_workdir(config, rd))
        plan = prepare_plan(config, store, rd, replan=replan)
    say(describe_plan(plan, config, store))

    def write_config():
        with atomic_files.writing("writing the config", rd.config_json):
            cfglib.write_resolved(config, rd)

    if not read_only:
        pod.main_first("config", write_config)  # every check passed: process 0 writes the run's config
    return store, plan


def mote_routes(spec, store, plan):
    """MoTE: the routing tables of the plan's tasks (each task's type: its first dataset's)."""
    from jaxembed import mote

    task_types = {}
    for d in store.datasets:
        task_types.setdefault(d.task, d.task_type)
    return mote.routing_tables(spec, list(plan.task_names), task_types)


def _trainable(config, loaded, lora_spec, mesh, total: int, routed: bool):
    """(graphdef, the rest of the model, optimizer, schedule): the trainable parameters (LoRA: the adapters) split
    from the rest; LoRA's frozen base weights placed on the mesh."""
    graphdef, params, rest = nnx.split(loaded.model, lora.TRAINABLE if lora_spec is not None else nnx.Param, ...)
    if lora_spec is not None:  # the frozen base weights: an input of the step, placed (FSDP-sharded) once here
        rest = jax.device_put(rest, shardings(mesh, config.train.param_sharding, rest, pure=False))
    pure = nnx.to_pure_dict(params)
    warmup = config.optim.warmup_steps if config.optim.warmup_steps >= 0 else int(config.optim.warmup_ratio * total)
    tx, sched = optim.make_optimizer(
        pure, lr=config.optim.lr, total_steps=total, warmup_steps=warmup, schedule_kind=config.optim.schedule,
        weight_decay=config.optim.weight_decay, b1=config.optim.b1, b2=config.optim.b2, eps=config.optim.eps,
        grad_clip=config.optim.grad_clip, freeze=tuple(config.optim.freeze), end_factor=config.optim.end_factor,
        routed=routed)
    return graphdef, rest, tx, sched


def _packing(config, store, plan, loaded, mesh, routes, K: int):
    """The run's packing (data.packing): queries and candidates in one pack, unless MoTE routes some task's queries
    and documents to different experts (then two packs keep one expert per encode call, jaxembed.mote)."""
    from jaxembed import flops as flopslib
    from jaxembed.data.pipeline import packing_for

    combined = routes is None or bool(np.array_equal(routes[0], routes[1]))
    return packing_for(store, plan, loaded.tokenizer, shards=train_encode.row_shards(mesh), combined=combined,
                       model_config=loaded.model.config, platform=jax.default_backend(),
                       peak_flops=flopslib.peak_flops_per_device(),
                       gradcache_chunk=config.train.gradcache_chunk, num_candidates=K)


def export_dir(config, rd: RunDir) -> Path:
    """Where the run's export goes: ``export.dir``, or ``<workdir>/export``."""
    return rd.export_dir(config.export.dir)


def init_source(config, workdir: str | Path | RunDir) -> str:
    """The folder (or hub id) the run's weights come from: ``model.name``, or ``model.init_from`` (a previous
    stage): a run's ``export/``; a run without one is exported from its latest checkpoint into
    ``<workdir>/init_from`` (once; process 0 decides whether that is needed and writes it, every process takes
    part in restoring the checkpoint); or a model folder. Only step 0 reads it: a resumed run restores its own
    checkpoint."""
    src = config.model.get("init_from") if "init_from" in config.model else ""
    if not src:
        return config.model.name
    prev = RunDir(os.path.expanduser(str(src)))  # a previous stage's run directory, or a model folder
    p = prev.root
    if not prev.has_checkpoints():
        return str(p)  # a model folder
    if (prev.export / "config.json").is_file():  # its export, a model folder
        return str(prev.export)
    out = rundir(workdir).init_from
    need = pod.broadcast("init_from", "no" if (out / "config.json").is_file() else "yes") == "yes"
    if need:
        if pod.is_main():
            print(f"model.init_from: exporting the latest checkpoint of {p} to {out}", flush=True)
        export_from_workdir(p, out, lora_export="merged")  # a LoRA stage: its merged weights (no PEFT folder)
    return str(out)


def model_kwargs(config) -> dict:
    """The run config's ``model.*`` settings that shape the loaded model (``loading.load``'s keyword arguments)."""
    from jaxembed.models.layers import remat_option

    kw = dict(dtype=config.model.dtype, param_dtype=config.model.param_dtype,
              remat=remat_option(config.model.remat, config.model.get("remat_policy", "nothing")))
    if config.model.max_length:
        kw["max_length"] = config.model.max_length
    if config.model.pooling:
        kw["pooling"] = config.model.pooling
    if config.model.causal is not None:
        kw["causal"] = config.model.causal
    if "attention" in config.model:
        kw["attention"] = config.model.attention  # the attention kernel (jaxembed.models.attention)
    return kw


def load_model(config, source: str | None = None, **kw) -> loading.Loaded:
    """The run's model: ``source`` (default ``config.model.name``) loaded with ``kw``; with
    ``model.mote.enabled``, up-cycled into task experts (MoTE 3.1.1), or a MoTE export whose experts match the
    config. With ``model.lora.enabled``, LoRA adapters wrap the targeted linear layers (jaxembed.lora; after MoTE's
    up-cycling: adapters per expert), initialised from ``train.seed``."""
    loaded = _load_base(config, source or config.model.name, **kw)
    spec = lora.spec_from_config(config)
    if spec is not None:
        lora.apply(loaded.model, spec, seed=int(config.train.seed))
    return loaded


def _load_base(config, source: str, **kw) -> loading.Loaded:
    m = config.model.mote if "mote" in config.model else None
    if m is None or not m.enabled:
        loaded = loading.load(source, **kw)
        if getattr(loaded.model.config, "mote", None) is not None:
            raise UserError(f"the model {source!r} is a MoTE model (task experts) but "
                            "config.model.mote.enabled is False (fix: set model.mote.enabled=True, or start from a "
                            "dense model, e.g. `jaxembed export --model ... --average-experts`)")
        return loaded
    from jaxembed import mote
    from jaxembed.models import config_from_hf

    folder = loading.resolve(source)
    st = loading.read_sentence_transformers(folder)
    try:
        num_layers = config_from_hf(json.loads((st.transformer_dir / "config.json").read_text())).num_layers
    except (OSError, ValueError, TypeError) as e:
        raise UserError(f"{st.transformer_dir / 'config.json'}: cannot read the model config ({e})") from None
    return loading.load(folder, mote=mote.spec_from_config(m, num_layers), **kw)


def params_at(run: Run, ckpt: Checkpointer, step: int, like: dict | None = None) -> Any:
    """The run's parameters at ``step``: its checkpoint, or at step 0 the model it started from (the initial state
    is a pure function of the config and seed, so it needs no checkpoint). ``like``: a live train state of the
    run, the template to restore onto; given it, the run's own initial arrays were donated to the train step, so
    step 0 is loaded again."""
    if step == 0:
        if like is None:
            return init_state(run)["params"]
        c = run.config
        loaded = load_model(c, source=init_source(c, run.rundir), **model_kwargs(c))
        params = nnx.split(loaded.model, lora.TRAINABLE if run.lora is not None else nnx.Param, ...)[1]
        return nnx.to_pure_dict(params)
    like = like if like is not None else init_state(run)
    try:
        return ckpt.restore(step, like)["params"]
    except Exception as e:
        raise UserError(f"{ckpt.directory / str(step)}: unreadable checkpoint ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:300]}) (fix: export another step with --step)") from None


def resolve_step(workdir: Path | RunDir, config, step: int | str | None, steps: list[int]) -> int:
    """The step ``jaxembed export --step`` names: a number (a checkpoint, or 0: the starting model), 'latest'
    (also None), or 'best' (the best dev evaluation by ``eval.best_metric``, over every invocation of the run)."""
    from jaxembed.train.metrics import best_step, dev_scores

    rd = rundir(workdir)
    if step is None or step == "latest":
        if not steps:
            raise UserError(f"{rd.checkpoints}: no checkpoint to export (fix: --step 0 exports the model "
                            "the run started from)")
        return steps[-1]
    if step == "best":
        metric = config.eval.best_metric
        if not metric:
            raise UserError(f"--step best: the run at {rd.root} has no eval.best_metric, so no step is best (fix: "
                            "--step N, or 'latest')")
        best = best_step(dev_scores(rd, metric), config.eval.best_mode)
        if best is None:
            raise UserError(f"--step best: {rd.metrics_jsonl} holds no dev evaluation of {metric} (fix: "
                            "--step N, or 'latest')")
        if best and best not in steps:
            raise UserError(f"--step best: the best step {best} has no checkpoint (have: "
                            f"{', '.join(map(str, steps)) or 'none'}; 0 = the starting model)")
        return best
    try:
        n = int(step)
    except (TypeError, ValueError):
        raise UserError(f"--step {step!r}: a step number, 'best' or 'latest'") from None
    if n != 0 and n not in steps:
        raise UserError(f"--step {n}: no such checkpoint (have: {', '.join(map(str, steps)) or 'none'}; 0 = the "
                        "model the run started from; 'best' = the best dev step)")
    return n


def export_from_workdir(workdir: str | Path | RunDir, out: str | Path, step: int | str | None = None, *,
                        task: str | None = None, average_experts: bool = False, name: str | None = None,
                        lora_export: str | None = None) -> Path:
    """Export a checkpoint of a run (the latest, or ``step``: a number, 0 = the starting model, 'best', 'latest')
    as a HF / sentence-transformers folder.

    MoTE runs: the full export (every expert), or with ``task`` the plain dense folder of that task's expert, or
    with ``average_experts`` the expert-averaged dense folder (MoTE App. B). LoRA runs: ``model.lora.export``, or
    ``lora_export`` (merged / adapter / both); ``task`` and ``average_experts`` take the merged weights."""
    if task is not None and average_experts:
        raise UserError("export: give --task or --average-experts, not both")
    from jaxembed.export import check_target

    rd = rundir(workdir)
    check_target(out, "--out", workdir=rd)
    cfg_file = rd.config_json
    if not cfg_file.exists():
        raise UserError(f"{rd.root}: not a jaxembed run directory (no config.json)")
    config = cfglib.from_json(cfg_file.read_text())
    run = setup(config, rd, read_only=True)  # the run directory is read, never written
    ckpt = Checkpointer(rd.checkpoints, async_save=False, read_only=True)
    try:
        step = resolve_step(rd, config, step, sorted(ckpt.all_steps()))
        params = params_at(run, ckpt, step)
    finally:
        ckpt.close()
    params = host_params(params)  # every process; then process 0 writes the folder, the others wait
    from jaxembed import export as exportlib

    def write():
        with atomic_files.writing("writing the export", out):
            if task is None and not average_experts:
                return export_params(run, params, Path(out), step=step, name=name, lora_export=lora_export)
            model = host_model(run, params)
            if run.lora is not None:
                model = lora.merged(model)
            kw = dict(hf_config=run.loaded.hf_config, prompts={**run.loaded.st.prompts, **task_prompts(run.store)},
                      similarity_fn_name=run.loaded.st.similarity_fn_name)
            kind = f"expert {task}" if task is not None else "averaged"
            kw["model_card"] = run_card(run, model, kw["prompts"], step=step, name=name, kind=kind, path=Path(out),
                                        lora_export="merged")
            if task is not None:
                return exportlib.export_expert(model, run.loaded.tokenizer, Path(out), task, **kw)
            return exportlib.export_averaged(model, run.loaded.tokenizer, Path(out), **kw)

    pod.main_first("export-from-workdir", write)
    return Path(out)
