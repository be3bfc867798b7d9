"""The store's readers: the options the loader's reader opens a dataset's ArrayRecord file with (the chunk index in
memory, no readahead: ``benchmarks/store_reader.py`` measured the choice), and that it reads the records written."""

import json

from array_record.python import array_record_module

from jaxembed.data import config as dc
from jaxembed.data.store import READER_OPTIONS, Store, write_store


def test_the_training_reader_keeps_the_chunk_index_in_memory_and_reads_the_records(tmp_path, monkeypatch):
    rows = [{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}"]} for i in range(40)]  # 3 chunks of 16
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = dc.default_data_config()
    cfg.datasets = [dc.dataset_config(name="tri", path=str(src), task_type="retrieval", num_negatives=1)]
    write_store(cfg, tmp_path / "store", progress=False)
    opened = []
    real = array_record_module.ArrayRecordReader

    def reader(path, options=""):
        opened.append(options)
        return real(path, options)

    monkeypatch.setattr(array_record_module, "ArrayRecordReader", reader)
    store = Store.open(tmp_path / "store")  # as jaxembed train opens it (jaxembed.train.run.prepare_store)
    idx = [39, 0, 17, 17, 5, 32]
    got = store.examples("tri", idx)
    assert opened == [READER_OPTIONS]
    assert set(READER_OPTIONS.split(",")) == {"readahead_buffer_size:0", "index_storage_option:in_memory"}
    plain = real(str(store.record_path("tri")))  # ArrayRecord's defaults
    try:
        assert got == [Store.decode(r) for r in plain.read(idx)]
    finally:
        plain.close()
        store.close()
    assert [g["query"] for g in got] == [rows[i]["query"] for i in idx]
