"""A window of the step table computed by the processes of a pod together (jaxembed.data.step_table): each process
tokenises its share of the window's rows, the processes exchange the token lengths (jaxembed.pod.exchange), and
every process builds the table one process computes alone; the cache holds one small file per window.

The pod is simulated in one process: P threads, each a process of its own (a thread-local process index), their
exchanges through a shared dictionary; once for real: two processes joined by jax.distributed, each walking the
windows from a thread (as the loader's prefetch does), get the one-process shapes, each tokenising half the texts."""

import json
import sys
import threading

import numpy as np
import pytest

from data_fakes import mixed_store
from jaxembed import pod
from jaxembed.data import pipeline as P
from jaxembed.data import step_table as T
from jaxembed.data.plan import build_plan
from jaxembed.errors import UserError
from jaxembed.tokenizer import Tokenizer

W = 4  # steps per window: the plans below have several


@pytest.fixture(scope="module")
def tok(minilm_dir):
    return Tokenizer.from_folder(minilm_dir)


@pytest.fixture(scope="module")
def plan():
    store = mixed_store()
    p = build_plan(store, {"global_batch_size": 8, "seed": 1})
    assert p.steps > 2 * W
    return store, p


class FakePod:
    """P processes as threads: ``exchange`` waits for every thread's value of a name; ``forget`` removes one's."""

    def __init__(self, count: int):
        self.count, self.local, self.values, self.cv = count, threading.local(), {}, threading.Condition()
        self.texts = [0] * count  # texts each process tokenised

    def index(self) -> int:
        return getattr(self.local, "i", 0)

    def exchange(self, name, fn, stopped=None):
        value = fn()
        with self.cv:
            assert (name, self.index()) not in self.values, f"{name} exchanged twice"
            self.values[name, self.index()] = value
            self.cv.notify_all()
            assert self.cv.wait_for(lambda: all((name, j) in self.values for j in range(self.count)), timeout=60), name
            return [self.values[name, j] for j in range(self.count)]

    def forget(self, name):
        with self.cv:
            self.values.pop((name, self.index()), None)

    def run(self, work):
        """work(i) on P threads, one per process; -> their results in process order."""
        out, errors = [None] * self.count, []

        def go(i):
            self.local.i = i
            try:
                out[i] = work(i)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(self.count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        if errors:
            raise errors[0]
        return out


def _install(monkeypatch, tok, count):
    fake = FakePod(count)
    monkeypatch.setattr(pod, "process_count", lambda: count)
    monkeypatch.setattr(pod, "process_index", fake.index)
    monkeypatch.setattr(pod, "exchange", fake.exchange)
    monkeypatch.setattr(pod, "forget", fake.forget)
    real = tok.tokenize

    def counted(texts, *a, **k):
        if hasattr(fake.local, "i"):  # a simulated process's (not the set-up's prompt lengths)
            fake.texts[fake.index()] += len(texts)
        return real(texts, *a, **k)

    monkeypatch.setattr(tok, "tokenize", counted)
    return fake


def _tables(store, plan, tok, count, packing, **kw):
    """One StepTable per simulated process, made as each process makes it (the same names on every one)."""
    out, before = [], dict(T._instances)
    for _ in range(count):
        T._instances.clear()
        T._instances.update(before)
        out.append(T.StepTable(store, plan, tok, packing=packing, num_candidates=4, window=W, **kw))
    return out


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("packed", [True, False])
def test_a_pod_builds_the_table_of_one_process_each_tokenising_its_share(plan, tok, monkeypatch, packed):
    store, p = plan
    packing = P.Packing(shards=4, min_row_length=16) if packed else None
    alone = T.StepTable(store, p, tok, packing=packing, num_candidates=4, window=W)
    n = alone.windows
    single = [alone.window(w) for w in range(n)]
    for count in (2, 3):  # 3: shares of unequal size (32 rows a window)
        fake = _install(monkeypatch, tok, count)
        tables = _tables(store, p, tok, count, packing)
        # every process walks the windows in order (the loader), from window 1 (a resumed run)
        got = fake.run(lambda i: [tables[i].window(w) for w in range(1, n)])
        for per_process in got:
            for w, t in enumerate(per_process, start=1):
                _assert_same(t, single[w])
        for table in tables:
            assert [table.shape(s) for s in range(W, p.steps)] == [alone.shape(s) for s in range(W, p.steps)]
        # each process tokenised about 1/P of the texts (a share's distinct texts: a little more than 1/P)
        total = sum(fake.texts)
        assert all(x <= total / count * 1.3 for x in fake.texts), fake.texts
        # every value was removed once all had read it, but the last window's
        assert {name.rsplit("/", 2)[-2] for name, _ in fake.values} == {str(n - 1)}, sorted(fake.values)
        monkeypatch.undo()


def test_a_pod_reads_cached_windows_only_when_every_process_can(plan, tok, monkeypatch, tmp_path):
    store, p = plan
    cache = tmp_path / "plan_lengths.npz"
    fake = _install(monkeypatch, tok, 2)
    tables = _tables(store, p, tok, 2, None, cache=cache)
    tables[1].write = False  # process 0 writes the cache
    first = fake.run(lambda i: [tables[i].window(w) for w in range(2)])
    assert fake.texts[0] > 0 and fake.texts[1] > 0
    fake.texts[:] = [0, 0]
    again = _tables(store, p, tok, 2, None, cache=cache)  # a restart: every process reads windows 0 and 1
    second = fake.run(lambda i: [again[i].window(w) for w in range(2)])
    assert fake.texts == [0, 0]
    for a, b in zip(first, second):
        for x, y in zip(a, b):
            _assert_same(x, y)


def test_the_cache_writes_one_small_file_per_window(plan, tok, tmp_path, monkeypatch):
    store, p = plan
    cache = tmp_path / "plan_lengths.npz"
    packing = P.Packing(shards=2, min_row_length=16)
    table = T.StepTable(store, p, tok, packing=packing, num_candidates=4, window=W, cache=cache)
    for w in range(table.windows):
        table.window(w)
    files = sorted((tmp_path / "plan_lengths.windows").iterdir())
    assert [f.name for f in files] == [f"{w:07d}.npz" for w in range(table.windows)]
    sizes = [f.stat().st_size for f in files]
    assert max(sizes) <= min(sizes) + 512, sizes  # a window's bytes, whatever its place in the plan
    with np.load(files[-1]) as z:
        assert all(len(z[k]) == table.steps_of(table.windows - 1)[1] - table.steps_of(table.windows - 1)[0]
                   for k in z.files if k not in ("key", "window"))
    monkeypatch.setattr(T, "step_pack_table", lambda *a, **k: pytest.fail("a cached window was recomputed"))
    again = T.StepTable(store, p, tok, packing=packing, num_candidates=4, window=W, cache=cache)
    assert [again.shape(s) for s in range(p.steps)] == [table.shape(s) for s in range(p.steps)]
    assert not T.StepTable(store, p, tok, packing=packing, num_candidates=4, window=2, cache=cache).cached(1)


def test_lengths_travel_compactly():
    x = np.array([-1, 0, 5, 511, 65534], np.int64)
    text = T.encode_lengths(x)
    assert text[0] == "h" and np.array_equal(T.decode_lengths(text), x)
    big = np.array([-1, 70000])
    assert np.array_equal(T.decode_lengths(T.encode_lengths(big)), big)
    window = np.random.default_rng(0).integers(5, 120, 16384 * 3)  # a whole window of 16,384 rows, K = 2
    assert len(T.encode_lengths(window)) < 100_000


class FakeClient:
    def __init__(self, stored):
        self.stored = stored

    def key_value_set(self, key, value):
        self.stored[key] = value

    def blocking_key_value_get(self, key, ms):
        if key not in self.stored:
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key} and duration: {ms}ms")
        return self.stored[key]

    def key_value_delete(self, key):
        del self.stored[key]


def test_exchange_returns_every_value_or_the_first_error(monkeypatch):
    stored = {"jaxembed/a/1": "b-value", "jaxembed/e/1": "error:bad record in x.jsonl"}
    monkeypatch.setattr(pod, "_client", lambda: FakeClient(stored))
    monkeypatch.setattr(pod, "process_count", lambda: 2)
    monkeypatch.setattr(pod, "process_index", lambda: 0)
    assert pod.exchange("a", lambda: "a-value") == ["a-value", "b-value"]
    pod.forget("a")
    pod.forget("a")  # gone already: nothing
    assert "jaxembed/a/0" not in stored and "jaxembed/a/1" in stored
    with pytest.raises(UserError, match="process 1: bad record in x.jsonl"):
        pod.exchange("e", lambda: "fine")

    def fails():
        raise UserError("my error")

    stored["jaxembed/f/1"] = "ok"
    with pytest.raises(UserError, match="my error"):
        pod.exchange("f", fails)
    assert stored["jaxembed/f/0"] == "error:my error"  # the others stop with it


# one process of a real pod (jax.distributed on CPU): walks the windows from a thread, as the loader's prefetch does
POD_PROCESS = r"""
import json, sys, threading
import jax
coord, count, index, tok_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
jax.distributed.initialize(coord, count, index)
from data_fakes import mixed_store
from jaxembed.data import pipeline as P
from jaxembed.data import step_table as T
from jaxembed.data.plan import build_plan
from jaxembed.tokenizer import Tokenizer
store, tok = mixed_store(), Tokenizer.from_folder(tok_dir)
plan = build_plan(store, {"global_batch_size": 8, "seed": 1})
table = T.StepTable(store, plan, tok, packing=P.Packing(shards=2, min_row_length=16), num_candidates=4, window=4)
texts, real = [0], tok.tokenize
tok.tokenize = lambda batch, *a, **k: (texts.__setitem__(0, texts[0] + len(batch)), real(batch, *a, **k))[1]
shapes = []
walk = threading.Thread(target=lambda: shapes.extend(table.shape(s) for s in range(plan.steps)))
walk.start()
walk.join()
print(json.dumps({"shapes": shapes, "texts": texts[0]}))
"""


def test_two_real_processes_share_each_window(plan, tok, minilm_dir, tmp_path):
    import runs

    store, p = plan
    alone = T.StepTable(store, p, tok, packing=P.Packing(shards=2, min_row_length=16), num_candidates=4, window=W)
    coord = f"127.0.0.1:{runs.free_port()}"
    procs = [runs.Proc([sys.executable, "-c", POD_PROCESS, coord, "2", str(i), str(minilm_dir)],
                       runs.env(1, JAX_PLATFORMS="cpu"), tmp_path / f"p{i}.log") for i in range(2)]
    outs = [json.loads(x.strip().splitlines()[-1]) for x in runs.wait_all(procs, timeout=240)]
    expected = [list(alone.shape(s)) for s in range(p.steps)]
    assert outs[0]["shapes"] == outs[1]["shapes"] == expected
    assert all(0 < o["texts"] < 0.65 * (outs[0]["texts"] + outs[1]["texts"]) for o in outs), outs


def test_a_closed_loader_stops_waiting_for_the_others(plan, tok, monkeypatch):
    """A process whose run ends (its loader closed) gives up a window the others will never send, so its prefetch
    thread never holds up the process's exit."""
    store, p = plan
    monkeypatch.setattr(pod, "_client", lambda: FakeClient({}))  # process 1 never answers
    monkeypatch.setattr(pod, "process_count", lambda: 2)
    monkeypatch.setattr(pod, "process_index", lambda: 0)
    monkeypatch.setattr(pod, "POLL_S", 0.01)
    table = T.StepTable(store, p, tok, num_candidates=4, window=W)
    loader = P.make_loader(store, p, tok, num_candidates=4, step_table=table)
    failed = []
    walk = threading.Thread(target=lambda: failed.append(pytest.raises(UserError, table.window, 1)))
    walk.start()
    loader.close()
    walk.join(10)
    assert not walk.is_alive() and "stopped waiting for process 1" in str(failed[0].value)
