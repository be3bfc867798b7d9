#!/bin/bash
# Multi-node GPU training with SLURM. srun starts `jaxembed train` once per task; each task joins the run through
# jax.distributed, configured from the SLURM environment by jaxembed.parallel.initialize(). Checkpoints go to
# WORKDIR, which must be on storage every node mounts at the same path. Before the time limit (USR1, see --signal)
# the trainers save a checkpoint and the job requeues itself; the requeued job resumes from that checkpoint.
#
#   sbatch launch/slurm_gpu.sh CONFIG WORKDIR [--config.KEY=VALUE ...]
#   sbatch --nodes=4 launch/slurm_gpu.sh configs/demo.py /shared/runs/demo --config.plan.global_batch_size=1024
#   sbatch --ntasks-per-node=8 launch/slurm_gpu.sh ...    # one process per GPU instead of one per node
#   DRY_RUN=1 launch/slurm_gpu.sh CONFIG WORKDIR ...      # print the srun command and environment, run nothing
#
# Submit from the repository root (the job finds .venv/bin/jaxembed there) or set JAXEMBED_REPO / JAXEMBED.
# Options on the sbatch command line override the #SBATCH lines below; the output folder must exist.
#
#SBATCH --job-name=jaxembed
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=16
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
#
# The lines above, in order: the job's name; machines; processes per machine (1 = one process drives all the GPUs of
# its node; set it to the GPUs per node for one process per GPU); GPUs per machine; CPU cores per process (data
# loading, tokenization; divide when running one process per GPU); wall-clock limit; allow requeueing (preemption,
# node failure, and this script's own requeue); send USR1 to this script 300 s before the limit (time to write a
# checkpoint); append the log of every restart to one file; that log (%x name, %j job id).
#
# Environment (optional):
#   JAXEMBED         command to run (default: JAXEMBED_REPO/.venv/bin/jaxembed, else `jaxembed` on PATH)
#   JAXEMBED_REPO    repository root (default: the submit directory, when it holds launch/slurm_gpu.sh)
#   MAX_REQUEUES     restarts this script may request (default 20; SLURM_RESTART_COUNT counts them)
#   REQUEUE_ON_TERM  1: also requeue after SIGTERM (preemption where PreemptMode=CANCEL); default 0, since SLURM
#                    requeues preempted --requeue jobs itself and `scancel` means stop
#   SRUN_ARGS        extra srun options, e.g. "--cpu-bind=none"
#   MEM_FRACTION / PREALLOCATE   XLA_PYTHON_CLIENT_MEM_FRACTION / XLA_PYTHON_CLIENT_PREALLOCATE
#   JAX_COMPILATION_CACHE_DIR    persistent compilation cache (default WORKDIR/jax_cache, shared by every node)
#
# How a checkpoint is requested: USR1 (or SIGTERM) reaches this script; it runs `scancel --signal=TERM JOB_ID`,
# which delivers SIGTERM to every task of the srun step; each trainer saves a checkpoint and exits 143; then this
# script runs `scontrol requeue JOB_ID` (USR1 only). Why not `kill -TERM <srun pid>`: srun turns a SIGTERM into
# SIGKILL for its tasks ("forcing job termination"), which would lose the progress since the last checkpoint.
set -euo pipefail

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
DRY_RUN=${DRY_RUN:-0}
if [[ "${1:-}" == "--dry-run" ]]; then DRY_RUN=1; shift; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then usage; exit 0; fi
if [[ $# -lt 2 ]]; then usage >&2; exit 2; fi
CONFIG=$1 WORKDIR=$2
shift 2
for arg in "$@"; do
  if [[ "$arg" != --config.*=* ]]; then
    echo "slurm_gpu.sh: '$arg' is not an override (fix: --config.KEY=VALUE)" >&2; exit 2
  fi
done
if [[ -z "${SLURM_JOB_ID:-}" && "$DRY_RUN" != 1 ]]; then
  echo "slurm_gpu.sh: not inside a SLURM job (fix: sbatch launch/slurm_gpu.sh CONFIG WORKDIR ..., or DRY_RUN=1)" >&2
  exit 2
fi

if [[ -n "${JAXEMBED_REPO:-}" ]]; then REPO=$JAXEMBED_REPO
elif [[ -n "${SLURM_SUBMIT_DIR:-}" && -f "$SLURM_SUBMIT_DIR/launch/slurm_gpu.sh" ]]; then REPO=$SLURM_SUBMIT_DIR
else REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
fi
if [[ -z "${JAXEMBED:-}" ]]; then
  if [[ -x "$REPO/.venv/bin/jaxembed" ]]; then JAXEMBED="$REPO/.venv/bin/jaxembed"; else JAXEMBED=jaxembed; fi
fi
read -r -a LAUNCH <<< "$JAXEMBED"
MAX_REQUEUES=${MAX_REQUEUES:-20}
REQUEUE_ON_TERM=${REQUEUE_ON_TERM:-0}
RESTARTS=${SLURM_RESTART_COUNT:-0}
JOB=${SLURM_JOB_ID:-DRYRUN}

# Layout: nodes x tasks per node, GPUs per node. One task per node: it drives every GPU of the node; one task per
# GPU: each drives its own. jaxembed.parallel.initialize() picks the devices accordingly.
NODES=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
TPN=${SLURM_NTASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}
TPN=${TPN%%(*}; TPN=${TPN%%,*}
GPN=${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE:-}}
GPN=${GPN##*:}
if [[ -z "$GPN" && -n "${SLURM_JOB_GPUS:-}" ]]; then GPN=$(awk -F, '{print NF}' <<< "$SLURM_JOB_GPUS"); fi
if [[ "$TPN" == 1 ]]; then LAYOUT="one process per node${GPN:+ (all $GPN GPUs)}"
elif [[ -n "$GPN" && "$TPN" == "$GPN" ]]; then LAYOUT="one process per GPU"
else LAYOUT="$TPN processes per node${GPN:+ on $GPN GPUs} (expected 1 or ${GPN:-the GPU count})"
fi

export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$WORKDIR/jax_cache}"
export PYTHONUNBUFFERED=1
if [[ -n "${MEM_FRACTION:-}" ]]; then export XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION"; fi
if [[ -n "${PREALLOCATE:-}" ]]; then export XLA_PYTHON_CLIENT_PREALLOCATE="$PREALLOCATE"; fi
read -r -a EXTRA <<< "${SRUN_ARGS:-}"
SRUN=(srun --label --unbuffered ${EXTRA[@]+"${EXTRA[@]}"})
CMD=("${LAUNCH[@]}" train --config "$CONFIG" --workdir "$WORKDIR" "$@")
LOG="$WORKDIR/logs/slurm-$JOB.log"

echo "slurm_gpu.sh: job $JOB (restart $RESTARTS, at most $MAX_REQUEUES), $NODES node(s), $LAYOUT"
if [[ "$DRY_RUN" == 1 ]]; then
  env | grep -E '^(TF_CPP_MIN_LOG_LEVEL|PYTHONUNBUFFERED|JAX_[A-Z_]+|XLA_[A-Z_]+|JAXEMBED_[A-Z_]+)=' | sort \
    | sed 's/^/export /'
  printf '%q ' "${SRUN[@]}" "${CMD[@]}"; echo "2>&1 | tee -a $(printf '%q' "$LOG")"
  echo "on USR1: scancel --signal=TERM $JOB; wait; scontrol requeue $JOB (if restarts < MAX_REQUEUES)"
  exit 0
fi

mkdir -p "$WORKDIR/logs"
REQUEUE=0
SIGNALLED=
checkpoint() {  # SIGTERM to every task of the step (not to srun: srun would SIGKILL them)
  SIGNALLED=$1
  echo "slurm_gpu.sh: $1 at $(date '+%F %T'): asking the trainers to save a checkpoint and stop" >&2
  scancel --signal=TERM "$SLURM_JOB_ID" || echo "slurm_gpu.sh: scancel failed" >&2
}
on_usr1() { REQUEUE=1; checkpoint USR1; }
on_term() { if [[ "$REQUEUE_ON_TERM" == 1 ]]; then REQUEUE=1; fi; checkpoint TERM; }
trap on_usr1 USR1
trap on_term TERM

echo "=== $(date '+%F %T') job $JOB restart $RESTARTS: $(printf '%q ' "${SRUN[@]}" "${CMD[@]}")" >> "$LOG"
"${SRUN[@]}" "${CMD[@]}" > >(tee -a "$LOG") 2>&1 &
SRUN_PID=$!
while true; do  # `wait` returns early when a trapped signal arrives: wait again until srun has exited
  set +e; wait "$SRUN_PID"; RC=$?; set -e
  if ! kill -0 "$SRUN_PID" 2>/dev/null; then break; fi
done
if (( RC > 128 )) && [[ -n "$SIGNALLED" ]]; then  # the signal and the exit crossed: ask once more for srun's status
  set +e; wait "$SRUN_PID"; R2=$?; set -e
  if (( R2 != 127 )); then RC=$R2; fi
fi

case $RC in 0) STATUS=completed ;; 143) STATUS=preempted ;; *) STATUS=failed ;; esac
if [[ "$STATUS" != completed && "$REQUEUE" == 1 ]]; then
  if (( RESTARTS < MAX_REQUEUES )); then STATUS=requeued; else
    echo "slurm_gpu.sh: not requeued: $RESTARTS restarts already (MAX_REQUEUES=$MAX_REQUEUES); run sbatch again to" \
         "resume" >&2
  fi
fi
printf '{"status": "%s", "returncode": %d, "launcher": "slurm_gpu.sh", "job": "%s", "restart": %d, "updated": "%s"}\n' \
  "$STATUS" "$RC" "$JOB" "$RESTARTS" "$(date '+%FT%T')" > "$WORKDIR/status.json"
echo "slurm_gpu.sh: srun exited $RC ($STATUS); log $LOG" >&2
if [[ "$STATUS" == requeued ]]; then
  echo "slurm_gpu.sh: scontrol requeue $SLURM_JOB_ID (restart $((RESTARTS + 1)) resumes from the last checkpoint)" >&2
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$RC"
