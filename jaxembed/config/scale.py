"""The one rule for a run's logit scales, checked with the config (``check_logit_scales``): a contrastive loss
multiplies cosines by 1/temperature (``loss.temperature``, a dataset's ``temperature``), CoSENT / AnglE by
``loss.scored_scale``, and the gradients grow with that scale. The update's global gradient norm squares them, so
a scale s trains only while s**2 times a headroom of 2**32 (for the gradient's size at scale 1, summed over every
parameter) stays inside the compute dtype's range: s <= sqrt(max) / 2**16, about 2.8e14 in float32 and bfloat16
(the same exponent range). Above it every update's gradient norm overflows and the step's guard skips it; the
config is refused before any work instead. ``max_logit_scale`` gives the bound of a dtype."""

from __future__ import annotations

import math

from jaxembed.errors import UserError

#: the headroom for the gradient's size at scale 1 (its squared global norm, summed over every parameter)
HEADROOM = 2.0 ** 32


def max_logit_scale(dtype: str) -> float:
    """The largest logit scale whose gradients a model computing in ``dtype`` holds (see the module docstring)."""
    import numpy as np

    big = float(np.finfo(np.float32).max) if dtype == "bfloat16" else float(np.finfo(np.dtype(dtype)).max)
    return math.sqrt(big / HEADROOM)


def _refuse(key: str, value: float, scale: float, limit: float, dtype: str, fix: str) -> UserError:
    return UserError(f"config.{key} = {value!r} cannot train: its logit scale {scale:.3g} is above {limit:.3g}, the "
                     f"largest whose gradients {dtype} holds (they grow with the scale, and beyond it their squared "
                     f"norm overflows and the updates are skipped as non-finite) (fix: {fix})")


def check_logit_scales(c) -> None:
    """Refuse a temperature or scale whose logit scale is above ``max_logit_scale`` of ``model.dtype`` (after the
    range checks of jaxembed.config.validate: every value is a finite number > 0 here)."""
    dtype = str(c.model.dtype)
    limit = max_logit_scale(dtype)
    least = 1.0 / limit
    temps = [("loss.temperature", c.loss.temperature)]
    temps += [(f"data.datasets[{i}].temperature", d.get("temperature")) for i, d in enumerate(c.data.get("datasets")
                                                                                              or ())]
    for key, t in temps:
        if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 < t < least:
            raise _refuse(key, t, 1.0 / t, limit, dtype, f"a temperature of at least {least:.3g}; the usual ones are "
                                                         "0.01 to 0.1, e.g. 0.05 (scale 20)")
    s = c.loss.get("scored_scale")
    if isinstance(s, (int, float)) and not isinstance(s, bool) and s > limit:
        raise _refuse("loss.scored_scale", s, s, limit, dtype, "a scale of at most that; sentence-transformers' "
                                                              "CoSENT default is 20")
