"""The LLM client's limits on each request (``jaxembed.synth.client``, ``jaxembed.synth.transport``): a connect
timeout of its own, a read timeout, and a deadline on the whole answer, so that neither an endpoint whose
connections are never accepted nor one that trickles bytes can hold a job; each ends as a timeout, retried and
counted, and a job whose requests all fail stops in one line naming the endpoint."""

import time

import pytest

from fake_hub_server import StalledServer
from jaxembed.synth import client as llm

FAST = dict(model="fake-model", concurrency=1, max_retries=0, backoff_s=0.0, max_consecutive_failures=1,
            progress=False)


def _ask(url, tmp_path, **kw):
    c = llm.ChatClient(llm.LLMConfig(base_url=url + "/v1", **{**FAST, **kw}), tmp_path / "cache.jsonl")
    start = time.monotonic()
    with pytest.raises(llm.LLMRequestError) as e:
        c.chat([{"role": "user", "content": "hi"}])
    took = time.monotonic() - start
    with pytest.raises(llm.LLMFatalError) as fatal:  # the job stops: every request in a row failed
        c.chat([{"role": "user", "content": "hi again"}])
    c.close()
    return e.value, took, str(fatal.value)


def test_a_trickling_endpoint_is_cut_at_the_deadline(tmp_path):
    with StalledServer("trickle") as server:
        err, took, fatal = _ask(server.url, tmp_path, timeout_s=1.0)
    assert err.reason == "timeout" and took < 4, took
    assert server.url in fatal and "\n" not in fatal


def test_a_connection_never_accepted_ends_at_the_connect_timeout(tmp_path, monkeypatch):
    monkeypatch.setattr(llm, "CONNECT_TIMEOUT_S", 0.5, raising=False)
    with StalledServer("no_accept") as server:
        err, took, _ = _ask(server.url, tmp_path, timeout_s=30.0)
    assert err.reason == "timeout" and took < 5, took


def test_a_silent_endpoint_ends_at_the_read_timeout(tmp_path):
    with StalledServer("silent") as server:
        err, took, _ = _ask(server.url, tmp_path, timeout_s=0.5)
    assert err.reason == "timeout" and took < 4 and server.accepted == 1
