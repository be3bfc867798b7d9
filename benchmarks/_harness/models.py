"""The models of the throughput benchmarks: all-MiniLM-L6-v2 (its real weights), and sentence-transformers folders
with random weights of a BERT-base-size and a Qwen2-0.5B-size config (both tools load the very same folder), and
the synthetic token ids of the fixed-length setting."""

from __future__ import annotations

from pathlib import Path

BERT_BASE = dict(model_type="bert", vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                 hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, layer_norm_eps=1e-12, pad_token_id=0)
QWEN2_05B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, max_position_embeddings=32768, rope_theta=1e6,
                 rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=True, attention_dropout=0.0,
                 use_sliding_window=False, sliding_window=None, max_window_layers=24)
MODELS = {"minilm": None, "bert-base": BERT_BASE, "qwen2-0.5b": QWEN2_05B}


def model_folder(name: str, cache: Path) -> Path:
    """all-MiniLM-L6-v2's folder, or a sentence-transformers folder with a random-weight model of that size
    (written once; transformers' default initialisation, seed 0; mean pooling + normalisation; the MiniLM
    tokenizer, which only has to load: the benchmark feeds token ids)."""
    from jaxembed import paths

    if name == "minilm":
        return paths.demo_model_dir()
    out = cache / name
    if (out / "modules.json").exists():
        return out
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    cfg = dict(MODELS[name])
    hf_dir = out.with_name(out.name + ".hf")
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model(**cfg))
    model.save_pretrained(hf_dir)
    AutoTokenizer.from_pretrained(str(paths.demo_model_dir())).save_pretrained(hf_dir)
    tr = models.Transformer(str(hf_dir), max_seq_length=512)
    st = SentenceTransformer(modules=[tr, models.Pooling(cfg["hidden_size"], "mean"), models.Normalize()],
                             device="cpu")
    st.save(str(out))
    import shutil

    shutil.rmtree(hf_dir)
    return out


def synthetic_ids(rows: int, length: int, vocab: int, seed: int):
    """int32 [rows, length] token ids in [1000, vocab), distinct rows (no false negatives to mask)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(1000, min(vocab, 30000), size=(rows, length), dtype=np.int32)
