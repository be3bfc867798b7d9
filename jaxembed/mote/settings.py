"""The run config's ``model.mote`` section, declared beside MoTE: ``MoTESettings`` (its keys, defaults and types),
its checks (``validate_config``: one-line errors naming the key and the fix), the reader of a run's section
(``MoTESettings.from_config``), the model's ``MoTESpec`` it builds, and MoTE's row on the model card.
``jaxembed.config`` assembles the section from ``MoTESettings.section()`` and checks it with ``validate_config``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

import ml_collections as mc

from jaxembed.errors import UserError
from jaxembed.mote.spec import (
    DEFAULT_EXPERT, DEFAULT_EXPERTS, DEFAULT_ROUTING, PLACEMENTS, MoTESpec, check_experts, check_routing,
)


@dataclasses.dataclass(frozen=True)
class MoTESettings:
    """``model.mote``: MoTE task experts (docs/mote.md). enabled: up-cycle the dense model's feed-forward blocks into
    task experts; experts: the expert names (MoTE App. D.1: four instruction types); placement: 'every' block (EB)
    or 'every_other' block (EOB: blocks 1, 3, 5, ...); routing: task type -> (query expert, document expert);
    default: the expert for inputs with no task."""

    enabled: bool = False
    experts: tuple[str, ...] = DEFAULT_EXPERTS
    placement: str = "every"
    routing: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=lambda: dict(DEFAULT_ROUTING))
    default: str = DEFAULT_EXPERT

    @classmethod
    def section(cls) -> mc.ConfigDict:
        """The config's ``model.mote`` section with its defaults (routing: a table whose keys are the run's own)."""
        d = dataclasses.asdict(cls())
        d["routing"] = mc.ConfigDict(d["routing"])
        return mc.ConfigDict(d)

    @classmethod
    def from_config(cls, m) -> MoTESettings:
        """The settings of a run's ``model.mote`` section; a key it lacks takes its default."""
        d = cls()
        routing = m.get("routing", None)
        return cls(bool(m.get("enabled", d.enabled)), tuple(m.get("experts", d.experts)),
                   str(m.get("placement", d.placement)),
                   d.routing if routing is None else {str(k): tuple(v) for k, v in dict(routing).items()},
                   str(m.get("default", d.default)))

    def spec(self, num_layers: int) -> MoTESpec:
        """The model's spec for a backbone with ``num_layers`` blocks."""
        return MoTESpec.build(num_layers, self.experts, self.placement, dict(self.routing), self.default)

    @staticmethod
    def card_row(spec: MoTESpec) -> tuple[str, str]:
        """MoTE's row in the model card's model table: the experts, the MoTE layers and the default expert."""
        return ("task experts (MoTE)", f"{', '.join(f'`{e}`' for e in spec.experts)} in layers "
                                       f"{list(spec.layers)}; default `{spec.default}`")

    @staticmethod
    def card_routing(spec: MoTESpec) -> list[str]:
        """MoTE's routing on the model card: one line per task type."""
        return [f"- `{t}`: queries `{q}`, documents `{d}`" for t, q, d in spec.routing]


def validate_config(m: Any, task_types: Iterable[tuple[str, str]] = (), where: str = "config.model.mote") -> None:
    """Check a run config's ``model.mote`` section, and that every (dataset, task type) of the data config has
    a routing entry. Raises UserError naming the key and the fix."""
    experts = tuple(m.experts)
    check_experts(experts, f"{where}.experts")
    if m.placement not in PLACEMENTS:
        raise UserError(f"{where}.placement = {m.placement!r} is not valid: allowed: {', '.join(PLACEMENTS)}")
    routing = dict(m.routing)
    check_routing(routing, experts, f"{where}.routing")
    if m.default not in experts:
        raise UserError(f"{where}.default = {m.default!r} is not one of the experts ({', '.join(experts)})")
    spec = MoTESpec(experts, (), tuple((str(t), v[0], v[1]) for t, v in routing.items()), m.default)
    for name, ttype in task_types:
        if ttype and spec._route(ttype) is None:
            raise UserError(f"{where}.routing: dataset {name!r} has task type {ttype!r}, which routes to no "
                            f"expert (fix: set {where}.routing.{ttype} = (query expert, document expert), e.g. "
                            f"{DEFAULT_ROUTING.get(ttype, (experts[0], experts[0]))})")


def spec_from_config(m, num_layers: int) -> MoTESpec:
    """The spec of a run config's ``model.mote`` section for a backbone with ``num_layers`` blocks."""
    return MoTESettings.from_config(m).spec(num_layers)
