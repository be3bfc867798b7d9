"""FlagEmbedding's data options are honoured or refused in one line, never ignored: a record of type
``only_1neg`` (one hard negative per query) trains with num_negatives=1 and is refused with more; a data folder
marked ``no_in_batch_neg`` (no in-batch negatives), which jaxembed cannot train that way, is refused."""

from __future__ import annotations

import json

import pytest

from jaxembed.errors import UserError


def _data_config(path, **kw):
    from jaxembed.data.config import dataset_config, default_data_config

    c = default_data_config()
    c.datasets = [dataset_config(name="fe", path=str(path), **kw)]
    return c


def _fe_file(path, kind):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}a", f"n{i}b", f"n{i}c"], "type": kind}
            for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_only_1neg_trains_one_negative_and_refuses_more(tmp_path):
    from jaxembed.data.store import Store, write_store

    data = _fe_file(tmp_path / "fe.jsonl", "only_1neg")
    write_store(_data_config(data, num_negatives=1), tmp_path / "store")
    (info,) = Store.open(tmp_path / "store").datasets
    assert info.task_type == "retrieval" and int(info.num_negatives) == 1
    for task_type in (None, "retrieval"):  # whether or not the type field gives the task type
        with pytest.raises(UserError) as e:
            write_store(_data_config(data, num_negatives=3, task_type=task_type), tmp_path / "store3")
        assert str(e.value).startswith(f"{data}:1: field 'type': 'only_1neg' (FlagEmbedding: the query is trained "
                                       "with one hard negative) but the dataset's num_negatives is 3 (fix: set "
                                       "num_negatives=1 for this dataset"), str(e.value)
        assert "\n" not in str(e.value) and not (tmp_path / "store3").exists()


def test_a_no_in_batch_neg_folder_is_refused(tmp_path):
    from jaxembed.data.store import write_store

    data = _fe_file(tmp_path / "classification-no_in_batch_neg" / "train.jsonl", "symmetric_class")
    with pytest.raises(UserError, match=r"classification-no_in_batch_neg/train\.jsonl: 'no_in_batch_neg' in the "
                                        r"name turns off in-batch negatives in FlagEmbedding; .* \(fix: rename"):
        write_store(_data_config(data, num_negatives=1), tmp_path / "store")
    assert not (tmp_path / "store").exists()
