"""Values that cannot train are refused before any work (jaxembed/config/scale.py, jaxembed.config.validate): a
temperature or scale whose logit scale the compute dtype's gradients cannot hold (``loss.temperature=1e-30`` used
to train with every update skipped, exit 0); and a wrong-type ``--config.KEY=VALUE`` names the key, the type it
takes and an example (it was ml_collections' raw cast message)."""

from __future__ import annotations

import math

import pytest

from jaxembed import config as cfglib
from jaxembed.errors import UserError


@pytest.fixture(scope="module")
def valid_config(shared_data):
    """A new config that validates at each call: a tiny random BERT, one shared training file."""
    from jaxembed.data.config import dataset_config
    from jaxembed.models.tiny import tiny_model_dir

    model = str(tiny_model_dir("bert"))

    def make():
        c = cfglib.default_config()
        c.model.name = model
        c.data.datasets = [dataset_config(name="stsb", path=str(shared_data / "train/stsb_pairs.jsonl"),
                                          format="scored_pairs", task_type="sts", score_threshold=3.0,
                                          num_negatives=0)]
        return c

    cfglib.validate(make())
    return make


@pytest.mark.parametrize("key,value,message", [
    ("loss.temperature", 1e-30, "config.loss.temperature = 1e-30 cannot train: its logit scale 1e+30 is above "
                                "2.81e+14, the largest whose gradients float32 holds"),
    ("data.datasets[0].temperature", 1e-20, "config.data.datasets[0].temperature = 1e-20 cannot train: its logit "
                                            "scale 1e+20 is above 2.81e+14"),
    ("loss.scored_scale", 1e16, "config.loss.scored_scale = 1e+16 cannot train"),
    ("loss.temperature", math.nan, "config.loss.temperature = nan is not valid: a positive number"),
    ("optim.lr", -1.0, "config.optim.lr = -1.0 is not valid: a positive number"),
    ("optim.lr", math.inf, "config.optim.lr = inf is not valid: a positive number"),
])
def test_a_scale_or_rate_that_cannot_train_is_refused(valid_config, key, value, message):
    c = valid_config()
    if key.startswith("data.datasets[0]"):
        c.data.datasets[0].temperature = value
    else:
        section, name = key.split(".")
        c[section][name] = value
    with pytest.raises(UserError) as e:
        cfglib.validate(c)
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_the_bound_of_the_train_dtypes_leaves_usual_values_alone(valid_config):
    from jaxembed.config.scale import max_logit_scale

    assert max_logit_scale("float32") == max_logit_scale("bfloat16") == pytest.approx(2.81475e14, rel=1e-4)
    c = valid_config()
    for t in (0.01, 0.05, 1e-14):  # 1e-14: scale 1e14, trains (the updates are clipped), so it is accepted
        c.loss.temperature = t
        cfglib.validate(c)


@pytest.mark.parametrize("override,message", [
    ("plan.steps=abc", "--config.plan.steps=abc: config.plan.steps is an integer, and 'abc' (read as str) is not "
                       "(fix: e.g. --config.plan.steps=100)"),
    ("optim.lr=abc", "--config.optim.lr=abc: config.optim.lr is a number, and 'abc' (read as str) is not (fix: e.g. "
                     "--config.optim.lr=2e-05)"),
    ("model.causal=maybe", "--config.model.causal=maybe: config.model.causal is True or False, and 'maybe' (read as "
                           "str) is not (fix: e.g. --config.model.causal=True)"),
    ("optim.freeze=3", "--config.optim.freeze=3: config.optim.freeze is a tuple, and '3' (read as int) is not (fix: "
                       "e.g. --config.optim.freeze=\"('a', 'b')\")"),
])
def test_a_wrong_type_override_names_the_key_the_type_and_an_example(override, message):
    with pytest.raises(UserError) as e:
        cfglib.apply_overrides(cfglib.default_config(), [override])
    assert str(e.value) == message


def test_nan_as_a_number_reaches_the_config_check(valid_config):
    """``--config.optim.lr=nan``: read as the number NaN (it was the text 'nan', refused by ml_collections' cast
    message), then refused by the range check, before any work."""
    c = cfglib.apply_overrides(valid_config(), ["optim.lr=nan", "loss.temperature=inf"])
    assert math.isnan(c.optim.lr) and math.isinf(c.loss.temperature)
    with pytest.raises(UserError, match=r"^config.loss.temperature = inf is not valid: a positive number$"):
        cfglib.validate(c)
