#!/usr/bin/env bash
# A Cloud TPU VM pod (several TPU hosts, "workers"): copy this repository to every worker, install it, start the
# same `jaxembed train` on all workers at once, and collect each worker's log. JAX joins the workers into one run
# (jax.distributed, via jaxembed.parallel.initialize(); JAXEMBED_DISTRIBUTED=on makes it read the pod's worker list
# from the TPU VM metadata).
#
#   launch/tpu_pod.sh [OPTIONS] setup                              copy the code to every worker and install it
#   launch/tpu_pod.sh [OPTIONS] train CONFIG WORKDIR [--config.KEY=VALUE ...]   train on every worker, fetch logs
#   launch/tpu_pod.sh [OPTIONS] run-list FILE                      each line of FILE (jaxembed sweep --mode tpu),
#                                                                  in turn; completed runs are skipped
#   launch/tpu_pod.sh [OPTIONS] logs WORKDIR                       fetch the workers' logs of a run
#
# Options (or environment): --name NAME (TPU_NAME), --zone ZONE (TPU_ZONE), --project P (TPU_PROJECT),
#   --workers N (TPU_WORKERS; default: asked from gcloud), --remote-dir DIR (REMOTE_DIR, default jaxembed, relative
#   to the home folder on the workers), --python PY (REMOTE_PYTHON, default python3), --venv DIR (REMOTE_VENV: create
#   and use a virtualenv on the workers), --sync tar|git (SYNC; default tar: this checkout without .venv / runs;
#   git: clone --git-url URL at --git-ref REF), --log-dir DIR (LOG_DIR, local, default tpu-logs), --detach (start
#   the training in the background on the workers and return; fetch its logs later with `logs`), --dry-run (print
#   the gcloud commands instead of running them).
#
# WORKDIR must be on storage every worker mounts at the same path (Filestore / NFS / gcsfuse): the checkpoints of all
# workers go there, and running `train` again resumes from them. A preempted (spot) pod: recreate it, `setup`, then
# the same `train` command resumes.
set -euo pipefail

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
NAME=${TPU_NAME:-} ZONE=${TPU_ZONE:-} PROJECT=${TPU_PROJECT:-} WORKERS=${TPU_WORKERS:-}
REMOTE_DIR=${REMOTE_DIR:-jaxembed} REMOTE_PYTHON=${REMOTE_PYTHON:-python3} REMOTE_VENV=${REMOTE_VENV:-}
SYNC=${SYNC:-tar} GIT_URL=${GIT_URL:-} GIT_REF=${GIT_REF:-} LOG_DIR=${LOG_DIR:-tpu-logs}
DETACH=0 DRY_RUN=${DRY_RUN:-0}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME=$2; shift 2 ;;
    --zone) ZONE=$2; shift 2 ;;
    --project) PROJECT=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --remote-dir) REMOTE_DIR=$2; shift 2 ;;
    --python) REMOTE_PYTHON=$2; shift 2 ;;
    --venv) REMOTE_VENV=$2; shift 2 ;;
    --sync) SYNC=$2; shift 2 ;;
    --git-url) GIT_URL=$2; shift 2 ;;
    --git-ref) GIT_REF=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --detach) DETACH=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --*) echo "tpu_pod.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
ACTION=${1:-}
[[ $# -gt 0 ]] && shift
die() { echo "tpu_pod.sh: $*" >&2; exit 2; }
[[ -n "$ACTION" ]] || { usage >&2; exit 2; }
[[ -n "$NAME" ]] || die "no TPU name (fix: --name NAME or TPU_NAME=...)"
[[ -n "$ZONE" ]] || die "no zone (fix: --zone ZONE or TPU_ZONE=...)"
[[ "$SYNC" == tar || "$SYNC" == git ]] || die "--sync $SYNC: allowed: tar, git"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GC=(gcloud compute tpus tpu-vm)
LOC=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project "$PROJECT")
if [[ -n "$REMOTE_VENV" ]]; then  # commands run on the workers: $HOME expands there
  if [[ "$REMOTE_VENV" == /* ]]; then VENV_PATH=$(printf '%q' "$REMOTE_VENV"); else VENV_PATH="\$HOME/$(printf '%q' "$REMOTE_VENV")"; fi
  PY="$VENV_PATH/bin/python"
else
  PY="$REMOTE_PYTHON"
fi

q() {  # quote for a shell, readably: 'it'\''s'
  local a out=()
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
  done
  printf '%s' "${out[*]}"
}
run() {  # run (or, with --dry-run, print) one command
  if [[ "$DRY_RUN" == 1 ]]; then printf '+ %s\n' "$(q "$@")"; else "$@"; fi
}
on_all() { run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command "$1" "${@:2}"; }

worker_count() {
  if [[ -n "$WORKERS" ]]; then echo "$WORKERS"; return; fi
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '+ %s\n' "$(q "${GC[@]}" describe "$NAME" "${LOC[@]}" --format='value(networkEndpoints.len())')" >&2
    echo 1; return
  fi
  "${GC[@]}" describe "$NAME" "${LOC[@]}" --format='value(networkEndpoints.len())'
}

do_setup() {
  local install
  if [[ -n "$REMOTE_VENV" ]]; then
    install="$REMOTE_PYTHON -m venv $VENV_PATH && $PY -m pip install -q --upgrade pip"
  else
    install="$PY -m pip install -q --upgrade pip"
  fi
  install+=" && cd $(printf '%q' "$REMOTE_DIR") && $PY -m pip install -q -e '.[tpu]'"
  if [[ "$SYNC" == git ]]; then
    [[ -n "$GIT_URL" ]] || die "--sync git needs --git-url URL"
    local ref=${GIT_REF:-HEAD}
    on_all "if [ -d $(printf '%q' "$REMOTE_DIR")/.git ]; then git -C $(printf '%q' "$REMOTE_DIR") fetch -q origin; \
else git clone -q $(printf '%q' "$GIT_URL") $(printf '%q' "$REMOTE_DIR"); fi && \
git -C $(printf '%q' "$REMOTE_DIR") checkout -q $(printf '%q' "$ref") && $install"
  else
    local tarball=${TMPDIR:-/tmp}/jaxembed-src-$$.tgz
    run tar -czf "$tarball" -C "$REPO" --exclude=./.venv --exclude=./.git --exclude=./runs --exclude=./tpu-logs \
      --exclude='*.egg-info' --exclude='__pycache__' --exclude=./.pytest_cache --exclude=./.ruff_cache .
    run "${GC[@]}" scp "$tarball" "$NAME:jaxembed-src.tgz" "${LOC[@]}" --worker=all
    on_all "mkdir -p $(printf '%q' "$REMOTE_DIR") && tar -xzf jaxembed-src.tgz -C $(printf '%q' "$REMOTE_DIR") && \
rm jaxembed-src.tgz && $install"
    run rm -f "$tarball"
  fi
}

remote_train_cmd() {  # CONFIG WORKDIR OVERRIDES... -> the command line every worker runs
  local run_name log overrides=""
  run_name=$(basename "$2")
  log=$(printf '%q' "logs/$run_name.log")
  if [[ $# -gt 2 ]]; then overrides=$(printf ' %q' "${@:3}"); fi
  local env="JAXEMBED_DISTRIBUTED=on TF_CPP_MIN_LOG_LEVEL=\${TF_CPP_MIN_LOG_LEVEL:-1} PYTHONUNBUFFERED=1 \
JAX_COMPILATION_CACHE_DIR=\${JAX_COMPILATION_CACHE_DIR:-\$HOME/.cache/jaxembed/jax}"
  local train="$env $PY -m jaxembed.cli train --config $(printf '%q' "$1") --workdir $(printf '%q' "$2")$overrides"
  local head="cd $(printf '%q' "$REMOTE_DIR") && mkdir -p logs && echo \"=== \$(date '+%F %T') \$(hostname)\" >> $log"
  if [[ "$DETACH" == 1 ]]; then
    echo "$head && (nohup setsid bash -c $(printf '%q' "$train >> $log 2>&1") > /dev/null 2>&1 < /dev/null &)"
  else
    echo "$head && { $train 2>&1 | tee -a $log; exit \${PIPESTATUS[0]}; }"
  fi
}

fetch_logs() {  # WORKDIR -> LOG_DIR/NAME/RUN/worker-I.log for every worker
  local run_name dest n i
  run_name=$(basename "$1")
  dest="$LOG_DIR/$NAME/$run_name"
  run mkdir -p "$dest"
  n=$(worker_count)
  for ((i = 0; i < n; i++)); do
    run "${GC[@]}" scp "$NAME:$REMOTE_DIR/logs/$run_name.log" "$dest/worker-$i.log" "${LOC[@]}" --worker="$i" \
      || echo "tpu_pod.sh: no log on worker $i" >&2
  done
  echo "tpu_pod.sh: logs of $run_name in $dest/" >&2
}

do_train() {  # CONFIG WORKDIR OVERRIDES...
  [[ $# -ge 2 ]] || die "train needs CONFIG WORKDIR [--config.KEY=VALUE ...]"
  local arg
  for arg in "${@:3}"; do [[ "$arg" == --config.*=* ]] || die "'$arg' is not an override (fix: --config.KEY=VALUE)"; done
  [[ "$2" == /* ]] || echo "tpu_pod.sh: WORKDIR $2 is relative: each worker writes its own copy under ~/$REMOTE_DIR;" \
    "use an absolute path on storage every worker mounts" >&2
  local run_name live rc
  run_name=$(basename "$2")
  live="$LOG_DIR/$NAME/$run_name/live"
  run mkdir -p "$live"
  echo "tpu_pod.sh: $run_name on every worker of $NAME; live output per worker: $live/<worker>.log" >&2
  set +e
  on_all "$(remote_train_cmd "$@")" --output-directory "$live"
  rc=$?
  set -e
  if [[ "$DETACH" == 1 ]]; then
    echo "tpu_pod.sh: started in the background; fetch the logs later: $0 --name $NAME --zone $ZONE logs $2" >&2
    return "$rc"
  fi
  fetch_logs "$2"
  [[ "$DRY_RUN" == 1 ]] && return 0
  case $rc in 0) echo "tpu_pod.sh: $run_name completed" >&2 ;;
    143) echo "tpu_pod.sh: $run_name stopped at a checkpoint (SIGTERM); run the same command to resume" >&2 ;;
    *) echo "tpu_pod.sh: $run_name failed (exit $rc); see the logs" >&2 ;; esac
  return "$rc"
}

do_run_list() {  # FILE: lines `CONFIG WORKDIR [--config.K=V ...]` (shell-quoted), # comments
  [[ $# -eq 1 && -f "$1" ]] || die "run-list needs a FILE written by jaxembed sweep --mode tpu"
  local line failed=0 n=0 rc last=""
  while IFS= read -r line || [[ -n "$line" ]]; do
    [[ -z "${line// }" || "$line" == \#* ]] && continue
    eval "set -- $line"   # the file is shell-quoted by jaxembed sweep
    n=$((n + 1)) last=$2
    local check=("${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=0 --command
                 "grep -qs '\"status\": \"completed\"' $(printf '%q' "$2/summary.json")")
    if [[ "$DRY_RUN" == 1 ]]; then
      run "${check[@]}"
    elif "${check[@]}" < /dev/null; then
      echo "tpu_pod.sh: run $n $(basename "$2") already completed, skipped" >&2; continue
    fi
    set +e; do_train "$@" < /dev/null; rc=$?; set -e
    if [[ $rc == 143 ]]; then echo "tpu_pod.sh: stopped at run $n; run the same command to resume" >&2; return 143; fi
    [[ $rc == 0 ]] || failed=$((failed + 1))
  done < "$1"
  echo "tpu_pod.sh: $n runs, $failed failed${last:+; report: jaxembed sweep report $(dirname "$last")}" >&2
  [[ $failed == 0 ]]
}

case "$ACTION" in
  setup) do_setup ;;
  train) do_train "$@" ;;
  run-list) do_run_list "$@" ;;
  logs) [[ $# -eq 1 ]] || die "logs needs WORKDIR"; fetch_logs "$1" ;;
  *) die "unknown action '$ACTION' (setup, train, run-list, logs; see --help)" ;;
esac
