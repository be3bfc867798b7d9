"""An in-memory store with the API of jaxembed.data.store.Store, for plan and loader tests."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class FakeInfo:
    name: str
    task: str
    task_type: str = "retrieval"
    size: int = 0
    query_instruction: str = ""
    doc_instruction: str = ""
    temperature: float | None = None
    batching: str = "random"
    num_negatives: int = 0
    weight: float | None = None  # None: 1.0 (as the real DatasetInfo)
    epochs: float | None = None  # None: one pass, or a share of the budget under weights / temperature sampling
    max_query_length: int = 32
    max_doc_length: int = 48
    source: str = "fake"


WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def _text(kind: str, d: int, i: int, j: int = 0) -> str:
    n = 2 + (i * 7 + j * 3 + d) % 9  # varied lengths
    words = [WORDS[(i + d * 5 + j * 11 + k) % len(WORDS)] for k in range(n)]
    return f"{kind} {d} {i} {j} " + " ".join(words)


class FakeStore:
    """Deterministic synthetic examples: example i of dataset d has 1 + i % 3 positives and (i % (n+2))
    negatives where n is the dataset's num_negatives (so some examples have fewer than num_negatives)."""

    def __init__(self, infos):
        self.datasets = list(infos)
        self.calls = 0

    def _index(self, name_or_index) -> int:
        if isinstance(name_or_index, str):
            for k, i in enumerate(self.datasets):
                if i.name == name_or_index:
                    return k
            raise KeyError(name_or_index)
        return int(name_or_index)

    def dataset(self, name_or_index):
        return self.datasets[self._index(name_or_index)]

    def size(self, name_or_index) -> int:
        return self.dataset(name_or_index).size

    def example(self, dataset, index: int) -> dict:
        d = self._index(dataset)
        info = self.datasets[d]
        i = int(index)
        if not 0 <= i < info.size:
            raise IndexError(i)
        self.calls += 1
        nneg = i % (info.num_negatives + 2)
        return {"id": f"{info.name}-{i}", "query": _text("q", d, i),
                "pos": [_text("p", d, i, j) for j in range(1 + i % 3)],
                "neg": [_text("n", d, i, j) for j in range(nneg)]}

    def examples(self, dataset, indices) -> list[dict]:
        return [self.example(dataset, i) for i in indices]


def make_store(spec) -> FakeStore:
    """spec: list of (name, task, size, dict of other fields)."""
    return FakeStore([FakeInfo(name=n, task=t, size=s, **kw) for n, t, s, kw in spec])


def mixed_store() -> FakeStore:
    """Three datasets of three task types and batchings, with instructions, negatives and a short max length: the
    loader's and the packer's mixed case."""
    return make_store([
        ("ra", "ret", 64, dict(batching="homogeneous", num_negatives=3,
                               query_instruction="Instruct: find the passage \n Query: ", doc_instruction="passage: ")),
        ("ca", "cls", 48, dict(batching="heterogeneous", num_negatives=1, max_query_length=20)),
        ("sa", "sts", 56, dict(batching="random", num_negatives=0)),
    ])


_REAL: dict = {}


def real_store_dir(tmp_path_factory):
    """The shared training data prepared once per test session with the real store writer
    (``write_store(shared_train_config(data_dir), out)``); skips when the shared data is missing."""
    import os

    import pytest

    from jaxembed import paths

    if "dir" not in _REAL:
        d = paths.shared_data_dir()
        if not (d / "train").is_dir():
            if os.environ.get("JAXEMBED_REQUIRE_SHARED_DATA") == "1":
                pytest.fail(f"shared data folder {d} is missing")
            pytest.skip(f"shared data folder {d} is missing (set JAXEMBED_DATA)")
        from jaxembed.data.shared_train import shared_train_config
        from jaxembed.data.store import write_store

        out = tmp_path_factory.mktemp("real_store") / "store"
        write_store(shared_train_config(d), out)
        _REAL["dir"] = out
    return _REAL["dir"]


def run_data_cli(argv) -> int:
    """`jaxembed data ...` in-process; a user error is printed to stdout as the CLI's one line, status 2."""
    import argparse

    from jaxembed.data.cli import add_parsers
    from jaxembed.errors import UserError

    parser = argparse.ArgumentParser(prog="jaxembed")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"error: {e}")
        return 2
