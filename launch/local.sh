#!/usr/bin/env bash
# One machine, all its local devices (CPU cores, every GPU, or a single-host TPU VM), one process.
#
#   launch/local.sh [--dry-run] CONFIG WORKDIR [--config.KEY=VALUE ...]
#   launch/local.sh configs/demo.py:tiny runs/tiny --config.optim.lr=5e-5
#
# Runs `jaxembed train --config CONFIG --workdir WORKDIR [overrides]`. Running the same command again resumes from
# the last checkpoint in WORKDIR (the trainer does this by itself). Output is shown and appended to WORKDIR/train.log;
# the outcome goes to WORKDIR/status.json. SIGTERM / Ctrl-C reach the trainer, which saves a checkpoint and exits 143.
#
# Environment (all optional):
#   JAXEMBED          the command to run (default: .venv/bin/jaxembed of this repository, else `jaxembed` on PATH)
#   MEM_FRACTION      GPU: share of GPU memory JAX may take (XLA_PYTHON_CLIENT_MEM_FRACTION, JAX's default 0.75)
#   PREALLOCATE       GPU: false = allocate GPU memory on demand (XLA_PYTHON_CLIENT_PREALLOCATE)
#   TF_CPP_MIN_LOG_LEVEL  XLA / TSL C++ log level (default 1: warnings and errors)
#   JAX_COMPILATION_CACHE_DIR  persistent compilation cache (default ~/.cache/jaxembed/jax): a resumed run does not
#                     compile again
#   JAX_PLATFORMS     e.g. cpu to ignore the accelerator
set -euo pipefail

usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; }
DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi
if [[ $# -lt 2 ]]; then usage >&2; exit 2; fi
CONFIG=$1 WORKDIR=$2
shift 2
for arg in "$@"; do
  if [[ "$arg" != --config.*=* ]]; then
    echo "local.sh: '$arg' is not an override (fix: --config.KEY=VALUE)" >&2; exit 2
  fi
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z "${JAXEMBED:-}" ]]; then
  if [[ -x "$REPO/.venv/bin/jaxembed" ]]; then JAXEMBED="$REPO/.venv/bin/jaxembed"; else JAXEMBED=jaxembed; fi
fi
read -r -a LAUNCH <<< "$JAXEMBED"

export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/jaxembed/jax}"
export JAXEMBED_DISTRIBUTED=off   # one process, even inside a SLURM allocation
if [[ -n "${MEM_FRACTION:-}" ]]; then export XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION"; fi
if [[ -n "${PREALLOCATE:-}" ]]; then export XLA_PYTHON_CLIENT_PREALLOCATE="$PREALLOCATE"; fi

CMD=("${LAUNCH[@]}" train --config "$CONFIG" --workdir "$WORKDIR" "$@")
if [[ $DRY_RUN == 1 ]]; then
  env | grep -E '^(TF_CPP_MIN_LOG_LEVEL|JAX_[A-Z_]+|XLA_[A-Z_]+|JAXEMBED_[A-Z_]+)=' | sort | sed 's/^/export /'
  printf '%q ' "${CMD[@]}"; echo "2>&1 | tee -a $(printf '%q' "$WORKDIR/train.log")"
  exit 0
fi

mkdir -p "$WORKDIR"
LOG="$WORKDIR/train.log"
echo "=== $(date '+%F %T') $(hostname): $(printf '%q ' "${CMD[@]}")" >> "$LOG"

CHILD=
forward() {  # pass the signal on; the trainer saves a checkpoint and exits 143
  if [[ -n "$CHILD" ]]; then kill -s "$1" "$CHILD" 2>/dev/null || true; fi
}
trap 'forward TERM' TERM
trap 'forward TERM' INT   # TERM, not INT: a second SIGINT would interrupt the checkpoint save
"${CMD[@]}" > >(tee -a "$LOG") 2>&1 &
CHILD=$!
while true; do  # `wait` returns early when a trapped signal arrives: wait again until the trainer has exited
  set +e; wait "$CHILD"; RC=$?; set -e
  if ! kill -0 "$CHILD" 2>/dev/null; then break; fi
done
if (( RC > 128 )); then  # the signal and the exit crossed: ask once more for the trainer's own status
  set +e; wait "$CHILD"; R2=$?; set -e
  if (( R2 != 127 )); then RC=$R2; fi
fi
case $RC in 0) STATUS=completed ;; 143) STATUS=preempted ;; *) STATUS=failed ;; esac
printf '{"status": "%s", "returncode": %d, "launcher": "local.sh", "host": "%s", "updated": "%s"}\n' \
  "$STATUS" "$RC" "$(hostname)" "$(date '+%FT%T')" > "$WORKDIR/status.json"
echo "local.sh: $STATUS (exit $RC); log $LOG" >&2
exit "$RC"
