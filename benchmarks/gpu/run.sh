#!/usr/bin/env bash
# The GPU benchmark's entry on the device machine (benchmarks/gpu/README.md has the command):
#   bash benchmarks/gpu/run.sh OUT [bench.py arguments]
#   bash benchmarks/gpu/run.sh OUT --diag [diag.py arguments]   (the step-time diagnosis, benchmarks/gpu/diag.py)
# Installs the carried wheels (.whl: jaxembed's dependencies missing from the image) into /tmp/site, puts them, the
# carried all-MiniLM-L6-v2 tokenizer stub and the repository on PYTHONPATH, points jaxembed at the carried data,
# and runs benchmarks/gpu/bench.py, its output also in OUT/log.txt. GPU_BENCH_NO_WHEELS=1 skips the install (the
# CPU test, whose environment has every dependency).
set -u
OUT=${1:?usage: run.sh OUT [bench.py arguments]}
shift
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ "${GPU_BENCH_NO_WHEELS:-0}" != 1 ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "run.sh: installing the carried wheels failed" | tee -a "$OUT/log.txt"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD/.gpu_carry/site${PYTHONPATH:+:$PYTHONPATH}
  export JAXEMBED_DATA=$PWD/.gpu_carry/data
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
set -o pipefail
if [ "${1:-}" = --diag ]; then  # the step-time diagnosis instead: bash run.sh OUT --diag [diag.py arguments]
  shift
  XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9} \
    "$PY" benchmarks/gpu/diag.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/log.txt"
  exit
fi
"$PY" benchmarks/gpu/bench.py --out "$OUT" "$@" 2>&1 | tee -a "$OUT/log.txt"
