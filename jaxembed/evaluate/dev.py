"""The trainer's dev evaluation: the entries of ``eval.tasks`` -- registered task names, a user's own sets
(``jaxembed.evaluate.user_tasks``) and ``mteb:NAME`` MTEB tasks available offline -- checked before any work
(``validate_eval``, from ``jaxembed.config.validate``: a user's own sets are read whole there), their data
loaded once before the first training step (``DevEvaluator``), then scored at every evaluation:
``{"<entry name>": {"main_score": points, metric: points}}``.

The entry name prefixes the metrics that ``eval.best_metric`` names: a registered task's name, a user set's
``name``, or ``mteb:NAME`` as written (so an MTEB task never collides with a local one of the same name).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from typing import Any

from jaxembed.errors import InputError, UserError
from jaxembed.evaluate.tasks import TASKS, Task, get_task, load_task_data, task_names
from jaxembed.evaluate.user_tasks import METRICS, is_spec, user_task

MTEB_PREFIX = "mteb:"
SEED = 42  # the seed of the dev sets' samples (eval.max_examples)

#: the user sets read by the latest ``validate_eval`` (whole, every row checked): (task, its files' sizes and times,
#: max_examples, seed) -> data; the trainer's DevEvaluator takes them from here instead of reading them again
_READ: dict = {}


@dataclasses.dataclass
class DevTasks:
    """The parsed ``eval.tasks``: local tasks (registered and user sets) and MTEB task names, in order."""

    local: list[Task]
    mteb: list[str]  # MTEB task names, without the prefix

    @property
    def names(self) -> list[str]:
        """The metric prefix of each entry."""
        return [t.name for t in self.local] + [MTEB_PREFIX + n for n in self.mteb]


def _entries(tasks) -> list:
    if isinstance(tasks, str):
        return [x.strip() for x in tasks.split(",") if x.strip()]
    if is_spec(tasks):
        return [tasks]
    return list(tasks or ())


def _check_mteb_name(name: str, w: str) -> None:
    try:
        import mteb
    except ImportError:
        raise UserError(f"{w}: MTEB tasks need mteb: pip install 'jaxembed[eval]'") from None
    try:
        mteb.get_task(name)
    except KeyError as e:
        hint = str(e).split("Did you mean: ")
        close = hint[1].strip(" ?'\"") if len(hint) > 1 else ""
        did = f"did you mean mteb:{close}? " if close else ""
        raise UserError(f"{w}: 'mteb:{name}': no such MTEB task ({did}mteb.get_tasks() lists them)") from None


def parse_eval_tasks(tasks, where: str = "config.eval.tasks") -> DevTasks:
    """``eval.tasks`` -> DevTasks; an unknown name, a bad user spec or file, a duplicate is a UserError naming
    ``where[i]``. ``all`` / ``dev`` / ``eval`` expand to the registry's tasks (``eval`` sets are for reporting,
    not model selection)."""
    local: list[Task] = []
    mteb: list[str] = []
    seen: dict[str, str] = {}

    def add(name: str, w: str) -> None:
        if name in seen:
            raise UserError(f"{w}: {name!r} appears twice (also {seen[name]}) (fix: list each task once)")
        seen[name] = w

    for i, e in enumerate(_entries(tasks)):
        w = f"{where}[{i}]"
        if is_spec(e):
            t = user_task(e, w)
            add(t.name, w)
            local.append(t)
            continue
        if not isinstance(e, str) or not e.strip():
            raise UserError(f"{w}: expected a task name, 'mteb:NAME' or a dict(name=..., type=..., path=...), got "
                            f"{e!r}")
        e = e.strip()
        if e.startswith(MTEB_PREFIX):
            name = e[len(MTEB_PREFIX):]
            _check_mteb_name(name, w)
            add(e, w)
            mteb.append(name)
            continue
        if e in ("all", "dev", "eval"):
            names = task_names(None if e == "all" else e)
        else:
            try:
                names = [get_task(e).name]
            except UserError as err:
                raise UserError(f"{w}: {err} (fix: a registered name, 'mteb:NAME', or your own set as "
                                "dict(name=..., type=..., path=...))") from None
        for n in names:
            add(n, w)
            local.append(TASKS[n])
    return DevTasks(local, mteb)


def check_best_metric(best_metric: str, dev: DevTasks, where: str = "config.eval.best_metric") -> None:
    """``best_metric`` = ``'<entry name>/<metric>'`` names an entry of eval.tasks and one of its metrics
    (``main_score`` or the task type's; MTEB tasks: any, mteb decides)."""
    if not best_metric:
        return
    task, _, metric = best_metric.rpartition("/")
    names = dev.names
    if task not in names:
        close = difflib.get_close_matches(task, names, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}/{metric}? " if close else ""
        raise UserError(f"{where} = {best_metric!r}: {task!r} is not in eval.tasks ({hint}tasks: "
                        f"{', '.join(names) or 'none'}) (fix: '<task>/<metric>' of a task of eval.tasks, e.g. "
                        f"'{names[0] if names else 'STSBenchmark-dev'}/main_score')")
    if task.startswith(MTEB_PREFIX):
        return
    t = next(x for x in dev.local if x.name == task)
    allowed = ("main_score",) + METRICS[t.type]
    if metric not in allowed:
        raise UserError(f"{where} = {best_metric!r}: {t.type} tasks report {', '.join(allowed)}"
                        f"{_close(metric, allowed)} (fix: e.g. '{task}/main_score')")


def _close(x: str, known) -> str:
    m = difflib.get_close_matches(x, list(known), n=1, cutoff=0.6)
    return f" (did you mean {m[0]}?)" if m else ""


def validate_eval(eval_cfg, where: str = "config.eval") -> DevTasks:
    """Check ``eval.tasks`` and ``eval.best_metric`` before any work (names, user specs and files' first rows,
    MTEB names); -> the parsed tasks."""
    tasks = eval_cfg.get("tasks") if hasattr(eval_cfg, "get") else eval_cfg.tasks
    dev = parse_eval_tasks(tasks, f"{where}.tasks")
    best = eval_cfg.get("best_metric", "") if hasattr(eval_cfg, "get") else ""
    if dev.names:  # without dev tasks nothing is evaluated and best_metric is not used
        check_best_metric(best, dev, f"{where}.best_metric")
    max_examples = (eval_cfg.get("max_examples", None) if hasattr(eval_cfg, "get") else None) or None
    _READ.clear()
    for t in dev.local:  # a user's set is read whole now: a bad row anywhere stops the run before any work
        if t.user:
            try:
                _READ[_key(t, max_examples, SEED)] = load_task_data(t, max_examples=max_examples, seed=SEED)
            except InputError as e:
                raise UserError(f"{where}.tasks: {t.name}: {e}") from None
    return dev


def _key(task: Task, max_examples: int | None, seed: int) -> tuple:
    files = []
    for f in task.files.values():
        try:
            st = os.stat(f)
            files.append((f, st.st_size, st.st_mtime_ns))
        except OSError:
            files.append((f, None, None))
    return task.name, tuple(files), max_examples, seed


def _data(task: Task, max_examples: int | None, seed: int):
    """A local task's data: as ``validate_eval`` read it (a user set, unchanged since), else read now."""
    data = _READ.pop(_key(task, max_examples, seed), None) if task.user else None
    return data if data is not None else load_task_data(task, max_examples=max_examples, seed=seed)


class DevEvaluator:
    """Scores an encoder on the tasks of ``eval.tasks``. Every local set is read, and every MTEB task's data
    loaded, when it is made -- before training -- so a bad or missing file stops the run before its first step;
    each evaluation then only encodes and scores.

    max_examples: a seeded sample of at most N test examples per local task (MTEB tasks run whole). A user set's
    ``query_instruction`` / ``document_instruction`` are its prompts (mteb keys ``NAME`` / ``NAME-query`` /
    ``NAME-document``); other tasks use the model's own prompts."""

    def __init__(self, tasks, *, max_examples: int | None = None, seed: int = SEED, batch_size: int = 64,
                 where: str = "config.eval.tasks"):
        self.dev = parse_eval_tasks(tasks, where)
        self.seed, self.batch_size = seed, batch_size
        self.data = {t.name: _data(t, max_examples, seed) for t in self.dev.local}
        self.prompts: dict[str, str] = {}
        for t in self.dev.local:
            if t.user:
                self.prompts.update(t.instruction_prompts("{instruction}"))
        self.mteb_tasks = [_load_mteb(n, where) for n in self.dev.mteb]
        self._entry = {t.metadata.name: MTEB_PREFIX + n for t, n in zip(self.mteb_tasks, self.dev.mteb)}

    @property
    def names(self) -> list[str]:
        return self.dev.names

    def __call__(self, encoder) -> dict[str, dict]:
        from jaxembed.evaluate.prompts import EvalEncoder, as_encoder
        from jaxembed.evaluate.runner import evaluate_task

        enc = EvalEncoder(as_encoder(encoder), prompts=self.prompts, batch_size=self.batch_size)
        out = {t.name: evaluate_task(enc, t, seed=self.seed, data=self.data[t.name]) for t in self.dev.local}
        if self.mteb_tasks:
            out.update(self._mteb(encoder))
        return out

    def _mteb(self, encoder) -> dict[str, dict]:
        import mteb
        from threadpoolctl import threadpool_limits

        from jaxembed.evaluate.mteb_adapter import MTEBEncoder, scores_of

        model = MTEBEncoder(encoder, name="jaxembed/dev", batch_size=self.batch_size)
        with threadpool_limits(1, user_api="openmp"):
            res = mteb.evaluate(model, self.mteb_tasks, cache=None, overwrite_strategy="always",
                                encode_kwargs={"batch_size": self.batch_size, "show_progress_bar": False},
                                show_progress_bar=False, co2_tracker=False)
        return {self._entry.get(tr.task_name, MTEB_PREFIX + tr.task_name): scores_of(tr) for tr in res.task_results}


def _load_mteb(name: str, where: str) -> Any:
    """An MTEB task with its data loaded (from the local Hugging Face cache when offline); a UserError when it
    cannot be."""
    import mteb

    task = mteb.get_task(name)
    try:
        task.load_data()
    except Exception as e:  # noqa: BLE001 -- no network / not in the cache / a broken cache: the user's to fix
        msg = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"{where}: mteb:{name}: its dataset {task.metadata.dataset.get('path')} cannot be loaded "
                        f"({type(e).__name__}: {msg}) (fix: download it once where there is network: python -c "
                        f"\"import mteb; mteb.get_task('{name}').load_data()\", then run with HF_HUB_OFFLINE=1; or "
                        "remove the task)") from None
    return task

