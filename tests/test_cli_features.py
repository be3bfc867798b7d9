"""The README's command-line options, each through the real CLI (``jaxembed.cli.main``) on tiny random models:
``encode`` from stdin and with ``--format`` / ``--prompt-name`` / ``--max-length`` / ``--pooling`` / ``--dtype`` /
``--bidirectional``; ``eval`` with its model and prompt options and ``--mteb mteb:NAME``; ``mine --approx ivf`` and
``--corpus``. Each option is checked against what it must do (an independent computation or a property), not only
against the Python API."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from jaxembed.cli import main

TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The market fell sharply.",
         "It is raining in the city today and tomorrow as well."]
WORDS = "the cat sat on a mat and then it ran to his house with my dog".split()  # one token each


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny random BERT folder with a named prompt."""
    from jaxembed.models.tiny import tiny_model_dir

    d = tmp_path_factory.mktemp("models") / "bert"
    shutil.copytree(tiny_model_dir("bert"), d)
    st = json.loads((d / "config_sentence_transformers.json").read_text())
    st["prompts"] = {"query": "query: ", "passage": "passage: "}
    (d / "config_sentence_transformers.json").write_text(json.dumps(st))
    return d


@pytest.fixture(scope="module")
def qwen_dir():
    from jaxembed.models.tiny import tiny_model_dir

    return tiny_model_dir("qwen2")


def _encode(model, tmp_path, *args, name="out.npy") -> np.ndarray:
    out = tmp_path / name
    assert main(["encode", "--model", str(model), "--out", str(out), "-q", *args]) == 0
    emb = np.load(out)
    assert emb.dtype == np.float32
    return emb


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_encode_options(bert_dir, qwen_dir, tmp_path, monkeypatch):
    from jaxembed import loading
    from jaxembed.encode import Encoder

    base = Encoder.from_loaded(loading.load(bert_dir)).encode(TEXTS)
    # stdin (--input -): plain text, one text per line
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(t + "\n" for t in TEXTS)))
    np.testing.assert_allclose(_encode(bert_dir, tmp_path, "--input", "-"), base, atol=1e-6)
    # --format overrides the suffix: JSON Lines in a .txt file, plain text in a .jsonl file
    js = tmp_path / "objects.txt"
    js.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    np.testing.assert_allclose(_encode(bert_dir, tmp_path, "--input", str(js), "--format", "jsonl"), base, atol=1e-6)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(t + "\n" for t in TEXTS))
    np.testing.assert_allclose(_encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text"), base,
                               atol=1e-6)
    # --prompt-name: the model's named prompt, the same as passing its text with --prompt
    named = _encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text", "--prompt-name", "query")
    np.testing.assert_allclose(named, _encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text",
                                              "--prompt", "query: "), atol=1e-6)
    assert np.abs(named - base).max() > 1e-3

    # --max-length 8: [CLS] + 6 words + [SEP], the same as encoding the first 6 words in full
    long = tmp_path / "long.txt"
    long.write_text(" ".join(WORDS) + "\n" + " ".join(WORDS[3:]) + "\n")
    short = tmp_path / "short.txt"
    short.write_text(" ".join(WORDS[:6]) + "\n" + " ".join(WORDS[3:9]) + "\n")
    np.testing.assert_allclose(_encode(bert_dir, tmp_path, "--input", str(long), "--max-length", "8"),
                               _encode(bert_dir, tmp_path, "--input", str(short)), atol=1e-6)

    # --pooling cls: the normalised hidden state of the first token, from the backbone itself
    loaded = loading.load(bert_dir)
    ids, mask = loaded.tokenizer.pad(loaded.tokenizer.tokenize(TEXTS), 32, len(TEXTS))
    hidden = np.asarray(loaded.model.backbone(ids, mask, None, deterministic=True))
    cls = _encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text", "--pooling", "cls")
    np.testing.assert_allclose(cls, _unit(hidden[:, 0]), atol=1e-5)

    # --dtype bfloat16: computed in bf16 (not the float32 result), written as float32, close to it
    bf = _encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text", "--dtype", "bfloat16")
    assert np.abs(bf - base).max() > 1e-4
    assert (np.sum(_unit(bf) * _unit(base), axis=1) > 0.99).all()

    # --bidirectional (Qwen2): causally, the first token (the prompt's, the same for every text here) sees only
    # itself, so its pooled state is the same for every text; with bidirectional attention it sees the whole text
    causal = _encode(qwen_dir, tmp_path, "--input", str(plain), "--format", "text", "--pooling", "cls",
                     "--prompt", "query: ")
    np.testing.assert_allclose(causal, np.broadcast_to(causal[0], causal.shape), atol=1e-6)
    both = _encode(qwen_dir, tmp_path, "--input", str(plain), "--format", "text", "--pooling", "cls",
                   "--prompt", "query: ", "--bidirectional")
    assert np.abs(both - both[0]).max() > 1e-3


EVAL_TASKS = ["STSBenchmark", "STSBenchmark-dev"]


def test_eval_options_through_the_cli(bert_dir, qwen_dir, shared_data, tmp_path, capsys):
    """One `jaxembed eval` with the model and prompt options equals `evaluate` given the same options, and each
    option changes the result (dropping any one of them from the API call gives other scores). --bidirectional on a
    Qwen2 model likewise."""
    from jaxembed import loading
    from jaxembed.encode import Encoder
    from jaxembed.evaluate import evaluate

    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps({"STSBenchmark-dev": "Find a paraphrase: "}))  # above the task instruction
    out = tmp_path / "res.json"
    template = "Q: {instruction} | "
    assert main(["eval", "--model", str(bert_dir), "--tasks", "STSBenchmark", "--split", "both",
                 "--max-examples", "24", "--batch-size", "8", "--seed", "7", "--instructions",
                 "--instruction-template", template, "--prompts", str(prompts), "--dtype", "bfloat16",
                 "--max-length", "20", "--pooling", "max", "--out", str(out), "-q"]) == 0
    got = json.loads(out.read_text())
    assert sorted(got) == sorted(EVAL_TASKS)
    assert all(np.isfinite(got[t]["main_score"]) for t in EVAL_TASKS), got
    table = capsys.readouterr().out
    assert all(name in table for name in EVAL_TASKS)

    def api(model_dir, model_kw, run_kw, tasks=EVAL_TASKS):
        enc = Encoder.from_loaded(loading.load(model_dir, **model_kw))
        return json.loads(json.dumps(evaluate(enc, tasks, **run_kw)))  # the JSON round trip of --out

    model = dict(dtype="bfloat16", max_length=20, pooling="max")
    run = dict(max_examples=24, batch_size=8, seed=7, prompts={"STSBenchmark-dev": "Find a paraphrase: "},
               task_instructions=True, instruction_template=template)
    want = api(bert_dir, model, run)
    for t in EVAL_TASKS:
        assert got[t]["main_score"] == pytest.approx(want[t]["main_score"], abs=1e-6), t
    # each option had an effect: without it, the task it acts on scores differently
    for key in model:
        other = api(bert_dir, {k: v for k, v in model.items() if k != key}, run, ["STSBenchmark"])
        assert other["STSBenchmark"] != got["STSBenchmark"], key
    for key, default, task in (("seed", 42, "STSBenchmark"), ("prompts", None, "STSBenchmark-dev"),
                               ("task_instructions", False, "STSBenchmark"),
                               ("instruction_template", "Instruct: {instruction}\nQuery: ", "STSBenchmark")):
        assert api(bert_dir, model, dict(run, **{key: default}), [task])[task] != got[task], key

    # --bidirectional (Qwen2)
    assert main(["eval", "--model", str(qwen_dir), "--tasks", "STSBenchmark", "--max-examples", "24",
                 "--bidirectional", "--out", str(out), "-q"]) == 0
    got = json.loads(out.read_text())
    run = dict(max_examples=24)
    assert got == api(qwen_dir, dict(causal=False), run, ["STSBenchmark"]) != api(qwen_dir, {}, run, ["STSBenchmark"])


def test_eval_mteb_prefix_runs_the_mteb_task(bert_dir, shared_data, tmp_path, monkeypatch):
    """`--mteb mteb:STSBenchmark` runs MTEB's own STSBenchmark task (not the local custom task of the same name).
    Offline, its dataset is given from the local STS-B test file, so its score must equal the local evaluator's."""
    import mteb

    from jaxembed.evaluate import evaluate, tasks as local_tasks
    from jaxembed.evaluate.mteb_adapter import _dataset_dict

    real_get_task = mteb.get_task
    asked = []

    def get_task(name, *a, **kw):
        task = real_get_task(name, *a, **kw)
        asked.append((name, type(task)))
        if name == "STSBenchmark":
            local = local_tasks.get_task("STSBenchmark")
            data = _dataset_dict(local, local_tasks.load_task_data(local, max_examples=100, seed=42))

            def load_data(*_a, **_kw):
                task.dataset, task.data_loaded = data, True

            task.load_data = load_data
        return task

    monkeypatch.setattr(mteb, "get_task", get_task)
    out = tmp_path / "mteb"
    assert main(["eval", "--model", str(bert_dir), "--mteb", "mteb:STSBenchmark", "--name", "me/tiny",
                 "--max-length", "32", "--out", str(out), "-q"]) == 0
    assert [n for n, _ in asked] == ["STSBenchmark"]
    assert asked[0][1].__module__.startswith("mteb.tasks.")  # MTEB's class, not jaxembed's custom task
    files = list(out.glob("results/me__tiny/*/STSBenchmark.json"))
    assert len(files) == 1
    score = 100 * json.loads(files[0].read_text())["scores"]["test"][0]["main_score"]
    from jaxembed import loading

    ours = evaluate(loading.load(bert_dir, max_length=32), ["STSBenchmark"], max_examples=100)["STSBenchmark"]
    assert score == pytest.approx(ours["main_score"], abs=0.01)


def test_tiny_qwen2_tokenizes_as_sentence_transformers_does_into_words(qwen_dir):
    """transformers 5 loads every qwen2 folder's tokenizer as Qwen2Tokenizer, so the tiny qwen2 folder carries a
    Qwen2-layout byte-level BPE (jaxembed/models/tiny.py): jaxembed and AutoTokenizer (what sentence-transformers
    feeds the model) give the same ids, and words are tokens, not characters."""
    from transformers import AutoTokenizer

    from jaxembed.tokenizer import Tokenizer

    texts = ["Instruct: Retrieve semantically similar text.\nQuery: a man plays the guitar", "héllo wörld 1234"]
    ours = Tokenizer.from_folder(qwen_dir, 64)
    ref = AutoTokenizer.from_pretrained(str(qwen_dir))
    assert type(ref).__name__ == "Qwen2Tokenizer"
    assert ours.tokenize(texts) == [ref(t)["input_ids"] for t in texts]
    assert ours.pad_id == ref.pad_token_id == ref.convert_tokens_to_ids("<|endoftext|>")
    words = ours.tokenize([" ".join(WORDS)])[0]
    assert len(words) <= len(WORDS) + 2, ours.hf.convert_ids_to_tokens(words)  # common words: ~one token each
    assert len(ours.tokenize(texts)[0]) < len(texts[0]) / 3  # not one token per character
    assert ours.hf.decode(ours.tokenize(texts)[0]) == texts[0]


def test_tokenizer_json_is_loaded_as_it_is_whatever_the_model_type(minilm_dir, tmp_path, caplog):
    """A WordPiece tokenizer.json beside a qwen2 config.json: transformers 5 rebuilds it as Qwen2Tokenizer (one token
    per character, the first letter dropped); jaxembed loads the file as it is (MiniLM's ids) and warns that
    sentence-transformers would not."""
    from jaxembed.models.tiny import tiny_hf_config
    from jaxembed.tokenizer import Tokenizer

    folder = tmp_path / "qwen2-wordpiece"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_dir / name).is_file():
            shutil.copy(minilm_dir / name, folder / name)
    (folder / "config.json").write_text(json.dumps(tiny_hf_config("qwen2")))
    text = ["Instruct: Retrieve semantically similar text. a man plays"]
    with caplog.at_level("WARNING", logger="jaxembed.tokenizer"):
        got = Tokenizer.from_folder(folder, 64)
    want = Tokenizer.from_folder(minilm_dir, 64)
    assert got.tokenize(text) == want.tokenize(text)
    assert (got.pad_id, got._special, got.prompt_length("query: ")) == (want.pad_id, want._special,
                                                                        want.prompt_length("query: "))
    assert "Qwen2Tokenizer" in caplog.text and "sentence-transformers" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="jaxembed.tokenizer"):
        Tokenizer.from_folder(minilm_dir, 64)  # a folder whose class matches its tokenizer.json: no warning
    assert not caplog.text


def test_wrong_type_assigned_in_a_config_file_is_one_line(tmp_path, capsys):
    """ml-collections refuses a dict for ``datasets`` (a list) with a multi-line TypeError: `jaxembed train` and
    `jaxembed data prepare` name the config file and line in one line and point to datasets_from_dict; any other
    field of another type is one line too."""
    head = "from jaxembed.config import default_config\nfrom jaxembed.data.config import default_data_config\n\n\n"
    files = {
        "train.py": "def get_config(arg=None):\n    c = default_config()\n"
                    "    c.data.datasets = {'nli': 'nli.parquet', 'sts': dict(path='sts', format='hf')}\n    return c\n",
        "data.py": "def get_config(arg=None):\n    c = default_data_config()\n    c.datasets = {'nli': 'nli.parquet'}\n"
                   "    return c\n",
        "lr.py": "def get_config(arg=None):\n    c = default_config()\n    c.optim.lr = 'fast'\n    return c\n",
    }
    for name, body in files.items():
        (tmp_path / name).write_text(head + body)
    runs = [(["train", "--config", str(tmp_path / "train.py"), "--workdir", str(tmp_path / "wd")], "train.py:7: "),
            (["data", "prepare", "--config", str(tmp_path / "data.py"), "--out", str(tmp_path / "store")],
             "data.py:7: "),
            (["train", "--config", str(tmp_path / "lr.py"), "--workdir", str(tmp_path / "wd")], "lr.py:7: ")]
    for args, where in runs:
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and where in err, err
        if "lr.py" in where:
            assert "field 'lr' is a float, a str cannot be assigned to it" in err, err
        else:
            assert "datasets is a list of dataset configs, a dict cannot be assigned" in err, err
            assert "datasets_from_dict(" in err and "from jaxembed.data.config import datasets_from_dict" in err
    assert not (tmp_path / "wd").exists() and not (tmp_path / "store").exists()


def test_config_file_with_get_config_of_no_argument(tmp_path):
    """ml_collections' convention, ``def get_config():``, loads; a variant passed to it is one line naming the fix."""
    from jaxembed import config as cfglib
    from jaxembed.errors import UserError

    p = tmp_path / "plain.py"
    p.write_text("from jaxembed.config import default_config\n\n\ndef get_config():\n    c = default_config()\n"
                 "    c.optim.lr = 3e-5\n    return c\n")
    assert cfglib.load_config_file(str(p)).optim.lr == 3e-5
    with pytest.raises(UserError, match=r"get_config\(\) takes no argument, so the variant 'tiny' cannot be passed "
                                        r"\(fix: define get_config\(arg=None\)"):
        cfglib.load_config_file(f"{p}:tiny")
