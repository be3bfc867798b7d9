"""The LLM data tools against a local fake OpenAI-compatible endpoint (tests/fake_llm_server.py): the client's
retries (429 with Retry-After, 5xx, timeouts), cache and accounting; strict JSON answers retried then reported;
the persona job end to end (a dataset that `jaxembed data validate` / `data prepare` accept); resuming a job that
died half-way without asking again; the false-negative judge."""

import json
import time
from pathlib import Path

import pytest
from fake_llm_server import FakeLLM

from jaxembed.cli import main
from jaxembed.errors import UserError
from jaxembed.synth.client import (AnswerError, ChatClient, LLMConfig, LLMFatalError, LLMRequestError, ask_json,
                                   parse_json)

FAST = dict(model="fake-model", concurrency=4, timeout_s=1.0, max_retries=3, backoff_s=0.01, backoff_max_s=0.05,
            progress=False, price_prompt_per_1k=1.0, price_completion_per_1k=2.0, api_key_env="JAXEMBED_TEST_KEY")


@pytest.fixture
def fake():
    with FakeLLM() as f:
        yield f


def _msgs(text):
    return [{"role": "user", "content": text}]


def test_client_retries_cache_and_accounting(fake, tmp_path):
    fake.script("alpha", {"status": 429, "retry_after": "0.3"})
    fake.script("beta", {"status": 500}, {"status": 503})
    fake.script("gamma", {"sleep": 1.6})                          # longer than the 1 s timeout
    fake.script("delta", *[{"status": 502}] * 4)                  # more than max_retries
    c = ChatClient(LLMConfig(base_url=fake.url, **FAST), tmp_path / "cache.jsonl")
    r = c.chat(_msgs("alpha: say hi"))
    times = [x["time"] for x in fake.log if "alpha" in x["text"]]
    assert [x["status"] for x in fake.log if "alpha" in x["text"]] == [429, 200]
    assert times[1] - times[0] >= 0.3                            # Retry-After honoured (not the 0.01 s backoff)
    assert not r.cached and r.text == "I do not understand the request."
    assert c.chat(_msgs("beta")).text
    assert c.chat(_msgs("gamma")).text
    with pytest.raises(LLMRequestError) as e:
        c.chat(_msgs("delta"))
    assert e.value.reason == "http 502"
    s = c.stats.to_dict(c.cfg)
    assert s["retries"] == {"http 429": 1, "http 500": 1, "http 503": 1, "timeout": 1, "http 502": 3}
    assert s["failures"] == {"http 502": 1}
    assert s["requests"] == fake.count() == 2 + 3 + 2 + 4 and s["ok"] == 3
    assert s["cost"] == pytest.approx((s["prompt_tokens"] * 1.0 + s["completion_tokens"] * 2.0) / 1000)
    assert s["prompt_tokens"] > 0 and s["wait_s"] >= 0.3
    # cached: same messages -> no request; another salt -> a new request
    n = fake.count()
    assert c.chat(_msgs("alpha: say hi")).cached and fake.count() == n
    assert not c.chat(_msgs("alpha: say hi"), salt="2").cached and fake.count() == n + 1
    c.close()
    # a new client (a rerun) on the same cache file; a torn last line (killed mid-write) is cut off
    with open(tmp_path / "cache.jsonl", "ab") as f:
        f.write(b'{"key": "abc", "respon')
    c2 = ChatClient(LLMConfig(base_url=fake.url, **FAST), tmp_path / "cache.jsonl")
    assert c2.cache.torn == 1 and len(c2.cache) == 4
    assert c2.chat(_msgs("beta")).cached and fake.count() == n + 1
    c2.close()


def test_client_fatal_errors(fake, tmp_path, monkeypatch):
    fake.api_key = "s3cret"
    c = ChatClient(LLMConfig(base_url=fake.url, **FAST), tmp_path / "a.jsonl")
    with pytest.raises(LLMFatalError, match=r"HTTP 401 unauthorized: check the key in \$JAXEMBED_TEST_KEY"):
        c.chat(_msgs("hello"))
    with pytest.raises(LLMFatalError):                            # the job stops: no further request is sent
        c.chat(_msgs("hello again"))
    assert fake.count() == 1
    monkeypatch.setenv("JAXEMBED_TEST_KEY", "s3cret")
    assert ChatClient(LLMConfig(base_url=fake.url, **FAST), tmp_path / "b.jsonl").chat(_msgs("hello")).text
    bad = ChatClient(LLMConfig(base_url=fake.url.replace("/v1", "/nope"), **FAST), tmp_path / "c.jsonl")
    with pytest.raises(LLMFatalError, match="HTTP 404 not found: check --base-url"):
        bad.chat(_msgs("hello"))
    with pytest.raises(UserError, match="model: required"):
        LLMConfig(base_url=fake.url).validate()


def test_ask_json_retries_malformed_answers_then_reports(fake, tmp_path):
    fake.script("one", {"content": "Sure! Here it is: {\"a\": 1}"}, {"content": "```json\n{\"a\": 1}\n```"})
    fake.script("two", {"content": "{\"a\": 1"}, {"content": "{\"b\": 2}"},
                {"content": "{\"a\": [1, 2, 3", "finish_reason": "length"})
    c = ChatClient(LLMConfig(base_url=fake.url, **FAST), tmp_path / "cache.jsonl")

    def need_a(v):
        if not isinstance(v, dict) or "a" not in v:
            raise AnswerError("missing key 'a'")
        return v["a"]

    out = ask_json(c, _msgs("one"), need_a, salt="x", attempts=3)
    assert out.ok and out.value == 1 and out.attempts == 2 and out.reasons == ["invalid JSON"]
    out = ask_json(c, _msgs("two"), need_a, salt="x", attempts=3)   # never raises
    assert not out.ok and out.reasons == ["invalid JSON", "missing key 'a'", "truncated (finish_reason=length)"]
    assert out.reason == "truncated (finish_reason=length)"
    n = fake.count()
    again = ask_json(c, _msgs("two"), need_a, salt="x", attempts=3)  # a rerun: every attempt from the cache
    assert again.reasons == out.reasons and again.cached == 3 and fake.count() == n
    assert parse_json(" [1, 2] ") == [1, 2]
    with pytest.raises(AnswerError, match="empty answer"):
        parse_json("```\n```")


def _personas(tmp_path) -> Path:
    p = tmp_path / "personas.jsonl"
    rows = ["A marine biologist who studies coral reefs.", "A retired chef who writes about regional cuisine.",
            "A tax lawyer advising small businesses.", "A high-school physics teacher.",
            "a marine biologist who studies  coral reefs."]          # a duplicate after normalisation
    p.write_text("".join(json.dumps({"persona": r}) + "\n" for r in rows))
    return p


def _job_args(fake, personas, out, *extra):
    return ["synth", "personas", "--personas", str(personas), "--out", str(out), "--base-url", fake.url,
            "--model", "fake-model", "--api-key-env", "JAXEMBED_TEST_KEY", "--num-personas", "3",
            "--instructions-per-persona", "2", "--examples-per-instruction", "2", "--sts-examples-per-persona", "2",
            "--concurrency", "4", "--timeout", "1", "--max-retries", "3", "--backoff", "0.01",
            "--price-prompt", "0.5", "--price-completion", "1.5", "-q", *extra]


def test_persona_job_end_to_end(fake, tmp_path, capsys):
    same = json.dumps(["Given a recipe name, find its ingredients.", "given a  recipe name, find its ingredients."])
    fake.script("Brainstorm a list of potentially useful text classification tasks",
                {"status": 429, "retry_after": "0.2"})
    fake.script("text matching tasks where both the queries and the documents are extremely short",
                {"content": same}, {"content": same})                 # duplicate instructions across personas
    fake.script('"S1"', *[{"content": "S1: a sentence. S2: another."}] * 3, same_prompt=True)  # 1 item, 3x bad
    fake.script('"hard_negative_short_text"', {"status": 500})
    fake.script('"user_query"', {"sleep": 1.6})                      # a timeout
    dup = json.dumps({"input": "Long input text about fossils and rocks.", "positive_document": "A related doc.",
                      "hard_negative_document": "An unrelated doc."})
    fake.script('"positive_document": a string, a long document', {"content": dup}, {"content": dup})
    out = tmp_path / "synth"
    assert main(_job_args(fake, _personas(tmp_path), out)) == 0
    printed = capsys.readouterr().out
    assert f"data config: {out / 'synth_data.py'}" in printed and "report:" in printed
    r = json.loads((out / "report.json").read_text())
    assert r["personas"]["read"] == 5 and r["personas"]["duplicates"] == 1 and r["personas"]["sampled"] == 3
    fam = r["families"]
    assert set(fam) == {"short_long", "long_short", "short_short", "long_long", "classification", "sts"}
    for name in ("short_long", "long_short", "long_long", "classification"):
        assert fam[name]["brainstorm_requests"] == 3 and fam[name]["instructions_written"] == 6
        assert fam[name]["examples_written"] == 12 - fam[name].get("examples_duplicate", 0)
    assert fam["short_short"]["instructions_duplicate"] == 3 and fam["short_short"]["instructions_written"] == 3
    assert fam["long_long"]["examples_duplicate"] == 1                  # exact-duplicate example dropped
    assert fam["sts"]["examples_rejected"] == 1 and fam["sts"]["rejected: invalid JSON"] == 1
    assert fam["sts"]["examples_written"] == 5
    assert r["rejected"] == 1
    rej = [json.loads(x) for x in (out / "rejected.jsonl").read_text().splitlines()]
    assert rej[0]["family"] == "sts" and rej[0]["reasons"] == ["invalid JSON"] * 3
    c = r["client"]
    assert c["retries"]["http 429"] == 1 and c["retries"]["http 500"] == 1 and c["retries"]["timeout"] >= 1
    assert c["failures_total"] == 0 and c["requests"] == fake.count()
    assert c["cost"] == pytest.approx((c["prompt_tokens"] * 0.5 + c["completion_tokens"] * 1.5) / 1000)
    # the dataset: every file valid, and `data prepare` builds a store with one dataset per instruction
    files = sorted(str(p) for p in (out / "data").rglob("*.jsonl"))
    assert len(files) == r["datasets"] == 6 * 4 + 3 + 1
    assert main(["data", "validate", "-q", *files]) == 0
    assert main(["data", "prepare", "--config", str(out / "synth_data.py"), "--out", str(tmp_path / "store"),
                 "-q"]) == 0
    from jaxembed.data.store import Store

    st = Store.open(tmp_path / "store")
    assert sum(d.size for d in st.datasets) == r["examples_written"]
    cls = [d for d in st.datasets if d.task == "synth_classification"]
    assert len(cls) == 6 and all(d.query_instruction.startswith("Instruct: ") for d in cls)
    assert all(d.batching == "heterogeneous" and d.task_type == "classification" for d in cls)
    sts = st.dataset("synth_sts")
    assert sts.query_instruction == "" and sts.task_type == "sts"
    ex = st.example(cls[0].name, 0)
    assert ex["label"] == ex["pos"][0] and ex["neg"] and ex["neg"][0] != ex["pos"][0]
    st.close()


def test_killed_job_resumes_without_asking_again(fake, tmp_path):
    personas, out = _personas(tmp_path), tmp_path / "synth"
    args = _job_args(fake, personas, out, "--families", "short_long,sts", "--max-failures-in-a-row", "3")
    fake.budget = 7                                   # the endpoint dies after 7 answers: the job stops
    with pytest.raises(LLMFatalError, match="requests in a row failed"):
        from jaxembed.cli import build_parser

        a = build_parser().parse_args(args)
        a.func(a)
    answered_before = fake.count(status=200)
    assert answered_before == 7
    fake.budget = None
    fake.reset_log()
    assert main(args) == 0                            # rerun: only what is missing is asked
    r = json.loads((out / "report.json").read_text())
    assert r["client"]["cache_hits"] == 7
    assert fake.count(status=200) == r["client"]["calls"] - 7  # every answer was asked for exactly once
    assert r["examples_written"] > 0
    snapshot = {p.relative_to(out): p.read_bytes() for p in (out / "data").rglob("*.jsonl")}
    snapshot[Path("datasets.json")] = (out / "datasets.json").read_bytes()
    fake.reset_log()
    assert main(args) == 0                            # a third run: nothing to ask, the same output
    assert fake.count() == 0
    again = {p.relative_to(out): p.read_bytes() for p in (out / "data").rglob("*.jsonl")}
    again[Path("datasets.json")] = (out / "datasets.json").read_bytes()
    assert again == snapshot
    with pytest.raises(UserError, match="not a synth output"):
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "x.txt").write_text("x")
        from jaxembed.synth.personas import PersonaJobConfig, run_persona_job

        run_persona_job(PersonaJobConfig(personas=str(personas), out=str(tmp_path / "other")),
                        LLMConfig(base_url=fake.url, **FAST))


def test_judge_drops_accepted_negatives(fake, tmp_path, capsys):
    mined = tmp_path / "mined.jsonl"
    rows = [
        {"query": "what is the capital of France?", "pos": ["Paris is the capital of France."],
         "neg": ["ANSWERS: the French capital is Paris.", "Lyon is a city in France.", "Berlin is in Germany."],
         "neg_scores": [0.9, 0.8, 0.7], "source": "q1"},
        {"query": "who wrote Hamlet?", "pos": ["Shakespeare wrote Hamlet."],
         "neg": ["Hamlet ANSWERS: it was written by William Shakespeare.", "Macbeth is a tragedy."]},
        {"query": "what is the capital of France?", "pos": ["Paris."], "neg": ["Lyon is a city in France."]},
    ]
    mined.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fake.script("Macbeth is a tragedy", *[{"content": "maybe?"}] * 3)   # undecided: kept
    out = tmp_path / "filtered.jsonl"
    args = ["judge", "--input", str(mined), "--out", str(out), "--base-url", fake.url, "--model", "fake-model",
            "--api-key-env", "JAXEMBED_TEST_KEY", "--timeout", "1", "--backoff", "0.01", "-q"]
    assert main(args) == 0
    assert "2 judged to answer the query and dropped" in capsys.readouterr().out
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert got[0]["neg"] == ["Lyon is a city in France.", "Berlin is in Germany."]
    assert got[0]["neg_scores"] == [0.8, 0.7] and got[0]["source"] == "q1" and got[0]["pos"] == rows[0]["pos"]
    assert got[1]["neg"] == ["Macbeth is a tragedy."] and got[2] == rows[2]
    rep = json.loads((tmp_path / "filtered.report.json").read_text())
    assert rep["counts"] == {"records": 3, "negatives": 6, "pairs_judged": 5, "accepted_dropped": 2,
                             "rejected_kept": 3, "undecided_kept": 1, "records_changed": 2, "records_written": 3}
    assert rep["undecided_reasons"] == {"invalid JSON": 1}
    assert rep["client"]["calls"] == 5 + 2 and fake.count() == 7     # one request per distinct pair (+2 retries)
    dropped = [json.loads(x) for x in (tmp_path / "filtered.dropped.jsonl").read_text().splitlines()]
    assert [d["line"] for d in dropped] == [1, 2]
    n = fake.count()
    assert main(args) == 0 and fake.count() == n                      # a rerun asks nothing
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"query": "q", "neg": "not a list"}) + "\n")
    assert main(["judge", "--input", str(bad), "--out", str(tmp_path / "b.jsonl"), "--base-url", fake.url,
                 "--model", "m", "-q"]) == 2
    assert "bad.jsonl:2: field 'neg': expected a list of non-empty strings" in capsys.readouterr().err
    assert fake.count() == n                                          # checked before any request


def test_judge_with_positive_and_on_undecided_drop(fake, tmp_path, capsys):
    """--with-positive shows each record's first positive to the judge (so the same (query, negative) under two
    different positives is asked twice); --on-undecided drop removes a negative whose verdict stayed malformed,
    lists it with the reason and counts it."""
    mined = tmp_path / "mined.jsonl"
    rows = [
        {"query": "capital of France?", "pos": ["Paris is the capital."], "neg": ["Lyon is in France.", "ANSWERS x"]},
        {"query": "capital of France?", "pos": ["The capital is Paris."], "neg": ["Lyon is in France."]},
        {"query": "who wrote Hamlet?", "pos": ["Shakespeare."], "neg": ["Macbeth is a tragedy.", "Othello."]},
    ]
    mined.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fake.script("Macbeth is a tragedy", *[{"content": "maybe?"}] * 3)   # never a valid verdict: undecided
    out = tmp_path / "judged.jsonl"
    common = ["--base-url", fake.url, "--model", "fake-model", "--api-key-env", "JAXEMBED_TEST_KEY", "--timeout",
              "1", "--backoff", "0.01", "-q"]
    assert main(["judge", "--input", str(mined), "--out", str(out), "--with-positive", "--on-undecided", "drop",
                 *common]) == 0
    capsys.readouterr()
    asked = [r["text"] for r in fake.log if "Lyon is in France." in r["text"]]
    assert len(asked) == 2  # one pair per (query, negative, positive shown)
    assert any("for reference: Paris is the capital." in t for t in asked)
    assert any("for reference: The capital is Paris." in t for t in asked)
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["neg"] for r in got] == [["Lyon is in France."], ["Lyon is in France."], ["Othello."]]
    rep = json.loads((tmp_path / "judged.report.json").read_text())
    assert rep["on_undecided"] == "drop"
    assert rep["counts"]["pairs_judged"] == 5 and rep["counts"]["accepted_dropped"] == 1
    assert rep["counts"]["undecided_dropped"] == 1 and "undecided_kept" not in rep["counts"]
    dropped = [json.loads(x) for x in (tmp_path / "judged.dropped.jsonl").read_text().splitlines()]
    assert {(d["line"], d["negative"]) for d in dropped} == {(1, "ANSWERS x"), (3, "Macbeth is a tragedy.")}
    assert [d["verdict"] for d in dropped if d["line"] == 3] == ["undecided: invalid JSON"]

    # without --with-positive, the two records share one question; the positive is never shown
    fake.reset_log()
    assert main(["judge", "--input", str(mined), "--out", str(tmp_path / "plain.jsonl"), *common]) == 0
    assert all("for reference" not in r["text"] for r in fake.log)
    assert json.loads((tmp_path / "plain.report.json").read_text())["counts"]["pairs_judged"] == 4


# ------------------------------------------------------------------------- several processes on one cache

_CACHE_WORKER = r"""
import json, os, sys, time
from jaxembed.synth.client import ResponseCache
path, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
open(f"{path}.ready-{who}", "w").close()
while not os.path.exists(f"{path}.go"):  # both processes start writing at the same moment
    time.sleep(0.001)
c, bad = ResponseCache(path), 0
for i in range(n):
    key = f"k{i}" if i % 2 == 0 else f"{who}{i}"   # even keys: both processes store them
    want = (key + ":") * 300
    c.put(key, {"content": want})
    r = c.get(key)
    bad += r is None or r["content"] != want
    if i % 50 == 0:
        ResponseCache(path).close()             # another open (a rerun starting) while the other process writes
c.close()
print(json.dumps({"bad": bad}))
"""


def test_two_processes_append_to_one_cache(tmp_path):
    """Two processes store answers in one cache file at once (half of the keys in common) and read each back:
    every answer is the right one (an offset recorded before another process's append would read that
    process's line back), each key is stored once (a key the other process stored is a hit), and every
    line is whole."""
    import subprocess
    import sys

    path = tmp_path / "responses.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", _CACHE_WORKER, str(path), who, "600"], stdout=subprocess.PIPE,
                              text=True) for who in "ab"]
    t0 = time.time()
    while not all(Path(f"{path}.ready-{who}").exists() for who in "ab"):
        assert time.time() - t0 < 120 and all(p.poll() is None for p in procs), "a worker did not start"
        time.sleep(0.005)
    Path(f"{path}.go").touch()
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [json.loads(o)["bad"] for o in outs] == [0, 0]
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.splitlines()]
    keys = [r["key"] for r in records]
    assert len(keys) == len(set(keys)) == 300 + 2 * 300
    assert all(r["response"]["content"] == (r["key"] + ":") * 300 for r in records)
    from jaxembed.synth.client import ResponseCache

    c = ResponseCache(path)
    assert len(c) == 900 and c.torn == 0
    c.close()


def test_two_synth_jobs_on_one_cache(fake, tmp_path):
    """Two `jaxembed synth personas` processes started together on one --cache: both finish, no answer is torn or
    lost (a third run asks nothing), and both write the same dataset (a key answered by both keeps one answer,
    which both use)."""
    import os
    import subprocess
    import sys

    personas, cache = _personas(tmp_path), tmp_path / "shared" / "responses.jsonl"
    jaxembed = str(Path(sys.executable).parent / "jaxembed")
    env = dict(os.environ, JAXEMBED_TEST_KEY="")
    args = [_job_args(fake, personas, tmp_path / f"out{i}", "--cache", str(cache), "--families", "short_long,sts")
            for i in range(2)]
    fake.fail_all = {"sleep": 0.2}  # every answer takes 0.2 s: the two jobs overlap
    procs = [subprocess.Popen([jaxembed, *a], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for a in args]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    fake.fail_all = None
    records = [json.loads(line) for line in cache.read_bytes().splitlines()]
    assert len(records) == len({r["key"] for r in records})  # whole lines, each key once
    data = [{p.relative_to(tmp_path / f"out{i}"): p.read_bytes() for p in (tmp_path / f"out{i}" / "data").rglob("*")
             if p.is_file()} for i in range(2)]
    assert data[0] and data[0] == data[1]
    fake.reset_log()
    assert main(args[0]) == 0
    assert fake.count() == 0  # every answer was in the cache
