"""A model folder is complete before anything uses it: config.json, weights and a tokenizer that reads a probe
sentence back. Without its tokenizer files transformers builds an empty tokenizer (every word [UNK]), and encode,
train and export would run on it without an error; the one loading path (``jaxembed.loading.load``, and
``jaxembed.tokenizer.Tokenizer.from_folder`` under it) refuses such a folder in one line."""

import json
import shutil

import pytest

from jaxembed import loading
from jaxembed.cli import main
from jaxembed.errors import UserError
from jaxembed.models import tiny
from jaxembed.tokenizer import Tokenizer

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@pytest.fixture(scope="module")
def bert_dir():
    return tiny.tiny_model_dir("bert")


def _copy_without(src, dst, names):
    shutil.copytree(src, dst)
    for name in names:
        (dst / name).unlink(missing_ok=True)
    return dst


def test_folder_without_tokenizer_files_is_refused_in_one_line(bert_dir, tmp_path, capsys):
    folder = _copy_without(bert_dir, tmp_path / "no-tokenizer", TOKENIZER_FILES)
    with pytest.raises(loading.ModelLoadError, match="no tokenizer files") as e:
        loading.load(folder)
    assert str(folder) in str(e.value) and "fix:" in str(e.value)
    with pytest.raises(UserError, match="so every word would become \\[UNK\\]"):
        Tokenizer.from_folder(folder)  # the path of `jaxembed plan build --tokenizer` and RetroMAE
    src = tmp_path / "in.txt"
    src.write_text("hi there\n", encoding="utf-8")
    out = tmp_path / "out.npy"
    assert main(["encode", "--model", str(folder), "--input", str(src), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no tokenizer files" in err and str(folder) in err
    assert not out.exists()


def test_tokenizer_that_does_not_read_back_the_probe_is_refused(bert_dir, tmp_path):
    folder = _copy_without(bert_dir, tmp_path / "short-vocab", ("vocab.txt",))
    doc = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    doc["model"]["vocab"] = {t: i for t, i in doc["model"]["vocab"].items() if i < 999}  # specials, [unused*]
    (folder / "tokenizer.json").write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(UserError, match="does not read back the probe sentence") as e:
        loading.load(folder)
    assert "[UNK]" in str(e.value) and "fix:" in str(e.value) and "\n" not in str(e.value)


def test_every_missing_part_is_named_at_once(bert_dir, tmp_path):
    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(bert_dir / "config.json", folder / "config.json")
    with pytest.raises(loading.ModelLoadError) as e:
        loading.load(folder)
    assert "no weights found" in str(e.value) and "no tokenizer files" in str(e.value)
    (folder / "config.json").unlink()
    with pytest.raises(loading.ModelLoadError, match="no config.json; no weights found"):
        loading.load(folder)


def test_a_complete_folder_reads_the_probe_back(bert_dir):
    from jaxembed.tokenizer import PROBE, reads_back

    tok = Tokenizer.from_folder(bert_dir)
    ids = tok.hf(PROBE, add_special_tokens=False)["input_ids"]
    assert tok.hf.unk_token_id not in ids and reads_back(tok.hf, PROBE) == 1.0
    assert json.loads((bert_dir / "config.json").read_text())["model_type"] == "bert"
