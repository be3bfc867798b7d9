#!/bin/bash
# issue 22 driver: the quality_parity jobs one at a time, from the frozen snapshot /work/snap22.
# Log: /work/runs22/driver.log. Each finished job's result.json is committed to
# $MAIN/benchmarks/results/issue22/jaxembed_<ARM>_s<SEED>.json (only that path).
SNAP=${SNAP:-/work/snap22}
PY=${PY:-/work/main/.venv/bin/python}
R=${R:-/work/runs22}
WD=$R/qp
MAIN=${MAIN:-/work/main}
OPTS=(--steps 400 --batch-size 16 --eval-max-examples 1000 --mteb-tasks ''
      --workdir $WD --curriculum-task-order $R/curriculum/task_order.json
      --curriculum-scores $R/score/scores.npz --mote model.mote.enabled=True)
JOBS="${JOBS:-base:0 curriculum_vanilla:0 curriculum:0 curriculum_balanced:0 ic_clustering:0 mote_clustering:0
      base:1 curriculum_vanilla:1 curriculum:1 curriculum_balanced:1 ic_clustering:1 mote_clustering:1
      base:2 curriculum_vanilla:2 curriculum:2 curriculum_balanced:2 ic_clustering:2 mote_clustering:2}"
export PYTHONPATH=$SNAP TOKENIZERS_PARALLELISM=true
cd $SNAP || exit 1
log() { echo "[$(date -u +%FT%TZ)] $*"; }

ensure_curriculum() {
  [ -f $R/curriculum/task_order.json ] && [ -f $R/score/scores.npz ] && return 0
  # wait for a score run already in flight (its pid file), then (re)run score: it resumes from its cache
  if [ -f $R/score.pid ]; then
    while kill -0 "$(cat $R/score.pid)" 2>/dev/null; do sleep 60; done
  fi
  if [ ! -f $R/score/scores.npz ]; then
    log "score: jaxembed score --config configs/demo.py --out $R/score"
    nice -n 19 $PY -m jaxembed.cli score --config configs/demo.py --out $R/score -q >> $R/score.log 2>&1 || { log "score FAILED"; return 1; }
  fi
  log "curriculum: jaxembed curriculum --scores-dir $R/score --out $R/curriculum"
  nice -n 19 $PY -m jaxembed.cli curriculum --scores-dir $R/score --out $R/curriculum >> $R/curriculum.log 2>&1 || { log "curriculum FAILED"; return 1; }
  commit_curriculum
}

commit_curriculum() {
  local dst=$MAIN/benchmarks/results/issue22
  mkdir -p $dst
  cp $R/curriculum/task_order.json $dst/task_order.json
  local files=(benchmarks/results/issue22/task_order.json)
  local sz=$(stat -c %s $R/score/scores.npz)
  if [ "$sz" -lt 10000000 ]; then cp $R/score/scores.npz $dst/scores.npz; files+=(benchmarks/results/issue22/scores.npz); fi
  [ -f $R/score/score_summary.json ] && cp $R/score/score_summary.json $dst/score_summary.json && files+=(benchmarks/results/issue22/score_summary.json)
  gitcommit "issue 22: curriculum inputs (jaxembed score --config configs/demo.py; jaxembed curriculum, unit dataset)" "${files[@]}"
}

gitcommit() {  # message paths...: commit only these paths (retry while another engineer holds the index lock)
  local msg=$1; shift
  for i in 1 2 3 4 5 6 7 8 9 10; do
    if (cd $MAIN && git add -- "$@" && git commit -q -m "$msg" --only -- "$@") >> $R/git.log 2>&1; then
      log "committed $*"; return 0; fi
    sleep 15
  done
  log "commit FAILED for $* (see $R/git.log)"
}

for job in $JOBS; do
  arm=${job%%:*}; seed=${job##*:}
  out=$MAIN/benchmarks/results/issue22/jaxembed_${arm}_s${seed}.json
  if [ -f $out ]; then log "$job: done already ($out)"; continue; fi
  case $arm in curriculum|curriculum_balanced) ensure_curriculum || { log "$job: skipped (no curriculum files)"; continue; };; esac
  log "$job: start (load $(cut -d' ' -f1-3 /proc/loadavg))"
  t0=$(date +%s)
  if nice -n 19 $PY benchmarks/quality_parity.py --job $job "${OPTS[@]}" >> $R/jobs.log 2>&1; then
    mkdir -p $MAIN/benchmarks/results/issue22
    cp $WD/jaxembed_${arm}_s${seed}/result.json $out
    gitcommit "issue 22: quality_parity $arm seed $seed (400 steps x 16, eval sample 1000, busy CPU)" benchmarks/results/issue22/jaxembed_${arm}_s${seed}.json
    log "$job: done in $(( $(date +%s) - t0 ))s (load $(cut -d' ' -f1-3 /proc/loadavg)): $(python3 -c "import json;d=json.load(open('$out'));print(round(d['average'],2), {k: round(v,2) for k,v in d['groups'].items()})")"
  else
    log "$job: FAILED after $(( $(date +%s) - t0 ))s (see $R/jobs.log)"
  fi
done
log "all jobs processed"
