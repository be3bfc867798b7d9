"""Bad input, one class at a time: each gives ONE line naming file, line, field and fix (no traceback), under
on_error='skip' the record is counted by its reason and the good records are kept; outputs are checked before any
work. Pure-Python paths only (no model is loaded): the whole file runs in a few seconds."""

from __future__ import annotations

import bz2
import gzip
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from data_fakes import run_data_cli
from jaxembed.data import config as dc
from jaxembed.data import jsonl
from jaxembed.data.readers import ReadOptions, Tally, apply_policy, read_jsonl
from jaxembed.errors import InputError, UserError

GOOD = '{"query": "q", "pos": ["p"], "neg": ["n"]}'


def _write(path: Path, lines) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def _read(path, on_error="stop", **opts):
    tally = Tally("t")
    return list(apply_policy(read_jsonl(str(path), ReadOptions(**opts)), on_error, tally)), tally


def _one_line(msg: str) -> str:
    assert "\n" not in msg.strip() and "Traceback" not in msg, msg
    return msg.strip()


# --------------------------------------------------------------------------------------- one record, one class

#: (id, format, record line (bytes or str), field, message regex). The bad record is line 2, after a good one.
BAD_LINES = [
    ("deep_nesting", "auto", "[" * 100_000, None, r"invalid JSON \(nested too deeply to parse"),
    ("huge_integer", "auto", '{"query": "q", "pos": ["p"], "id": ' + "9" * 5000 + "}", None,
     r"invalid JSON \(an integer of more than \d+ digits\)"),
    ("duplicate_key", "auto", '{"query": "q", "pos": ["p"], "pos": ["other"]}', "pos",
     r"appears twice in the record"),
    ("duplicate_key_nested", "auto", '{"query": "q", "pos": ["p"], "id": "x", "neg": [], "x": {"a": 1, "a": 2}}',
     "a", r"appears twice in the record"),
    ("unknown_key_typo", "auto", '{"query": "q", "pos": ["p"], "negs": ["n"]}', "negs",
     r"unknown key \(did you mean 'neg'\?\)"),
    ("unknown_key_other", "auto", '{"query": "q", "pos": ["p"], "source": "x"}', "source",
     r"unknown key \(a triplets record has: category, id, label, neg, neg_scores, pos, pos_scores, prompt, query, "
     r"type\)"),
    ("missing_key_typo", "triplets", '{"qurey": "q", "pos": ["p"]}', "query",
     r"missing \(keys present: pos, qurey\) \(fix: rename 'qurey' to 'query'"),
    ("nan_text", "auto", '{"query": NaN, "pos": ["p"]}', "query",
     r"expected a string, got NaN \(a NaN / Infinity literal, which is not standard JSON\)"),
    ("infinity_in_list", "auto", '{"query": "q", "pos": [Infinity]}', "pos[0]",
     r"expected a string, got Infinity"),
    ("label_float", "classification", '{"text": "t", "label": 2.5}', "label",
     r"expected a string \(or an integer\) label, got float"),
]


@pytest.mark.parametrize("case", BAD_LINES, ids=[c[0] for c in BAD_LINES])
def test_bad_record_is_one_line_and_counted(tmp_path, case):
    _, fmt, line, field, match = case
    first = GOOD if fmt != "classification" else '{"text": "a", "label": "x"}'
    p = _write(tmp_path / "bad.jsonl", [first, line, first.replace('"q"', '"r"').replace('"a"', '"b"')])
    with pytest.raises(InputError) as ei:
        _read(p, format=fmt)
    msg = _one_line(str(ei.value))
    assert (ei.value.path, ei.value.line, ei.value.field) == (str(p), 2, field), msg
    assert msg.startswith(f"{p}:2: " + (f"field '{field}': " if field else "")) and "(fix: " in msg, msg
    assert re.search(match, msg), msg
    exs, tally = _read(p, on_error="skip", format=fmt)  # skip: the good records stay, the bad one is counted
    assert len(exs) == 2 and tally.read == 3 and tally.invalid == 1
    ((reason, n),) = tally.reasons().items()  # counted by its reason (without the details in parentheses)
    assert n == 1 and reason == msg[len(f"{p}:2: "):].split(" (")[0], (reason, msg)


def test_duplicate_key_check_has_no_false_alarms():
    """The fast path (a key count) falls back to the checking parser whenever it cannot be sure."""
    for line in ['{"query": "he said \\"no\\": fine", "pos": ["a \\" : b"]}', '{"a" :1, "b":{"c": 2, "d": [{"e": 3}]}}',
                 '{"a\\u0022": 1, "b": "x\\":"}', '{"query": "q", "pos": ["p"]}']:
        assert isinstance(jsonl.parse_object(line), dict), line
        assert jsonl.parse_object(line) == json.loads(line)
    for line in ['{"a": 1, "a": 1}', '{"a": 1, "b": {"c": 2, "c": 3}}', '{"a": "\\":", "a": 2}',
                 '[{"a": 1, "a": 2}]']:
        bad = jsonl.parse_object(line)
        assert isinstance(bad, jsonl.BadLine) and "appears twice" in bad.reason, line


def test_deep_nesting_and_huge_integer_in_data_validate_and_prepare(tmp_path, capsys):
    """Deep nesting and a huge integer in a record: `data validate` and `prepare` (on_error skip and stop) end with
    a line, not a traceback."""
    deep = _write(tmp_path / "deep.jsonl", [GOOD, "[" * 100_000])
    big = _write(tmp_path / "big.jsonl", [GOOD, '{"query": "q", "pos": ["p"], "id": ' + "9" * 5000 + "}"])
    assert run_data_cli(["data", "validate", str(deep), str(big)]) == 1
    out = capsys.readouterr().out
    assert f"{deep}:2: invalid JSON (nested too deeply" in out and f"{big}:2: invalid JSON (an integer of" in out
    for on_error in ("skip", "stop"):
        cfg = _config_file(tmp_path, [deep, big], on_error=on_error)
        rc = run_data_cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / f"s_{on_error}"), "-q"])
        out = capsys.readouterr().out
        if on_error == "skip":
            assert rc == 0 and "2 invalid skipped" in out, out
            rep = json.loads((tmp_path / "s_skip" / "report.json").read_text())
            assert [d["reasons"] for d in rep["datasets"]] == [{"invalid JSON": 1}, {"invalid JSON": 1}]
        else:
            assert rc == 2 and _one_line(out).startswith(f"error: {deep}:2: invalid JSON (nested too deeply"), out


def _config_file(tmp_path, paths, on_error="stop", **ds_kw) -> Path:
    entries = [dict(dict(name=f"d{i}", path=str(p), task_type="retrieval"), **ds_kw) for i, p in enumerate(paths)]
    f = tmp_path / f"cfg_{on_error}.py"
    f.write_text("from jaxembed.data.config import dataset_config, default_data_config\n\n"
                 "def get_config(arg=None):\n"
                 "    c = default_data_config()\n"
                 f"    c.on_error = {on_error!r}\n"
                 f"    c.datasets = [dataset_config(**e) for e in {entries!r}]\n"
                 "    return c\n")
    return f


def test_huge_line_is_skipped_without_reading_it(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1000)
    p = _write(tmp_path / "big.jsonl", [GOOD, '{"query": "' + "x" * 5000 + '", "pos": ["p"]}',
                                        GOOD.replace('"q"', '"r"')])
    with pytest.raises(InputError, match=r"big\.jsonl:2: line of 5,0\d\d bytes is longer than the limit of 1,000 "
                                         r"bytes \(fix: one record per line"):
        _read(p)
    exs, tally = _read(p, on_error="skip")
    assert [e["query"] for e in exs] == ["q", "r"] and tally.reasons() == {
        f"line of {len(p.read_bytes().splitlines()[1]) + 1:,} bytes is longer than the limit of 1,000 bytes": 1}


def test_json_document_instead_of_json_lines(tmp_path):
    p = tmp_path / "doc.json"
    p.write_text(json.dumps([{"query": "q", "pos": ["p"]}], indent=2))
    with pytest.raises(InputError, match=r"doc\.json:1: invalid JSON .*: the file looks like one JSON document, not "
                                         r"JSON Lines \(fix: write one object per line, e\.g\. jq -c"):
        _read(p)


# ----------------------------------------------------------------------------------------------- whole files

def test_empty_file_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for on_error in ("stop", "skip"):
        with pytest.raises(InputError, match=r"empty\.jsonl: empty file: no records \(fix: check the file"):
            _read(empty, on_error=on_error)
    good = _write(tmp_path / "good.jsonl", [GOOD])
    with pytest.raises(InputError, match=r"empty\.jsonl: empty file"):  # also as the second file of a dataset
        list(read_jsonl([str(good), str(empty)]))
    assert run_data_cli(["data", "validate", str(empty)]) == 1
    assert f"cannot read the file: {empty}: empty file: no records" in capsys.readouterr().out


def test_identical_records_are_counted(tmp_path, capsys):
    p = _write(tmp_path / "dup.jsonl", [GOOD, '{"query": "other", "pos": ["p"]}', GOOD,
                                        '{"id": "x", "query": "q", "pos": ["p"], "neg": ["n"]}'])
    exs, tally = _read(p, name="dup")
    assert len(exs) == 4 and tally.identical == 2  # kept, counted
    assert tally.identical_examples == [("dup:3", "dup:1"), ("x", "dup:1")]
    assert tally.to_dict()["identical"] == 2
    assert run_data_cli(["data", "validate", str(p)]) == 0
    assert "4 valid, 0 invalid; 2 identical to an earlier record" in capsys.readouterr().out
    cfg = _config_file(tmp_path, [p])
    assert run_data_cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "store")]) == 0
    assert "note: d0: 2 of 4 examples are identical to an earlier one" in capsys.readouterr().out


@pytest.mark.parametrize("opener,suffix", [(gzip.open, ".jsonl.gz"), (bz2.open, ".jsonl.bz2")])
def test_compressed_files_are_read(tmp_path, opener, suffix, capsys):
    p = tmp_path / f"t{suffix}"
    with opener(p, "wb") as f:
        f.write((GOOD + "\n" + '{"query": "r", "pos": ["p"]}\n').encode())
    exs, _ = _read(p)
    assert [e["query"] for e in exs] == ["q", "r"]
    assert run_data_cli(["data", "validate", str(p)]) == 0
    t = tmp_path / f"texts{suffix}"
    with opener(t, "wb") as f:
        f.write(b'{"text": "a"}\n{"text": "b"}\n')
    assert jsonl.read_texts(str(t)) == ["a", "b"]  # encode --input: .jsonl.gz is JSON Lines


def test_truncated_gzip_zstd_and_utf16_are_clear_errors(tmp_path):
    p = tmp_path / "t.jsonl.gz"
    data = gzip.compress(("".join(GOOD.replace('"q"', f'"q{i}"') + "\n" for i in range(2000))).encode())
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"t\.jsonl\.gz:\d+: the compressed file is truncated or corrupt .*\(fix: "
                                         r"download or compress the file again\)"):
        _read(p)
    z = tmp_path / "t.jsonl.zst"
    z.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 20)
    with pytest.raises(InputError, match=r"t\.jsonl\.zst: is zstd-compressed \(fix: decompress it first"):
        _read(z)
    u = tmp_path / "excel.jsonl"
    u.write_bytes((GOOD + "\n").encode("utf-16"))  # with its byte-order mark
    with pytest.raises(InputError, match=r"excel\.jsonl: is UTF-16 \(little-endian byte-order mark\), not UTF-8 "
                                         r"\(fix: re-encode it: iconv -f utf-16 -t utf-8"):
        _read(u, on_error="skip")  # a whole-file problem: not one skipped record per line


def test_encode_input_bom_crlf_and_bad_bytes_name_the_line(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_bytes(b'\xef\xbb\xbf{"text": "a"}\r\n{"text": "b"}\r\n')
    assert jsonl.read_texts(str(p)) == ["a", "b"]  # the byte-order mark is not a JSON error
    t = tmp_path / "in.txt"
    t.write_bytes(b"\xef\xbb\xbfone\r\ntwo\rstill two\n")
    assert jsonl.read_texts(str(t)) == ["one", "two\rstill two"]  # a line ends at \n only (as wc -l counts)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\ncaf\xe9\n")
    with pytest.raises(InputError, match=r"bad\.txt:2: not valid UTF-8 \(unexpected end of data at byte 3 of the "
                                         r"line\) \(fix: re-encode"):
        jsonl.read_texts(str(bad))


# ---------------------------------------------------------------------------------------------- extra fields

def test_extra_fields_are_declared_in_the_dataset_config(tmp_path, capsys):
    p = _write(tmp_path / "t.jsonl", ['{"text": "a", "label": "x", "fine_label": "x1"}',
                                      '{"text": "b", "label": "y", "fine_label": "y1"}'])
    with pytest.raises(InputError, match=r"t\.jsonl:1: field 'fine_label': unknown key \(did you mean 'label'\?\) "
                                         r"\(fix: rename it to 'label', or list it in extra_fields"):
        _read(p)
    exs, _ = _read(p, extra_fields=frozenset({"fine_label"}))
    assert [e["label"] for e in exs] == ["x", "y"]
    assert run_data_cli(["data", "validate", str(p)]) == 1
    assert run_data_cli(["data", "validate", str(p), "--extra-field", "fine_label"]) == 0
    capsys.readouterr()
    c = dc.default_data_config()
    c.datasets = [dc.dataset_config(name="t", path=str(p), format="classification", task_type="classification",
                                    extra_fields="fine_label")]
    with pytest.raises(UserError, match=r"data\.datasets\[0\]\.extra_fields: expected a list of record keys"):
        dc.validate_data_config(c, where="data")


# -------------------------------------------------------------------------------------------- config checks

def _two(tmp_path, **b):
    p = _write(tmp_path / "t.jsonl", [GOOD])
    c = dc.default_data_config()
    c.datasets = [dc.dataset_config(name="a", path=str(p), task="shared", task_type="retrieval"),
                  dc.dataset_config(**dict(dict(name="b", path=str(p), task="shared", task_type="retrieval"), **b))]
    return c


def test_one_task_type_per_task(tmp_path):
    dc.validate_data_config(_two(tmp_path), where="data")
    with pytest.raises(UserError, match=r"^data\.datasets\[1\]\.task_type: dataset 'b' is 'clustering' but dataset "
                                        r"'a' \(data\.datasets\[0\]\) of the same task 'shared' is 'retrieval'; .* "
                                        r"\(fix: give 'b' its own task name"):
        dc.validate_data_config(_two(tmp_path, task_type="clustering"), where="data")


def test_task_types_from_the_records_must_agree_too(tmp_path):
    from jaxembed.data.store import write_store

    a = _write(tmp_path / "a.jsonl", ['{"query": "q", "pos": ["p"], "type": "normal"}'])
    b = _write(tmp_path / "b.jsonl", ['{"query": "q", "pos": ["p"], "type": "symmetric_clustering"}'])
    c = dc.default_data_config()
    c.datasets = [dc.dataset_config(name="a", path=str(a), task="t"),
                  dc.dataset_config(name="b", path=str(b), task="t")]
    with pytest.raises(UserError, match=r"data\.datasets\[1\]\.task_type: dataset 'b' is 'clustering' but dataset "
                                        r"'a'"):
        write_store(c, tmp_path / "store")
    assert not (tmp_path / "store").exists()


def test_data_seed_is_validated(tmp_path):
    c = _two(tmp_path)
    c.seed = -1
    with pytest.raises(UserError, match=r"^data\.seed: -1 must be an integer >= 0 \(fix: e\.g\. seed=0\)$"):
        dc.validate_data_config(c, where="data")


def test_plan_build_refuses_a_bad_inherited_seed():
    from jaxembed.data.plan import build_plan
    from data_fakes import FakeInfo, FakeStore

    store = FakeStore([FakeInfo("a", "a", size=16)])
    with pytest.raises(UserError, match=r"the data config: seed -1 must be an integer >= 0 \(fix: "):
        build_plan(store, {"global_batch_size": 4}, data_config={"seed": -1})
    store.manifest = {"seed": -1}
    with pytest.raises(UserError, match=r"manifest\.json: seed -1 must be an integer >= 0"):
        build_plan(store, {"global_batch_size": 4})


def test_unknown_dataset_key_names_the_config_file_and_line(tmp_path, capsys):
    p = _write(tmp_path / "t.jsonl", [GOOD])
    cfg = tmp_path / "my_data.py"
    cfg.write_text("from jaxembed.data.config import dataset_config, default_data_config\n\n"
                   "def get_config(arg=None):\n"
                   "    c = default_data_config()\n"
                   f"    c.datasets = [dataset_config(name='a', path={str(p)!r}, task_type='retrieval',\n"
                   "                                 tempreature=0.1)]\n"
                   "    return c\n")
    assert run_data_cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s")]) == 2
    out = _one_line(capsys.readouterr().out)
    assert out.startswith(f"error: {cfg}:5: dataset_config: unknown key(s) tempreature (did you mean temperature?)")


def test_run_config_refuses_bfloat16_master_weights_and_bad_numbers(tmp_path):
    from jaxembed import config as cfglib

    def cfg(**kw):
        c = cfglib.default_config()
        c.model.name = "m"
        c.data.store = ""
        c.data.datasets = _two(tmp_path).datasets
        for k, v in kw.items():
            sec, key = k.split("__")
            c[sec][key] = v
        return c

    cfglib.validate(cfg())
    with pytest.raises(UserError, match=r"config\.model\.param_dtype = 'bfloat16' is refused: AdamW updates .* "
                                        r"\(fix: keep model\.param_dtype='float32' and set model\.dtype='bfloat16'"):
        cfglib.validate(cfg(model__param_dtype="bfloat16"))
    for k, v in [("train__seed", -1), ("optim__b2", 1.0), ("optim__eps", 0.0), ("optim__end_factor", 2.0),
                 ("optim__warmup_steps", -2), ("train__mesh_data", 0), ("loss__peg_beta", -0.1)]:
        with pytest.raises(UserError, match=rf"config\.{k.replace('__', '.')} = {v!r} is not valid"):
            cfglib.validate(cfg(**{k: v}))
    # why the refusal: one AdamW step of lr 2e-5 on bfloat16 weights of 0.05 leaves them unchanged
    import jax.numpy as jnp
    import optax

    w = jnp.full((4,), 0.05, jnp.bfloat16)
    tx = optax.adamw(2e-5, weight_decay=0.0)
    upd, _ = tx.update(jnp.ones_like(w), tx.init(w), w)
    assert bool((optax.apply_updates(w, upd) == w).all())
    w32 = w.astype(jnp.float32)
    upd32, _ = tx.update(jnp.ones_like(w32), tx.init(w32), w32)
    assert not bool((optax.apply_updates(w32, upd32) == w32).any())


# ------------------------------------------------------------------------------------------------- outputs

@pytest.fixture
def unwritable(tmp_path):
    """A folder this process cannot create files in (root ignores permissions: /sys is read-only)."""
    if os.geteuid() == 0:
        yield Path("/sys")
        return
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    yield d
    d.chmod(0o700)


def _main(argv, capsys):
    from jaxembed.cli import main

    rc = main(argv)
    return rc, _one_line(capsys.readouterr().err)


OUTPUT_CMDS = {
    "encode": (["encode", "--model", "/no/model", "--input", "{inp}", "--out", "{out}.npy"], "file"),
    "export": (["export", "--model", "/no/model", "--out", "{out}"], "folder"),
    "mine": (["mine", "--model", "/no/model", "--input", "{inp}", "--out", "{out}.jsonl"], "file"),
    "score": (["score", "--model", "/no/model", "--store", "/no/store", "--out", "{out}"], "folder"),
    "curriculum": (["curriculum", "--scores-dir", "/no/scores", "--out", "{out}"], "folder"),
    "eval": (["eval", "--model", "/no/model", "--tasks", "STSBenchmark", "--out", "{out}.json"], "file"),
    "plan_build": (["plan", "build", "--store", "/no/store", "--out", "{out}.npz"], "file"),
    "data_prepare": (["data", "prepare", "--config", "{cfg}", "--out", "{out}"], "folder"),
}


@pytest.mark.parametrize("cmd,kind", list(OUTPUT_CMDS.values()), ids=list(OUTPUT_CMDS))
def test_outputs_are_checked_before_any_work(tmp_path, capsys, unwritable, cmd, kind):
    inp = _write(tmp_path / "in.jsonl", ['{"text": "a", "query": "q", "pos": ["p"]}'])
    a_file = _write(tmp_path / "some.jsonl", [GOOD])
    cfg = _config_file(tmp_path, [a_file])

    def run(out):
        return _main([x.replace("{inp}", str(inp)).replace("{out}", str(out)).replace("{cfg}", str(cfg))
                      for x in cmd], capsys)

    rc, err = run(a_file / "sub")  # under a file
    assert rc == 2 and re.match(rf"error: --out {re.escape(str(a_file))}/sub\S*: {re.escape(str(a_file))} is a file, "
                                r"not a folder \(fix: choose a path outside it", err), err
    rc, err = run(unwritable / "new" / "x")
    assert rc == 2 and f": cannot write in {unwritable} (" in err and "(fix: choose a writable location" in err, err
    wrong = tmp_path / "wrong"
    if kind == "file":  # an existing folder where a file goes
        ext = re.search(r"\{out\}(\.\w+)?", " ".join(cmd)).group(1) or ""
        (tmp_path / f"wrong{ext}").mkdir()
        rc, err = run(wrong)
        assert rc == 2 and f"wrong{ext}: is a folder (fix: give a file path" in err, err
    else:
        wrong.write_text("x")
        rc, err = run(wrong)
        assert rc == 2 and "wrong: is a file (fix: give a folder path" in err, err


def test_store_and_plan_inputs_that_are_files(tmp_path, capsys):
    f = _write(tmp_path / "store.jsonl", [GOOD])
    rc, err = _main(["plan", "build", "--store", str(f), "--out", str(tmp_path / "p.npz")], capsys)
    assert rc == 2 and err == (f"error: {f}: is a file, not a dataset store folder (fix: give the folder written by "
                               "jaxembed data prepare --out)")
    rc, err = _main(["data", "prepare", "--config", str(tmp_path), "--out", str(tmp_path / "s")], capsys)
    assert rc == 2 and "is a folder, not a config file (fix: " in err, err


def test_typos_and_folders_on_the_command_line(tmp_path, capsys):
    from jaxembed import config as cfglib

    with pytest.raises(UserError, match=r"^--config\.optim\.lrr: unknown key \(did you mean optim\.lr\?\)"):
        cfglib.apply_overrides(cfglib.default_config(), ["optim.lrr=1e-5"])
    rc, err = _main(["eval", "--model", "/no/model", "--prompts", str(tmp_path)], capsys)
    assert rc == 2 and err == f"error: --prompts {tmp_path}: is a folder (fix: pass a .json file)"
    rc, err = _main(["encode", "--model", "/no/model", "--input", str(tmp_path), "--out", str(tmp_path / "o.npy")],
                    capsys)
    assert rc == 2 and err == f"error: {tmp_path}: is a folder, not a file (fix: pass a .jsonl or .txt file)"


# ------------------------------------------------------------------------------------------ inputs that never end

JAXEMBED = str(Path(sys.executable).parent / "jaxembed")  # the console script of this environment


def _not_regular_files(tmp_path) -> dict:
    """A character device, a named pipe and a socket: {kind: (path, the message's reason and fix, the socket)}."""
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    sock_path = tmp_path / "s.jsonl"
    sock = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(tmp_path)  # a relative name: AF_UNIX paths are limited to ~107 bytes
    try:
        sock.bind("s.jsonl")
    finally:
        os.chdir(cwd)
    return {"device": ("/dev/zero", "is a character device, not a regular file (fix: pass a data file; a device "
                                    "such as /dev/zero or a terminal may never end)", None),
            "fifo": (str(fifo), "is a named pipe (FIFO), not a regular file (fix: write the data to a file first "
                                "(cmd > data.jsonl): a dataset is read more than once, a pipe only once; gzip, bzip2 "
                                "and xz files are read as they are)", None),
            "socket": (str(sock_path), "is a socket, not a regular file (fix: pass a data file)", sock)}


def test_inputs_that_are_not_regular_files_are_named(tmp_path, capsys):
    """/dev/zero, a FIFO, a socket: `data validate` and `data prepare` say what the path is, in one line, before
    reading it (such an input may never end)."""
    cases = _not_regular_files(tmp_path)
    try:
        for kind, (path, said, _) in cases.items():
            assert run_data_cli(["data", "validate", path]) == 2, kind
            assert _one_line(capsys.readouterr().out) == f"error: {path}: {said}", kind
            cfg = _config_file(tmp_path, [path])  # the real CLI, in a process of its own, with a time limit
            out = subprocess.run([JAXEMBED, "data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "store")],
                                 capture_output=True, text=True, timeout=60)
            assert out.returncode == 2 and _one_line(out.stderr) == (
                f"error: {cfg}: data.datasets[0].path: {path}: {said}"), (kind, out.stderr)
            assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == [], kind
    finally:
        cases["socket"][2].close()


def test_line_limit_holds_while_reading_csv_and_compressed_files(tmp_path, monkeypatch, capsys):
    """A line over the limit is passed over without being held, in CSV / TSV files too and in gzip files; it is one
    bad record, counted, and reading goes on."""
    import tracemalloc

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1 << 20)
    long_line = b'"' + b"x" * (24 << 20) + b'",p,n'
    body = b"anchor,positive,negative\nq,p,n\n" + long_line + b"\nr,p,n\n"
    files = [tmp_path / "t.csv", tmp_path / "t.csv.gz", tmp_path / "t.jsonl.gz"]
    files[0].write_bytes(body)
    files[1].write_bytes(gzip.compress(body, 1))
    files[2].write_bytes(gzip.compress(b"\n".join([GOOD.encode(), b'{"query": "' + b"x" * (24 << 20) + b'"}',
                                                   GOOD.replace('"q"', '"r"').encode()]) + b"\n", 1))
    for f in files:
        tracemalloc.start()
        try:
            rc = run_data_cli(["data", "validate", str(f)])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        out = capsys.readouterr().out
        line = 3 if ".csv" in f.name else 2
        assert rc == 1 and re.search(rf"{re.escape(str(f))}:{line}: line of 25,16\d,\d\d\d bytes is longer than the "
                                     r"limit of 1,048,576 bytes \(fix: one record per line", out), out
        assert "3 records" in out and "2 valid, 1 invalid [line of" in out, out
        assert peak < 8 << 20, (f.name, peak)  # the 24 MiB line was never held


def test_stdin_lines_are_limited_while_reading(tmp_path, monkeypatch, capsys):
    """`encode --input -` reads at most the limit of a line from standard input, then stops with one line."""
    import io

    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr("sys.stdin", io.StringIO("ok\n" + "x" * 5000 + "\n"))
    rc, err = _main(["encode", "--model", "/no/model", "--input", "-", "--out", str(tmp_path / "o.npy")], capsys)
    assert rc == 2 and err == ("error: -:2: line longer than the limit of 1,000 characters (fix: one text per line "
                               "(or raise jaxembed.data.jsonl.MAX_LINE_BYTES))"), err


def test_next_prepare_removes_the_folders_of_killed_writers_of_this_host(tmp_path):
    """kill -9 during `data prepare` leaves its temporary folder; the next `data prepare` removes it, in one log
    line, and leaves alone what may be a live writer's: another host's folder, a running pid's, a locked one."""
    import fcntl

    from jaxembed.runs import atomic_files

    data = _write(tmp_path / "d.jsonl", [GOOD])
    cfg = _config_file(tmp_path, [data])
    killer = tmp_path / "killed.py"  # the same config, killed (SIGKILL) once the store's temporary folder is made
    killer.write_text(cfg.read_text() + "\n\nimport os, signal\nimport jaxembed.data.store as _s\n"
                      "_s._write_dataset = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n")
    out = tmp_path / "store"
    p = subprocess.run([JAXEMBED, "data", "prepare", "--config", str(killer), "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    (left,) = [d.name for d in tmp_path.iterdir() if d.name.startswith(".store.tmp-")]
    host_part = atomic_files.unique_tmp(out).name.rsplit("-", 2)[0]  # .store.tmp-{this host}
    dead = int(left[len(host_part) + 1:].split("-")[0])
    assert left.startswith(host_part + "-") and dead != os.getpid()
    keep = [f".store.tmp-otherhost-{dead}-0123456789ab",  # another host of a pod: its pid says nothing here
            f"{host_part}-{os.getpid()}-0123456789ab",  # this host, a running process (this test)
            f"{host_part}-{dead}-00000000000a",  # this host, dead pid, but locked: a writer in another pid namespace
            f".store.tmp-{dead}-01234567"]  # an older name without a host
    for name in keep:
        (tmp_path / name).mkdir()
    fd = os.open(tmp_path / keep[2], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        p = subprocess.run([JAXEMBED, "data", "prepare", "--config", str(cfg), "--out", "store", "-q"],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)  # the log names the folder
    finally:
        os.close(fd)
    assert p.returncode == 0, p.stderr
    assert _one_line(p.stderr) == (f"WARNING jaxembed.data.leftovers: {tmp_path}: removed 1 temporary folder left by "
                                   f"data prepare processes of this host that are no longer running: {left}")
    assert sorted(d.name for d in tmp_path.iterdir() if d.name.startswith(".store.")) == sorted(keep)
    assert (out / "manifest.json").exists()


# ------------------------------------------------------------------------------------ empty after tokenisation

#: texts that tokenise to the special tokens alone: zero-width characters, NUL, a byte-order mark, a soft hyphen
INVISIBLE = {"\u200b": "U+200B ZERO WIDTH SPACE", "\u0000": "U+0000 NUL", "\ufeff": "U+FEFF BYTE ORDER MARK",
             "\u200c\u200d\u2060": "U+200C ZERO WIDTH NON-JOINER, U+200D ZERO WIDTH JOINER, U+2060 WORD JOINER",
             "\u00ad": "U+00AD SOFT HYPHEN"}


def test_texts_of_invisible_characters_are_empty_like_whitespace(tmp_path, capsys):
    """A text with no content once whitespace, control and zero-width characters are dropped is refused and
    counted as whitespace-only text is ("empty text"): in `data validate`, `data prepare` and encode's input."""
    rows = [GOOD, '{"query": "   ", "pos": ["p"]}'] + [
        json.dumps({"query": f"q{i}", "pos": [t]}) for i, t in enumerate(INVISIBLE)] + [
        json.dumps({"query": " \u200b\t", "pos": ["p"]}), json.dumps({"query": "\u200bok", "pos": ["p"]})]
    p = _write(tmp_path / "inv.jsonl", rows)
    n = len(INVISIBLE) + 2
    assert run_data_cli(["data", "validate", str(p)]) == 1
    out = capsys.readouterr().out
    assert f"{p}:2: field 'query': empty text (fix: remove the record or give it text)" in out
    for i, names in enumerate(INVISIBLE.values()):
        assert (f"{p}:{i + 3}: field 'pos[0]': empty text (no content: only {names}) (fix: remove the record or "
                "give it text)") in out, out
    assert (f"{p}:{n + 1}: field 'query': empty text (no content: only U+200B ZERO WIDTH SPACE and whitespace) "
            "(fix: remove the record or give it text)") in out, out
    assert (f"{p}: {n + 2} records (triplets): 2 valid, {n} invalid [field 'pos[0]': empty text: {n - 2}; field "
            "'query': empty text: 2]") in out, out
    cfg = _config_file(tmp_path, [p], on_error="skip")
    assert run_data_cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s"), "-q"]) == 0
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["datasets"][0]["reasons"] == {"field 'query': empty text": 2, "field 'pos[0]': empty text": n - 2}
    assert rep["written"] == 2 and f"{n} invalid skipped" in capsys.readouterr().out
    cfg = _config_file(tmp_path, [p], on_error="stop")
    assert run_data_cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s2")]) == 2
    assert _one_line(capsys.readouterr().out).startswith(f"error: {p}:2: field 'query': empty text (fix: ")
    src = _write(tmp_path / "enc.jsonl", ['{"text": "a"}', '{"text": "\\u200b\\u200b"}'])
    rc, err = _main(["encode", "--model", "/no/model", "--input", str(src), "--out", str(tmp_path / "o.npy")], capsys)
    assert rc == 2 and err == (f"error: {src}:2: field 'text': empty text (no content: only U+200B ZERO WIDTH SPACE) "
                               "(fix: remove the record or give it text)"), err


# ------------------------------------------------------------------------------------------- missing task type

def test_missing_task_type_names_the_fix_for_the_format_at_hand(tmp_path, capsys):
    """A dataset without task_type whose records give none: sentence-transformers rows get the ST choices, BGE
    triplets their 'type' field, other formats a task type to set."""
    st = _write(tmp_path / "st.jsonl", ['{"anchor": "a", "positive": "p"}', '{"anchor": "b", "positive": "q"}'])
    bge = _write(tmp_path / "bge.jsonl", [GOOD])
    pairs = _write(tmp_path / "pairs.jsonl", ['{"sentence1": "a", "sentence2": "b", "label": 1}'])
    tts = "one of retrieval, reranking, sts, pair_classification, classification, clustering, nli"
    for path, said in [
        (st, f"{st} holds sentence-transformers rows, which have no task type (fix: set task_type: nli or sts for "
             "symmetric pairs, without instruction; retrieval for query -> passage, with one)"),
        (bge, f"the records of {bge} have no BGE 'type' field to take it from (fix: set task_type, or give every "
              "record a 'type': normal, only_1neg, symmetric_sts, symmetric_class, symmetric_clustering or a task "
              "type)"),
        (pairs, f"labelled_pairs records ({pairs}) have no task type (fix: set task_type, e.g. pair_classification)"),
    ]:
        cfg = _config_file(tmp_path, [path], task_type=None)
        assert run_data_cli(["data", "prepare", "--config", str(cfg), "--out", str(tmp_path / "s")]) == 2
        assert _one_line(capsys.readouterr().out) == (
            f"error: {cfg}: data.datasets[0].task_type: required ({tts}): {said}")
