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
    from jaxembed import hf
    from jaxembed.encode import Encoder

    base = Encoder.from_loaded(hf.load(bert_dir)).encode(TEXTS)
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
    loaded = hf.load(bert_dir)
    ids, mask = loaded.tokenizer.pad(loaded.tokenizer.tokenize(TEXTS), 32, len(TEXTS))
    hidden = np.asarray(loaded.model.backbone(ids, mask, None, deterministic=True))
    cls = _encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text", "--pooling", "cls")
    np.testing.assert_allclose(cls, _unit(hidden[:, 0]), atol=1e-5)

    # --dtype bfloat16: computed in bf16 (not the float32 result), written as float32, close to it
    bf = _encode(bert_dir, tmp_path, "--input", str(plain), "--format", "text", "--dtype", "bfloat16")
    assert np.abs(bf - base).max() > 1e-4
    assert (np.sum(_unit(bf) * _unit(base), axis=1) > 0.99).all()

    # --bidirectional (Qwen2): causally, the first token ([CLS] for every text here) sees only itself, so its
    # pooled state is the same for every text; with bidirectional attention it sees the whole text
    causal = _encode(qwen_dir, tmp_path, "--input", str(plain), "--format", "text", "--pooling", "cls")
    np.testing.assert_allclose(causal, np.broadcast_to(causal[0], causal.shape), atol=1e-6)
    both = _encode(qwen_dir, tmp_path, "--input", str(plain), "--format", "text", "--pooling", "cls",
                   "--bidirectional")
    assert np.abs(both - both[0]).max() > 1e-3


EVAL_TASKS = ["STSBenchmark", "STSBenchmark-dev"]


def test_eval_options_through_the_cli(bert_dir, qwen_dir, shared_data, tmp_path, capsys):
    """One `jaxembed eval` with the model and prompt options equals `evaluate` given the same options, and each
    option changes the result (dropping any one of them from the API call gives other scores). --bidirectional on a
    Qwen2 model likewise."""
    from jaxembed import hf
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
        enc = Encoder.from_loaded(hf.load(model_dir, **model_kw))
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
    from jaxembed import hf

    ours = evaluate(hf.load(bert_dir, max_length=32), ["STSBenchmark"], max_examples=100)["STSBenchmark"]
    assert score == pytest.approx(ours["main_score"], abs=0.01)


@pytest.mark.xfail(strict=True, reason="bug: jaxembed/tokenizer.py Tokenizer.from_folder (AutoTokenizer) loads the tiny "
                   "Qwen2 folder's WordPiece tokenizer (jaxembed/models/tiny.py: all-MiniLM-L6-v2's, tokenizer_class "
                   "BertTokenizer) as Qwen2Tokenizer under transformers 5 (config.json's model_type wins): one token per "
                   "character and the first letter dropped, so every tiny-Qwen2 run trains on garbage ids. Remove this "
                   "marker with the fix.")
def test_tiny_qwen2_tokenizes_like_its_wordpiece_tokenizer(bert_dir, qwen_dir):
    """The tiny models all carry all-MiniLM-L6-v2's tokenizer (jaxembed/models/tiny.py), so they must give its ids."""
    from jaxembed.tokenizer import Tokenizer

    text = ["Instruct: Retrieve semantically similar text. a man plays"]
    assert Tokenizer.from_folder(qwen_dir, 64).tokenize(text) == Tokenizer.from_folder(bert_dir, 64).tokenize(text)
