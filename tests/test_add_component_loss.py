"""Adding a loss touches one file and one table entry (docs/architecture.md, "A loss: one file, one entry"):
tests/added_loss.py declares additive-margin InfoNCE with a setting of its own (``loss.am_margin``), the test
registers it in ``jaxembed.losses.table``, and everything else (the config section, its override, its check, a
tiny training run, the model card's loss line) follows from that entry, with no other file changed."""

from __future__ import annotations

import json

import pytest

from jaxembed.errors import UserError


@pytest.fixture
def added_loss():
    from added_loss import LOSS

    from jaxembed.losses import table

    table.register(LOSS)  # the one table entry
    try:
        yield LOSS
    finally:
        table.unregister(LOSS.name)


def test_a_loss_with_a_setting_of_its_own_is_one_file_and_one_entry(added_loss, tmp_path, shared_data):
    from jaxembed import config as cfglib
    from jaxembed.data.config import dataset_config
    from jaxembed.losses.table import LOSSES, card_text
    from jaxembed.models.tiny import tiny_model_dir
    from jaxembed.train import train

    assert LOSSES[-1] == "am_infonce"
    c = cfglib.default_config()
    assert c.loss.am_margin == 0.2  # the config section, assembled from the declarations
    cfglib.apply_overrides(c, ["loss.type=am_infonce", "loss.am_margin=0.3"])  # --config.loss.KEY=VALUE
    assert (c.loss.type, c.loss.am_margin) == ("am_infonce", 0.3)
    lines = (shared_data / "train" / "snli_triplets.jsonl").read_text(encoding="utf-8").splitlines(True)[:32]
    (tmp_path / "nli.jsonl").write_text("".join(lines), encoding="utf-8")
    c.model.name = str(tiny_model_dir("bert"))
    c.model.max_length = 16
    c.data.packing = False
    c.data.datasets = [dataset_config(name="nli", path=str(tmp_path / "nli.jsonl"), task_type="nli",
                                      num_negatives=1, query_instruction="")]
    c.plan.global_batch_size = 8
    c.plan.steps = 2
    c.train.log_every = 1
    c.train.checkpoint_every = 0
    c.export.at_end = False
    c.loss.am_margin = -1.0
    with pytest.raises(UserError, match=r"^config\.loss\.am_margin = -1\.0 is not valid: a non-negative number$"):
        cfglib.validate(c)
    c.loss.am_margin = 0.3
    summary = train(c, tmp_path / "run")
    assert summary["status"] == "completed" and summary["skipped"] == 0
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["split"] == "train"]
    assert len(train_rows) == 2 and all(r["am_loss"] > 0 and r["loss"] == r["am_loss"] for r in train_rows)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())["loss"]
    assert saved["type"] == "am_infonce" and saved["am_margin"] == 0.3
    assert card_text(saved) == ", additive margin 0.3"


def test_the_objective_calls_the_added_loss_with_its_settings(added_loss):
    """The objective's one hook gets the loss's own settings: margin 0 is plain InfoNCE, a margin raises the loss."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from added_loss import AmSettings

    from jaxembed.losses import objective as ob
    from jaxembed.losses.infonce import contrastive_loss

    rng = np.random.default_rng(0)
    q, c = jnp.asarray(rng.normal(size=(4, 8)), jnp.float32), jnp.asarray(rng.normal(size=(8, 8)), jnp.float32)
    pos, w = jnp.asarray([0, 2, 4, 6]), jnp.ones(4)

    def loss(margin):
        obj = ob.Objective(kinds=("am_infonce",), settings={"am_infonce": AmSettings(margin=margin)})
        return ob.total_loss(q, c, pos, objective=obj, contrastive=None, weights=w, temperature=0.05)[0]

    @jax.jit  # one compilation for the three values
    def values():
        return loss(0.0), loss(0.3), contrastive_loss(q, c, pos, temperature=0.05, weights=w)[0]

    no_margin, margin, plain = (float(x) for x in values())
    assert no_margin == pytest.approx(plain, rel=1e-5) and margin > plain + 1.0


# the loss section as jaxembed.config.default_config wrote it literally before its parts declared it
LOSS_SECTION = dict(type="infonce", temperature=0.05, symmetric=False, same_task_mask=False, peg_alpha=0.5,
                    peg_beta=0.1, matryoshka_dims=(), matryoshka_weights=(), tiled=False, block_q=1024,
                    block_c=8192, impl="jit", distill="none", distill_weight=1.0, distill_temperature=0.0,
                    scored_scale=20.0, angle_cosine_weight=0.0, gist_guide="", gist_margin=0.0,
                    gist_margin_strategy="absolute")


@pytest.mark.parametrize("key,value,message", [
    ("type", "focal", "config.loss.type = 'focal' is not valid: allowed: infonce, peg, cosent, angle"),
    ("temperature", 0.0, "config.loss.temperature = 0.0 is not valid: a positive number"),
    ("block_q", 2.5, "config.loss.block_q = 2.5 is not valid: a positive integer"),
    ("impl", "pmap", "config.loss.impl = 'pmap' is not valid: allowed: jit, shard_map"),
    ("peg_alpha", 1.5, "config.loss.peg_alpha = 1.5 is not valid: a momentum in [0, 1]"),
    ("peg_beta", -0.1, "config.loss.peg_beta = -0.1 is not valid: a non-negative number"),
    ("matryoshka_dims", (16, 32), "config.loss.matryoshka_dims = (16, 32) is not valid: positive integers in "
                                  "decreasing order, e.g. (384, 256, 128, 64)"),
    ("matryoshka_dims", (32, 16), "config.loss.matryoshka_weights = () is not valid: one weight per dimension of "
                                  "loss.matryoshka_dims (32, 16)"),
    ("distill", "mse", "config.loss.distill = 'mse' is not valid: allowed: none, kl, margin_mse"),
    ("distill_weight", 0.0, "config.loss.distill_weight = 0.0 is not valid: a positive number"),
    ("scored_scale", -1.0, "config.loss.scored_scale = -1.0 is not valid: a positive number"),
    ("angle_cosine_weight", float("nan"), "config.loss.angle_cosine_weight = nan is not valid: a non-negative number"),
    ("gist_margin", "x", "config.loss.gist_margin = 'x' is not valid: a number (0: mask what the guide finds at least "
                         "as close as the positive)"),
    ("gist_margin_strategy", "cubic", "config.loss.gist_margin_strategy = 'cubic' is not valid: allowed: absolute, "
                                      "relative"),
])
def test_the_loss_section_and_its_checks_are_as_before(key, value, message):
    """The section assembled from the parts has the keys, defaults and types it had; each check's one line is the
    text it was."""
    from jaxembed.config import default_config
    from jaxembed.losses.table import check_section

    section = default_config().loss
    assert section.to_dict() == LOSS_SECTION and all(type(section[k]) is type(v) for k, v in LOSS_SECTION.items())
    check_section(section)
    with section.ignore_type():
        section[key] = value
    with pytest.raises(UserError) as e:
        check_section(section)
    assert str(e.value) == message
