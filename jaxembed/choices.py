"""The names the command line and the run config accept for a model's runtime settings, declared once: argparse's
``choices`` (``jaxembed.cli``, ``evaluate.cli``, ``teacher.cli``, ``curriculum.cli``), the config checks
(``jaxembed.config``, ``jaxembed.pretrain.config``) and the modules that implement them (``jaxembed.pooling``,
``jaxembed.models.layers``, ``jaxembed.models.attention``) read these. It imports nothing of the project or of JAX,
so the command line is parsed without JAX. ``LiveNames``: the names of a registry (losses, record formats, tiny
models), read when used, so a component registered later is among them."""

from collections.abc import Callable, Sequence

#: pooling modes (``jaxembed.pooling``; ``--pooling``, ``model.pooling``)
POOLING_MODES = ("mean", "cls", "lasttoken", "max", "mean_sqrt_len")

#: computation dtypes a model runs in (``jaxembed.models.layers.to_dtype``; ``--dtype``)
DTYPES = ("float32", "bfloat16", "float16")

#: the dtypes of a training run (``model.dtype``, ``model.param_dtype``) and of ``teacher-score``: no float16
TRAIN_DTYPES = tuple(d for d in DTYPES if d != "float16")

#: attention kernels (``jaxembed.models.attention``; ``--attention``, ``model.attention``)
ATTENTION_KERNELS = ("auto", "xla", "cudnn", "te", "pallas", "pallas_flash", "splash")


class LiveNames(Sequence):
    """The names ``source()`` returns, between ``head`` and ``tail``, read each time they are used (a component
    registered after import is in them); ``+`` with a tuple gives another such view, so a list built from one
    stays current. Compares equal to the tuple of its names."""

    def __init__(self, source: Callable[[], tuple[str, ...]], head: tuple[str, ...] = (),
                 tail: tuple[str, ...] = ()):
        self._source, self._head, self._tail = source, tuple(head), tuple(tail)

    def _names(self) -> tuple[str, ...]:
        return (*self._head, *self._source(), *self._tail)

    def __getitem__(self, i):
        return self._names()[i]

    def __len__(self) -> int:
        return len(self._names())

    def __add__(self, other: tuple) -> "LiveNames":
        return LiveNames(self._source, self._head, self._tail + tuple(other))

    def __radd__(self, other: tuple) -> "LiveNames":
        return LiveNames(self._source, tuple(other) + self._head, self._tail)

    def __eq__(self, other) -> bool:
        return self._names() == (tuple(other) if isinstance(other, (tuple, LiveNames)) else other)

    def __hash__(self) -> int:
        return hash(self._names())

    def __repr__(self) -> str:
        return repr(self._names())
