"""What a loss or a loss-side feature declares beside its code, and what ``jaxembed.losses.table`` registers in one
entry each (``Loss`` or ``Feature``).

A part's settings are a frozen dataclass (a subclass of ``Settings``) whose fields are the ``loss.*`` config keys it
owns, each made by ``setting(key, default, check)``: the config's ``loss`` section is assembled from these fields
(defaults, in table order), and checked by their ``check`` (a value -> None, or what is allowed: the error reads
``config.loss.KEY = VALUE is not valid: ALLOWED``) and by the class's ``check_section`` (checks across keys). A
part's text on the model card is its ``card`` (the run's loss section, one value per field, None where an older
config.json lacks the key). A loss also has its hook, ``rows(settings, rows, weights, kind) -> (loss, metrics)``:
what ``jaxembed.losses.objective.total_loss`` calls on the rows of the batch that it trains.

Nothing here imports JAX (the config and the data layer read the declarations); a hook imports its math when the
train step traces it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any, Callable

from jaxembed.errors import UserError

#: a query against its positive, its hard negatives and the other candidates of the batch (distillation and the
#: GIST guide act on these rows)
CONTRASTIVE = "contrastive"
#: a pair (sentence1, sentence2) and its similarity score: the model's similarities must rank the pairs as their
#: scores do; every scored pair is kept, with its score, and no score_threshold applies
SCORED = "scored"

Check = Callable[[Any], "str | None"]


def setting(key: str, default: Any, check: Check | None = None) -> Any:
    """A settings field: config key ``loss.<key>``, its default, and its check (value -> None when valid, else what
    is allowed)."""
    return dataclasses.field(default=default, metadata={"key": key, "check": check})


def refuse(key: str, value: Any, allowed: str) -> UserError:
    """The config check's one-line error for ``loss.<key>``."""
    return UserError(f"config.loss.{key} = {value!r} is not valid: {allowed}")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def positive(v: Any) -> str | None:
    return None if is_number(v) and v > 0 else "a positive number"


def non_negative(v: Any) -> str | None:
    return None if is_number(v) and v >= 0 else "a non-negative number"


def positive_integer(v: Any) -> str | None:
    return None if is_number(v) and v > 0 and float(v).is_integer() else "a positive integer"


def momentum(v: Any) -> str | None:
    return None if is_number(v) and 0 <= v <= 1 else "a momentum in [0, 1]"


def one_of(*allowed: str) -> Check:
    return lambda v: None if v in allowed else f"allowed: {', '.join(map(str, allowed))}"


def number(meaning: str) -> Check:
    return lambda v: None if is_number(v) else f"a number ({meaning})"


def resolve(ref: str) -> Callable:
    """``module:name`` -> that function, imported when first called: a declaration names its math this way (the
    math modules import JAX and read the table, which imports the declarations)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def _cast(default: Any, v: Any) -> Any:
    """A config value as its field's type (the default's): ints, floats, bools and strings as such, sequences as
    tuples."""
    if isinstance(default, bool):
        return bool(v)
    if isinstance(default, (int, float, str)):
        return type(default)(v)
    if isinstance(default, tuple):
        return tuple(v)
    return v


class Settings:
    """The settings of one part (subclasses are frozen dataclasses of ``setting`` fields)."""

    @classmethod
    def keys(cls) -> tuple[tuple[str, str, Any, Check | None], ...]:
        """(field name, config key, default, check) of each field, in order."""
        return tuple((f.name, f.metadata["key"], f.default, f.metadata["check"]) for f in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """{config key: default}: this part's share of the config's ``loss`` section."""
        return {key: default for _, key, default, _ in cls.keys()}

    @classmethod
    def check(cls, section) -> None:
        """Each field's check on the config section, then ``check_section``; raises UserError (one line)."""
        for _, key, _, check in cls.keys():
            allowed = check(section[key]) if check is not None else None
            if allowed:
                raise refuse(key, section[key], allowed)
        cls.check_section(section)

    @classmethod
    def check_section(cls, section) -> None:
        """Checks across keys (a part with some overrides it)."""

    @classmethod
    def from_section(cls, section) -> Settings:
        """The settings of a run's (checked) loss section; a key it lacks (an older config.json) takes its default."""
        return cls(**{name: _cast(default, section.get(key, default)) for name, key, default, _ in cls.keys()})

    @classmethod
    def card(cls, values: dict[str, Any]) -> str:
        """The part's words on the model card's loss line (values: by field name; None when missing)."""
        return ""

    @classmethod
    def card_of(cls, section: dict) -> str:
        return cls.card({name: section.get(key) for name, key, _, _ in cls.keys()})

    def contrastive_path(self) -> tuple[dict, dict]:
        """A contrastive loss: (``jaxembed.losses.core.LossOptions`` fields, ``contrastive_loss`` keyword arguments)
        of its variant of the contrastive path."""
        return {}, {}


@dataclasses.dataclass(frozen=True)
class NoSettings(Settings):
    """A part with no setting of its own."""


@dataclasses.dataclass(frozen=True)
class Loss:
    """One loss a config may name (``loss.type``, a dataset's ``loss``). title: its name in prose; kind: CONTRASTIVE
    or SCORED (what its datasets hold; distillation and the GIST guide act on the contrastive rows); settings: its
    ``Settings`` class; rows: its hook (a function, or its ``module:name``), ``rows(settings, rows, weights, kind) ->
    (loss, metrics)``, called by ``jaxembed.losses.objective.total_loss`` with the weights of its own rows
    (``objective.Rows``: the embeddings, the contrastive path, the pair scores); data: what its datasets hold, for
    messages and docs."""

    name: str
    title: str
    kind: str
    settings: type = NoSettings
    rows: Callable | str = ""
    data: str = ""

    def hook(self) -> Callable:
        return resolve(self.rows) if isinstance(self.rows, str) else self.rows

    @property
    def config_keys(self) -> tuple[str, ...]:
        return tuple(self.settings.defaults())


@dataclasses.dataclass(frozen=True)
class Feature:
    """A loss-side feature (Matryoshka, distillation, the GIST guide, the contrastive path's implementation): its
    ``Settings`` class; the train step reads them (``jaxembed.train.loss``: ``LossSetup.settings``)."""

    name: str
    settings: type
