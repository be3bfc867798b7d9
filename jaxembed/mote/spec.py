"""The MoTE spec and its routing (MoTE 3.1: the routing R: I -> E; App. D.1; 5.3): which experts a model has,
which blocks are MoTE blocks, and which expert a task uses.

Routing is by task, per whole sequence, never per token: a task type maps to one expert, and the queries and the
documents of one retrieval batch go through different experts (search query / search document).

- ``MoTESpec`` (the ``mote`` field of every architecture config): the experts, the MoTE layers (``mote_layers``:
  every block or every other one), the routing (task type -> (query expert, document expert)) and the default
  expert; ``expert_name`` / ``expert_for`` (task, side) are R. Its ``feed_forward`` and ``route`` are what the
  model layer calls (``jaxembed.models.layers``), so the model layer never imports this package.
- The run config's ``model.mote`` section: ``jaxembed.mote.settings``.
- ``routing_tables``: each plan task's query and document expert, for the trainer.
- ``MoTESpec.to_json`` / ``from_json``: the ``mote_config.json`` of a full export (``jaxembed.mote.export``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx

from jaxembed.errors import UserError
from jaxembed.mote.block import MoTEFeedForward, make_route

#: MoTE App. D.1: four experts, one per instruction type.
DEFAULT_EXPERTS = ("classification", "clustering", "search_query", "search_document")
PLACEMENTS = ("every", "every_other")
#: task type -> (query expert, document expert). Retrieval routes queries and documents apart (MoTE 3.1). MoTE
#: 5.3, after Nussbaum et al. (2024): re-ranking goes to the retrieval experts; pair classification, STS and
#: summarization go to the classification expert. NLI counts as STS (KaLM Table 1).
DEFAULT_ROUTING = {
    "retrieval": ("search_query", "search_document"),
    "reranking": ("search_query", "search_document"),
    "classification": ("classification", "classification"),
    "clustering": ("clustering", "clustering"),
    "sts": ("classification", "classification"),
    "pair_classification": ("classification", "classification"),
    "nli": ("classification", "classification"),
    "summarization": ("classification", "classification"),
}
#: the expert for inputs with no task (MoTE 5.3 sends unseen symmetric tasks to classification).
DEFAULT_EXPERT = "classification"
#: MTEB task types that are not jaxembed's, and the routing entry they use.
_TYPE_ALIASES = {"multilabelclassification": "classification", "instructionretrieval": "retrieval",
                 "instructionreranking": "reranking", "bitextmining": "sts"}
#: files of a full MoTE export (beside the dense model of the default expert).
CONFIG_FILE = "mote_config.json"
WEIGHTS_FILE = "mote_experts.safetensors"
FORMAT = "jaxembed-mote"
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _norm(name: str) -> str:
    """Task type names compared case- and punctuation-free: ``PairClassification`` == ``pair_classification``."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def mote_layers(placement: str, num_layers: int) -> tuple[int, ...]:
    """Indices of the MoTE blocks: ``every`` block (EB, the paper's default), or ``every_other`` block (EOB): the
    odd-numbered ones (1, 3, 5, ...), as MoE models place their expert layers, so the last block of an even-depth
    model is a MoTE block."""
    if placement == "every":
        return tuple(range(num_layers))
    if placement == "every_other":
        return tuple(range(1, num_layers, 2))
    raise UserError(f"MoTE placement {placement!r} is not valid (fix: one of {', '.join(PLACEMENTS)})")


# ------------------------------------------------------------------------------------------------------- spec


@dataclasses.dataclass(frozen=True)
class MoTESpec:
    """The experts of a MoTE model (hashable: it is part of the architecture config, ``config.mote``).

    experts: names, in the order of the stacked expert axis; layers: indices of the MoTE blocks; routing:
    (task type, query expert, document expert) triples; default: the expert for inputs without a task."""

    experts: tuple[str, ...]
    layers: tuple[int, ...]
    routing: tuple[tuple[str, str, str], ...] = tuple((t, q, d) for t, (q, d) in DEFAULT_ROUTING.items())
    default: str = DEFAULT_EXPERT

    def __post_init__(self):
        check_experts(self.experts, "MoTE experts")
        if self.default not in self.experts:
            raise UserError(f"MoTE default expert {self.default!r} is not one of the experts "
                            f"{', '.join(self.experts)}")

    @classmethod
    def build(cls, num_layers: int, experts: Sequence[str] = DEFAULT_EXPERTS, placement: str = "every",
              routing: Mapping[str, Sequence[str]] | None = None, default: str = DEFAULT_EXPERT) -> "MoTESpec":
        routing = DEFAULT_ROUTING if routing is None else routing
        check_routing(routing, tuple(experts), "MoTE routing")
        triples = tuple((str(t), str(v[0]), str(v[1])) for t, v in routing.items())
        return cls(tuple(experts), mote_layers(placement, num_layers), triples, default)

    @property
    def num_experts(self) -> int:
        return len(self.experts)

    @property
    def routing_map(self) -> dict[str, tuple[str, str]]:
        return {t: (q, d) for t, q, d in self.routing}

    def index(self, name: str) -> int:
        """Position of expert ``name`` on the stacked axis."""
        if name not in self.experts:
            raise UserError(f"expert {name!r} is not loaded in this model (loaded: {', '.join(self.experts)}); "
                            "fix: load the model without task= (all experts), or for the task that uses it")
        return self.experts.index(name)

    def _route(self, task_type: str) -> tuple[str, str] | None:
        table = {_norm(t): (q, d) for t, q, d in self.routing}
        key = _norm(task_type)
        if key in table:
            return table[key]
        alias = _TYPE_ALIASES.get(key)
        return table.get(_norm(alias)) if alias else None

    def experts_for(self, task: str | None) -> tuple[str, ...]:
        """The expert names a task uses: an expert name -> itself; ``query`` / ``document`` -> the retrieval
        query / document expert; a task type (jaxembed's ``retrieval`` or MTEB's ``Retrieval``) -> its query
        and document experts (one name when they are the same); None -> the default expert."""
        if task is None:
            return (self.default,)
        if task in self.experts:
            return (task,)
        side = _norm(task)
        if side in ("query", "document"):
            pair = self._route("retrieval")
            if pair is None:
                raise UserError(f"task {task!r}: the routing has no 'retrieval' entry to take the {side} expert from")
            return (pair[0] if side == "query" else pair[1],)
        pair = self._route(task)
        if pair is None:
            raise UserError(
                f"task {task!r} is neither an expert ({', '.join(self.experts)}) nor a routed task type "
                f"({', '.join(t for t, _, _ in self.routing)}), nor query / document (fix: pass one of these, or "
                f"add the type to the routing: model.mote.routing.{_snake(task)} = (query expert, document expert))")
        return tuple(dict.fromkeys(pair))

    def expert_name(self, task: str | None, side: str | None = None) -> str:
        """The one expert that encodes ``task`` (see ``experts_for``) on ``side`` (``query`` / ``document`` /
        None). A task whose queries and documents use different experts needs a side."""
        names = self.experts_for(task)
        if len(names) == 1:
            return names[0]
        if side in ("query", "document"):
            return names[0] if side == "query" else names[1]
        raise UserError(f"task {task!r} encodes queries with expert {names[0]!r} and documents with {names[1]!r}; "
                        f"say which (fix: task {names[0]!r} or 'query' for queries, {names[1]!r} or 'document' "
                        "for documents)")

    def expert_for(self, task: str | None, side: str | None = None) -> int:
        """Index of ``expert_name(task, side)`` in this model's experts."""
        return self.index(self.expert_name(task, side))

    def subset(self, names: Iterable[str]) -> "MoTESpec":
        """The spec of a model that keeps only the experts ``names`` (in this spec's order); the routing is kept,
        so a task that needs a dropped expert says so."""
        keep = set(names)
        bad = keep - set(self.experts)
        if bad:
            raise UserError(f"unknown experts {sorted(bad)} (experts: {', '.join(self.experts)})")
        experts = tuple(e for e in self.experts if e in keep)
        return dataclasses.replace(self, experts=experts,
                                   default=self.default if self.default in keep else experts[0])

    def feed_forward(self, build: Callable[[nnx.Rngs], nnx.Module], rngs: nnx.Rngs) -> "MoTEFeedForward":
        """The feed-forward sublayer of a MoTE layer (``jaxembed.models.layers.feed_forward`` calls it): the
        dense block ``build(rngs)`` once per expert."""
        return MoTEFeedForward(build, self.num_experts, rngs)

    def route(self, experts: jax.Array | None, batch: int):
        """The route of a forward pass (``jaxembed.models.layers.mote_route`` calls it): ``make_route``."""
        return make_route(experts, self, batch)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": 1, "experts": list(self.experts), "layers": list(self.layers),
                "routing": {t: [q, d] for t, q, d in self.routing}, "default": self.default,
                "weights": WEIGHTS_FILE}

    @classmethod
    def from_json(cls, d: Mapping, where: str = CONFIG_FILE) -> "MoTESpec":
        if d.get("format") != FORMAT:
            raise UserError(f"{where}: not a jaxembed MoTE config (format {d.get('format')!r}, expected {FORMAT!r})")
        try:
            experts = tuple(d["experts"])
            routing = {t: tuple(v) for t, v in d["routing"].items()}
            check_routing(routing, experts, where)
            return cls(experts, tuple(int(i) for i in d["layers"]), tuple((t, q, dd) for t, (q, dd) in routing.items()),
                       d.get("default", experts[0]))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, UserError):
                raise
            raise UserError(f"{where}: malformed MoTE config ({type(e).__name__}: {e})") from None


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", str(name)).lower()


def check_experts(experts: Sequence[str], where: str) -> None:
    if not experts or isinstance(experts, str):
        raise UserError(f"{where}: give at least one expert name, e.g. {DEFAULT_EXPERTS}")
    for e in experts:
        if not isinstance(e, str) or not _NAME.match(e):
            raise UserError(f"{where}: expert name {e!r} must use letters, digits, '_' or '-' only")
    dup = sorted({e for e in experts if list(experts).count(e) > 1})
    if dup:
        raise UserError(f"{where}: expert names must be unique; repeated: {', '.join(dup)}")


def check_routing(routing: Mapping[str, Sequence[str]], experts: Sequence[str], where: str) -> None:
    for t, v in routing.items():
        if isinstance(v, str) or not isinstance(v, Sequence) or len(v) != 2:
            raise UserError(f"{where}.{t} = {v!r}: expected (query expert, document expert), e.g. "
                            f"('search_query', 'search_document') or ('classification', 'classification')")
        for e in v:
            if e not in experts:
                raise UserError(f"{where}.{t} = {tuple(v)!r}: unknown expert {e!r} (experts: {', '.join(experts)}; "
                                "fix: use one of them, or add it to model.mote.experts)")


def routing_tables(spec: MoTESpec, task_names: Sequence[str], task_types: Mapping[str, str]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Expert index of each plan task's queries and documents: int32 [T] each (T = len(task_names)).

    task_types: task name -> task type (from the dataset store). A task whose type has no route is an error that
    names the task and the fix."""
    q, d = [], []
    for name in task_names:
        ttype = task_types.get(name)
        pair = spec._route(ttype) if ttype else None
        if pair is None:
            raise UserError(f"task {name!r} (task type {ttype!r}) routes to no MoTE expert (fix: add "
                            f"config.model.mote.routing.{ttype} = (query expert, document expert), e.g. "
                            f"{DEFAULT_ROUTING.get(ttype or '', (spec.default, spec.default))})")
        q.append(spec.index(pair[0]))
        d.append(spec.index(pair[1]))
    return np.asarray(q, np.int32), np.asarray(d, np.int32)
