"""A training feature declares its settings beside its code: LoRA (``jaxembed.lora.LoRASpec``) and MoTE
(``jaxembed.mote.settings.MoTESettings``). The config's ``model.lora`` / ``model.mote`` sections, their checks and
their model-card words come from these declarations; the sections, the error texts and the card lines are pinned
here as they were before the declarations moved beside the features."""

import pytest

from jaxembed.errors import UserError

LORA_SECTION = {"enabled": False, "rank": 8, "alpha": 16.0, "dropout": 0.0, "target": "", "export": "merged",
                "base_dtype": "float32"}
MOTE_ROUTING = {
    "retrieval": ("search_query", "search_document"),
    "reranking": ("search_query", "search_document"),
    "classification": ("classification", "classification"),
    "clustering": ("clustering", "clustering"),
    "sts": ("classification", "classification"),
    "pair_classification": ("classification", "classification"),
    "nli": ("classification", "classification"),
    "summarization": ("classification", "classification"),
}
MOTE_SECTION = {"enabled": False, "experts": ("classification", "clustering", "search_query", "search_document"),
                "placement": "every", "routing": MOTE_ROUTING, "default": "classification"}


def test_the_lora_and_mote_sections_are_as_before():
    """Keys, defaults and types of ``model.lora`` and ``model.mote`` (routing: a ConfigDict of tuples)."""
    import ml_collections as mc

    from jaxembed.config import default_config

    c = default_config()
    assert c.model.lora.to_dict() == LORA_SECTION
    assert all(type(c.model.lora[k]) is type(v) for k, v in LORA_SECTION.items())
    assert c.model.mote.to_dict() == MOTE_SECTION
    assert all(type(c.model.mote[k]) is type(v) for k, v in MOTE_SECTION.items() if k != "routing")
    assert isinstance(c.model.mote.routing, mc.ConfigDict)
    assert all(type(v) is tuple for v in c.model.mote.routing.values())


@pytest.mark.parametrize("key,value,message", [
    ("rank", 0, "config.model.lora.rank = 0 is not valid: an integer >= 1, e.g. 8 or 16"),
    ("rank", True, "config.model.lora.rank = True is not valid: an integer >= 1, e.g. 8 or 16"),
    ("alpha", float("inf"), "config.model.lora.alpha = inf is not valid: a positive number (the scale is alpha / "
                            "rank), e.g. 16 or 2 x rank"),
    ("dropout", 1.0, "config.model.lora.dropout = 1.0 is not valid: a probability in [0, 1), e.g. 0.05"),
    ("export", "zip", "config.model.lora.export = 'zip' is not valid: allowed: merged, adapter, both"),
    ("base_dtype", "int8", "config.model.lora.base_dtype = 'int8' is not valid: allowed: float32, bfloat16 (the "
                           "frozen base weights' storage dtype)"),
    ("target", 3, "config.model.lora.target = 3 is not valid: a regular expression (string) searched in the linear "
                  "layers' paths; '' = default"),
    ("target", "(", "config.model.lora.target = '(' is not valid: a regular expression (missing ), unterminated "
                    "subpattern at position 0)"),
    ("dropout", 0.1, "config.model.lora.dropout = 0.1 acts only in train mode, and config.train.dropout is False "
                     "(fix: set train.dropout=True (the backbone's own dropout then acts too, as under PEFT's "
                     "model.train()), or model.lora.dropout=0)"),
])
def test_the_lora_checks_are_as_before(key, value, message):
    from jaxembed import lora
    from jaxembed.config import default_config

    section = default_config().model.lora
    lora.validate_config(section, False)
    with section.ignore_type():
        section[key] = value
    with pytest.raises(UserError) as e:
        lora.validate_config(section, False)
    assert str(e.value) == message


@pytest.mark.parametrize("key,value,types,message", [
    ("experts", (), (), "config.model.mote.experts: give at least one expert name, e.g. ('classification', "
                        "'clustering', 'search_query', 'search_document')"),
    ("experts", ("a", "a"), (), "config.model.mote.experts: expert names must be unique; repeated: a"),
    ("experts", ("a b",), (), "config.model.mote.experts: expert name 'a b' must use letters, digits, '_' or '-' "
                              "only"),
    ("placement", "some", (), "config.model.mote.placement = 'some' is not valid: allowed: every, every_other"),
    ("default", "x", (), "config.model.mote.default = 'x' is not one of the experts (classification, clustering, "
                         "search_query, search_document)"),
    ("routing", {"sts": ("classification", "nope")}, (),
     "config.model.mote.routing.sts = ('classification', 'nope'): unknown expert 'nope' (experts: classification, "
     "clustering, search_query, search_document; fix: use one of them, or add it to model.mote.experts)"),
    ("routing", {"sts": "classification"}, (),
     "config.model.mote.routing.sts = 'classification': expected (query expert, document expert), e.g. "
     "('search_query', 'search_document') or ('classification', 'classification')"),
    ("routing", {}, (("msmarco", "retrieval"),),
     "config.model.mote.routing: dataset 'msmarco' has task type 'retrieval', which routes to no expert (fix: set "
     "config.model.mote.routing.retrieval = (query expert, document expert), e.g. ('search_query', "
     "'search_document'))"),
])
def test_the_mote_checks_are_as_before(key, value, types, message):
    import ml_collections as mc

    from jaxembed import mote
    from jaxembed.config import default_config

    section = default_config().model.mote
    mote.validate_config(section, [("msmarco", "retrieval")])
    with section.ignore_type():
        section[key] = mc.ConfigDict(value) if isinstance(value, dict) else value
    with pytest.raises(UserError) as e:
        mote.validate_config(section, types)
    assert str(e.value) == message


def test_a_config_json_and_an_override_load_into_the_sections():
    """An existing run's config.json (routing: its own table) and ``--config.model.lora.rank=4`` keep working."""
    from jaxembed.config import default_config, from_json

    c = default_config()
    c.model.lora.rank = 4
    c.model.mote.routing = {"sts": ("clustering", "clustering")}
    back = from_json(c.to_json())
    assert back.model.lora.rank == 4 and type(back.model.lora.rank) is int
    assert back.model.mote.routing.to_dict() == {"sts": ("clustering", "clustering")}


def test_lora_settings_are_declared_beside_lora():
    """``LoRASpec`` holds the section's defaults and reads a run's section (an older config.json without
    ``base_dtype`` takes the default); its card row is the model card's LoRA line."""
    import ml_collections as mc

    from jaxembed import lora

    assert lora.LoRASpec.section().to_dict() == LORA_SECTION
    old = mc.ConfigDict({k: v for k, v in LORA_SECTION.items() if k != "base_dtype"})
    assert lora.LoRASpec.from_config(old) == lora.LoRASpec()
    assert lora.LoRASpec.card_row({"enabled": True, "rank": 4, "alpha": 8.0, "dropout": 0.0, "target": ""},
                                  "merged") == (
        "LoRA", "rank 4, alpha 8, dropout 0, target `attention + MLP` (base weights frozen; this export: merged)")
    assert lora.LoRASpec.card_row({"enabled": False}, "merged") is None


def test_mote_settings_are_declared_beside_mote():
    """``MoTESettings`` holds the section's defaults, checks it (``mote.validate_config``), reads a run's section
    and builds the model's ``MoTESpec``; the card's MoTE row comes from it."""
    from jaxembed.config import default_config
    from jaxembed.mote.settings import MoTESettings

    assert MoTESettings.section().to_dict() == MOTE_SECTION
    s = MoTESettings.from_config(default_config().model.mote)
    assert s == MoTESettings() and s.routing == MOTE_ROUTING
    spec = s.spec(4)
    assert spec.layers == (0, 1, 2, 3) and spec.default == "classification"
    assert MoTESettings.card_row(spec) == (
        "task experts (MoTE)", "`classification`, `clustering`, `search_query`, `search_document` in layers "
        "[0, 1, 2, 3]; default `classification`")


@pytest.mark.parametrize("value,message", [
    (-1, "config.train.gradcache_chunk = -1 is not valid: a non-negative integer"),
    (2.5, "config.train.gradcache_chunk = 2.5 is not valid: a non-negative integer"),
    (True, "config.train.gradcache_chunk = True is not valid: a non-negative integer"),
    (3, "config.train.gradcache_chunk = 3 is not valid: a divisor of plan.global_batch_size (8)"),
])
def test_the_gradient_cache_setting_is_declared_beside_it(value, message):
    """``train.gradcache_chunk``: its default in the train section, its checks (the texts they had) and its card
    row come from ``jaxembed.train.gradcache.GradCacheSettings``."""
    from jaxembed.config import default_config
    from jaxembed.train.gradcache import GradCacheSettings

    train = default_config().train
    assert train.gradcache_chunk == 0 and type(train.gradcache_chunk) is int
    GradCacheSettings.check(train, 8)
    assert GradCacheSettings.from_config(train.to_dict()).card_row() is None
    assert GradCacheSettings.from_config({"gradcache_chunk": 4}).card_row() == ("gradient cache",
                                                                              "sub-batches of 4 rows")
    with train.ignore_type():
        train.gradcache_chunk = value
    with pytest.raises(UserError) as e:
        GradCacheSettings.check(train, 8)
    assert str(e.value) == message


def test_the_packing_setting_is_declared_beside_packing():
    """``data.packing``: its default, its check (the text it had) and its reader (a data section without the key
    packs) come from ``jaxembed.packing.PackingSettings``."""
    from jaxembed.config import default_config, packing_enabled
    from jaxembed.packing import PackingSettings

    c = default_config()
    assert c.data.packing is True and packing_enabled(c)
    PackingSettings.check(c.data)
    assert PackingSettings.from_config({}).enabled and not PackingSettings.from_config({"packing": False}).enabled
    with c.data.ignore_type():
        c.data.packing = "yes"
    with pytest.raises(UserError) as e:
        PackingSettings.check(c.data)
    assert str(e.value) == ("config.data.packing = 'yes' is not valid: True (pack several texts per row) or False "
                            "(pad one per row)")
