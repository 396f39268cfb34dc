#!/bin/bash
# The step pipeline's measurement (bench/results/HISTORY.md "The step pipeline"): ferry-trainer against
# separate ferry-ps processes on tcp loopback, as users run it, with --pipeline none (the path
# before it: push, wait, pull), exchange (the default) and prefetch (async only), beside the same
# training in one process (--local); the MLP on Fashion-MNIST (1 epoch, batch 64) and the ctr
# model on synthetic data (--steps 400, batch 256); 1 and 2 workers on one server. Every
# configuration once per round, in a random order each round, ROUNDS rounds.
# BLAS_THREADS (0: OpenBLAS's own, 2 here) goes to every trainer's --blas-threads; MODELS picks
# the models (default "mlp ctr"; mlp_wide is the MLP with --hidden 256,1024), PIPELINES the
# modes (default "none exchange prefetch"), LOCAL=0
# leaves out the --local runs; TRANSPORT=ipc binds the servers to ipc:// paths instead of tcp
# loopback; FIRST_ROUND numbers the rounds from there (default 1); WORKERS the worker counts
# (default "1 2"). A mode NAME_layers in PIPELINES is --pipeline NAME --push-by-layer.
#   BIN=build/bin OUT=bench/results/pipeline ROUNDS=3 bash bench/results/pipeline/run.sh
set -euo pipefail
BIN=${BIN:-build/bin}
OUT=${OUT:-bench/results/pipeline}
ROUNDS=${ROUNDS:-3}
BLAS_THREADS=${BLAS_THREADS:-0}
MODELS=${MODELS:-mlp ctr}
PIPELINES=${PIPELINES:-none exchange prefetch}
LOCAL=${LOCAL:-1}
TRANSPORT=${TRANSPORT:-tcp}
FIRST_ROUND=${FIRST_ROUND:-1}
WORKERS=${WORKERS:-1 2}
mkdir -p "$OUT/runs"

model_flags() {
  case $1 in
    mlp) echo "--model mlp --epochs 1 --batch 64 --blas-threads $BLAS_THREADS" ;;
    mlp_wide) echo "--model mlp --hidden 256,1024 --epochs 1 --batch 64 --blas-threads $BLAS_THREADS" ;;
    ctr) echo "--model ctr --steps 400 --batch 256 --ctr-train 200000 --ctr-test 5000 --blas-threads $BLAS_THREADS" ;;
  esac
}

pipeline_flags() {
  case $1 in
    *_layers) echo "--pipeline ${1%_layers} --push-by-layer" ;;
    *) echo "--pipeline $1" ;;
  esac
}

# run MODEL MODE PIPELINE WORKERS ROUND
run() {
  local model=$1 mode=$2 pipeline=$3 workers=$4 round=$5
  local name="$model-$mode-$pipeline-${workers}w-r$round"
  local flags
  flags=$(model_flags "$model")
  if [ "$pipeline" = local ]; then
    # shellcheck disable=SC2086
    "$BIN/ferry-trainer" --local --device cpu --quiet $flags --metrics-out "$OUT/runs/$name-{rank}.json" > /dev/null
    return
  fi
  local endpoint="tcp://127.0.0.1:$((20000 + RANDOM % 20000))"
  [ "$TRANSPORT" = ipc ] && endpoint="ipc:///tmp/ferry-pipeline-$$-$RANDOM.sock"
  "$BIN/ferry-ps" --bind "$endpoint" --num-workers "$workers" > "$OUT/runs/$name-ps.log" 2>&1 &
  local ps=$! pids=() r
  for ((r = 0; r < workers; r++)); do
    # shellcheck disable=SC2086
    "$BIN/ferry-trainer" --servers "$endpoint" --rank $r --num-workers "$workers" --device cpu --quiet \
      --consistency "$mode" $(pipeline_flags "$pipeline") $flags --metrics-out "$OUT/runs/$name-{rank}.json" > /dev/null &
    pids+=($!)
  done
  local failed=0
  for r in "${pids[@]}"; do wait "$r" || failed=1; done
  kill "$ps"
  wait "$ps" 2> /dev/null || true
  [ $failed = 0 ] || { echo "failed: $name" >&2; exit 1; }
}

CONFIGS=()
for model in $MODELS; do
  [ "$LOCAL" = 1 ] && CONFIGS+=("$model sync local 1")
  for w in $WORKERS; do
    for p in $PIPELINES; do
      case $p in prefetch*) ;; *) CONFIGS+=("$model sync $p $w") ;; esac
      CONFIGS+=("$model async $p $w")
    done
  done
done
for ((round = FIRST_ROUND; round < FIRST_ROUND + ROUNDS; round++)); do
  while read -r c; do
    # shellcheck disable=SC2086
    run $c "$round"
  done < <(printf '%s\n' "${CONFIGS[@]}" | shuf)
  echo "round $round done"
done
