"""FlagEmbedding's data options are honoured or said, never silently ignored: a record of type ``only_1neg``
trains with one hard negative, whatever the dataset's num_negatives (FlagEmbedding's group of 2); a data folder
marked ``no_in_batch_neg`` (no in-batch negatives), which jaxembed cannot train that way, is named in one warning
line saying that its data trains with in-batch negatives (FlagEmbedding's own example data uses such folders)."""

from __future__ import annotations

import json
import logging


def _data_config(path, **kw):
    from jaxembed.data.config import dataset_config, default_data_config

    c = default_data_config()
    c.datasets = [dataset_config(name="fe", path=str(path), **kw)]
    return c


def _fe_file(path, kind):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}a", f"n{i}b", f"n{i}c"], "type": kind,
             "neg_scores": [0.3, 0.2, 0.1]} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _examples(path, **kw):
    from jaxembed.data.readers import read_dataset
    from jaxembed.data.parsers import Skip

    return [x for x in read_dataset(_data_config(path, **kw).datasets[0]) if not isinstance(x, Skip)]


def test_only_1neg_trains_one_negative(tmp_path):
    only = _examples(_fe_file(tmp_path / "only.jsonl", "only_1neg"), num_negatives=3)
    assert [x["neg"] for x in only] == [[f"n{i}a"] for i in range(4)]
    assert all(x["neg_scores"] == [0.3] for x in only)
    normal = _examples(_fe_file(tmp_path / "normal.jsonl", "normal"), num_negatives=3)
    assert [len(x["neg"]) for x in normal] == [3] * 4  # other types keep every negative


def test_a_no_in_batch_neg_folder_is_named_in_one_warning(tmp_path, caplog):
    from jaxembed.data.store import write_store

    data = _fe_file(tmp_path / "classification-no_in_batch_neg" / "train.jsonl", "symmetric_class")
    with caplog.at_level(logging.WARNING, logger="jaxembed.data.readers"):
        write_store(_data_config(data, num_negatives=1), tmp_path / "store")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "jaxembed.data.readers"]
    assert line == (f"{data}: 'no_in_batch_neg' in the path turns off in-batch negatives in FlagEmbedding; jaxembed "
                    "keeps them (every query is contrasted with all the candidates of its batch), so dataset 'fe' "
                    "trains with them")
    assert (tmp_path / "store" / "manifest.json").is_file()
