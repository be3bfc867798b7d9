"""Evaluation: the local task registry, fast local evaluators (``evaluate``) and the mteb side (an mteb v2
encoder around a jaxembed model, and the local sets as offline mteb custom tasks).

``cli`` is the ``jaxembed eval`` command (its arguments; the work is ``report``).

The mteb names (``MTEBEncoder``, ``mteb_task``, ``mteb_tasks``, ``run_mteb``) import mteb on first use only.
"""

from jaxembed.evaluate.prompts import (DEFAULT_INSTRUCTION_TEMPLATE, EvalEncoder, instruction_prompts,
                                       lookup_prompt, make_router)
from jaxembed.evaluate.runner import evaluate, evaluate_task, format_table, resolve_model_path
from jaxembed.evaluate.tasks import (TASK_TYPES, TASKS, Task, dev_tasks, eval_tasks, get_task, load_task_data,
                                     resolve_tasks, task_names)

_MTEB_NAMES = ("MTEBEncoder", "mteb_task", "mteb_tasks", "run_mteb")

__all__ = ["DEFAULT_INSTRUCTION_TEMPLATE", "EvalEncoder", "TASKS", "TASK_TYPES", "Task", "dev_tasks", "eval_tasks",
           "evaluate", "evaluate_task", "format_table", "get_task", "instruction_prompts", "load_task_data",
           "lookup_prompt", "make_router", "resolve_model_path", "resolve_tasks", "task_names", *_MTEB_NAMES]


def __getattr__(name):
    if name in _MTEB_NAMES:
        from jaxembed.evaluate import mteb_adapter

        return getattr(mteb_adapter, name)
    raise AttributeError(f"module 'jaxembed.evaluate' has no attribute {name!r}")
