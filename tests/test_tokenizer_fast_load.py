"""A folder's tokenizer is AutoTokenizer's, loaded without AutoTokenizer for a folder seen before
(jaxembed/tokenizer_class.py: the class AutoTokenizer picked is remembered per folder). That such a process does
not import torch: tests/test_process_imports.py."""

from __future__ import annotations

import json
import shutil

import pytest

from jaxembed import tokenizer_class
from jaxembed.models import tiny
from jaxembed.tokenizer import Tokenizer

TEXTS = ["Instruct: Retrieve semantically similar text.\nQuery: a man plays the guitar",
         "héllo wörld 1234 — naïve café, ÀÉÎ straße 東京 🙂", "[CLS] [SEP] <|endoftext|> <pad> </s>",
         "  leading and trailing spaces  ", " ".join(["word"] * 300), ""]


@pytest.fixture(scope="module")
def tokenizer_files(minilm_dir):
    """arch -> the folder holding the tokenizer files of its tiny model: MiniLM's, or the tiny qwen2's own."""
    qwen2 = tiny.tiny_model_dir("qwen2")  # in the suite's tiny-model cache (the `cache` fixture moves it later)
    return {arch: qwen2 if arch == "qwen2" else minilm_dir for arch in tiny.ARCHS}


def _folder(root, arch: str, src):
    """A folder with ``arch``'s tiny config.json and the tokenizer files of ``src`` (no weights: the choice of
    tokenizer class reads only the config and the tokenizer files)."""
    d = root / arch
    d.mkdir()
    (d / "config.json").write_text(json.dumps(tiny.tiny_hf_config(arch)))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, d / name)
    return d


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXEMBED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizer_class"


def _no_auto(monkeypatch):
    import transformers

    def refuse(*a, **k):
        raise AssertionError("AutoTokenizer was used for a folder whose tokenizer class is remembered")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)


def _auto(folder):
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(folder))
    ref.pipeline = ref.backend_tokenizer.to_str()
    return ref


def _same(got, ref, fresh: bool = True) -> None:
    """``got`` is ``ref`` (AutoTokenizer's, with ``ref.pipeline``: its backend as loaded, before a call sets its
    truncation and padding; compared when ``got`` is fresh too)."""
    assert type(got) is type(ref)
    if fresh:
        assert got.backend_tokenizer.to_str() == ref.pipeline
    for kw in ({}, {"truncation": True, "max_length": 16}, {"add_special_tokens": False}):
        assert got(TEXTS, **kw)["input_ids"] == ref(TEXTS, **kw)["input_ids"], kw
    assert (got.all_special_ids, got.pad_token_id, got.eos_token_id, got.padding_side, got.model_max_length) == (
        ref.all_special_ids, ref.pad_token_id, ref.eos_token_id, ref.padding_side, ref.model_max_length)
    assert got.get_vocab() == ref.get_vocab()


@pytest.mark.parametrize("arch", ["minilm", *tiny.ARCHS])
def test_remembered_class_loads_autotokenizers_tokenizer(arch, minilm_dir, tokenizer_files, tmp_path, cache,
                                                         monkeypatch):
    """MiniLM and the tiny folder of each architecture: the first load is AutoTokenizer's and remembers its class;
    the second, without AutoTokenizer, gives the same tokenizer (pipeline, ids, special tokens, lengths)."""
    folder = minilm_dir if arch == "minilm" else _folder(tmp_path, arch, tokenizer_files[arch])
    ref = _auto(folder)
    _same(tokenizer_class.load_as_auto(folder), ref)
    assert [p.name for p in cache.iterdir()] == [f"{tokenizer_class.folder_key(folder)}.json"]
    _no_auto(monkeypatch)
    ours = Tokenizer.from_folder(folder)
    _same(ours.hf, ref, fresh=False)  # called on the probe sentence already
    assert ours.tokenize(TEXTS) == ref(TEXTS, truncation=True, max_length=ours.max_length)["input_ids"]


def test_a_changed_folder_is_chosen_for_again(minilm_dir, tmp_path, cache, monkeypatch):
    """Editing a tokenizer file changes the folder's key (AutoTokenizer chooses again, and the edit shows); a
    weight file, or any file over READ_LIMIT bytes, is keyed by its name and size only (never read)."""
    folder = _folder(tmp_path, "bert", minilm_dir)
    monkeypatch.setattr(tokenizer_class, "READ_LIMIT", 1 << 20)
    big = [folder / "model.safetensors", folder / "rust_model.ot", folder / "weights.dat"]
    for f in big:
        f.write_bytes(b"a" * (8 if f.suffix != ".dat" else (1 << 20) + 1))
    key = tokenizer_class.folder_key(folder)
    tokenizer_class.load_as_auto(folder)
    for f in big:
        f.write_bytes(f.read_bytes().replace(b"a", b"b"))
    assert tokenizer_class.folder_key(folder) == key
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "model_max_length": 77}))
    assert tokenizer_class.folder_key(folder) != key
    assert tokenizer_class.load_as_auto(folder).model_max_length == 77
    assert len(list(cache.iterdir())) == 2


def test_an_unusable_entry_or_cache_falls_back_to_autotokenizer(minilm_dir, tmp_path, cache, monkeypatch):
    """A corrupt entry, an entry naming a class outside transformers, or a cache folder that cannot be written:
    AutoTokenizer loads the folder, as without the cache."""
    folder = _folder(tmp_path, "bert", minilm_dir)
    ref = _auto(folder)
    entry = cache / f"{tokenizer_class.folder_key(folder)}.json"
    cache.mkdir(parents=True)
    for text in ("{not json", json.dumps({"module": "os", "class": "system"}),
                 json.dumps({"module": "transformers", "class": "NoSuchTokenizer"})):
        entry.write_text(text)
        assert tokenizer_class.remembered(entry.stem) is None
        _same(tokenizer_class.load_as_auto(folder), ref)
        assert json.loads(entry.read_text())["class"] == type(ref).__name__  # rewritten by the fallback
    remote = type("RemoteTokenizer", (), {"__module__": "transformers_modules.org.tok"})
    tokenizer_class.remember("remote", remote)
    assert not (cache / "remote.json").exists()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("JAXEMBED_CACHE", str(blocked))
    _same(tokenizer_class.load_as_auto(folder), ref)


def test_a_remembered_mismatched_tokenizer_json_still_warns(minilm_dir, tmp_path, cache, caplog):
    """A WordPiece tokenizer.json beside a qwen2 config.json (transformers rebuilds it as Qwen2Tokenizer): loaded as
    it is, with the warning, on the first load and on a remembered one."""
    folder = _folder(tmp_path, "qwen2", minilm_dir)
    want = Tokenizer.from_folder(minilm_dir, 64).tokenize(TEXTS)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level("WARNING", logger="jaxembed.tokenizer"):
            assert Tokenizer.from_folder(folder, 64).tokenize(TEXTS) == want
        assert "Qwen2Tokenizer" in caplog.text
    assert (cache / f"{tokenizer_class.folder_key(folder)}.json").is_file()


def test_a_hub_snapshot_of_symlinks_is_remembered(minilm_dir, tmp_path, cache, monkeypatch):
    """A hub id resolves to a snapshot folder of the Hugging Face cache, whose files are links into blobs/: the key
    reads through the links, and the remembered load equals AutoTokenizer's."""
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "0123abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, blobs / name.replace(".", "_"))
        (snap / name).symlink_to(blobs / name.replace(".", "_"))
    ref = _auto(snap)
    _same(tokenizer_class.load_as_auto(snap), ref)
    _no_auto(monkeypatch)
    _same(tokenizer_class.load_as_auto(snap), ref)
