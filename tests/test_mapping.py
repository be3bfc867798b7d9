import numpy as np
import pytest

from jaxembed.models import mapping
from jaxembed.models.mapping import Rule


def test_expand_and_round_trip():
    rules = [*mapping.linear("enc.{i}.fc", "layers.{i}.fc"), Rule("emb.weight", "emb.embedding")]
    triples = mapping.expand(rules, 2)
    assert ("enc.1.fc.weight", ("layers", 1, "fc", "kernel"), "transpose") in triples
    rng = np.random.default_rng(0)
    tensors = {"emb.weight": rng.normal(size=(5, 3))}
    for i in range(2):
        tensors[f"enc.{i}.fc.weight"] = rng.normal(size=(4, 3))
        tensors[f"enc.{i}.fc.bias"] = rng.normal(size=(4,))
    expected = {("emb", "embedding"): (5, 3)}
    for i in range(2):
        expected[("layers", i, "fc", "kernel")] = (3, 4)
        expected[("layers", i, "fc", "bias")] = (4,)
    params, unused = mapping.hf_to_flax(rules, dict(tensors, extra=np.zeros(1), pos_ids=np.zeros(1)), 2, expected,
                                        ignore=[r"^pos_ids$"])
    assert unused == ["extra"]  # reported, not silently dropped; ignored buffers are not reported
    np.testing.assert_array_equal(params[("layers", 0, "fc", "kernel")], tensors["enc.0.fc.weight"].T)
    back = mapping.flax_to_hf(rules, params, 2)
    assert set(back) == set(tensors)
    for k in back:
        np.testing.assert_array_equal(back[k], tensors[k])


def test_missing_and_mismatched_tensors_are_named():
    rules = mapping.linear("fc", "fc")
    expected = {("fc", "kernel"): (3, 4), ("fc", "bias"): (4,)}
    with pytest.raises(mapping.MappingError, match="missing tensors.*fc.bias"):
        mapping.hf_to_flax(rules, {"fc.weight": np.zeros((4, 3))}, 0, expected)
    with pytest.raises(mapping.MappingError, match="fc.weight: checkpoint \\(3, 3\\) vs model \\(3, 4\\)"):
        mapping.hf_to_flax(rules, {"fc.weight": np.zeros((3, 3)), "fc.bias": np.zeros(4)}, 0, expected)


def test_export_refuses_unmapped_parameters():
    with pytest.raises(mapping.MappingError, match="no export rule"):
        mapping.flax_to_hf(mapping.linear("fc", "fc"), {("other", "kernel"): np.zeros((2, 2))}, 0)
