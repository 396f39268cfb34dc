#!/bin/bash
# ferry.torch's measurement (bench/results/HISTORY.md "PyTorch on Ferry: the DLRM"): examples/dlrm.py as
# users run it, through ferry-launch against ferry-ps processes on tcp loopback, beside the same
# model with local nn.EmbeddingBag tables in one process, and the Python path beside
# ferry-trainer's ctr model of the same sizes. Configurations, each once per round in a random
# order, ROUNDS rounds:
#   dlrm_local      dlrm.py --mode local (torch's EmbeddingBag and Adam, no servers)
#   dlrm_1x1        dlrm.py on 1 ferry-ps x 1 worker (embeddings and MLPs on the server)
#   dlrm_2x2        dlrm.py on 2 ferry-ps x 2 workers
#   ctr_py_1x1      dlrm.py --arch ctr (ferry-trainer's ctr model in ferry.torch) on 1 x 1
#   ctr_cpp_1x1     ferry-trainer --model ctr on 1 x 1, the same sizes, optimizer, data and batch
#   ctr_py_prefetch_1x1  ctr_py_1x1 with --prefetch (the next batch's rows pulled during a step;
#                   sync: the same results)
#   ctr_py_wide_1x1, ctr_cpp_wide_1x1  the same pair with a wider model and batch: embeddings of
#                   64, a 512,256 tower, batch 2048 (more arithmetic per step, as much overhead)
#   ctr_py_before_1x1  ctr_py_1x1 with the ferry package of the build BEFORE (a build folder, or
#                   a copy of one with another ferry.torch): before and after in one run
# Every process computes on one thread (torch --threads 1, ferry-trainer --blas-threads 1): the
# two paths do the same arithmetic per step on the same cores.
# CONFIGS picks configurations (default: all).
#   BUILD=build OUT=bench/results/torch_dlrm ROUNDS=5 bash bench/results/torch_dlrm/run.sh
set -euo pipefail
BUILD=${BUILD:-build}
OUT=${OUT:-bench/results/torch_dlrm}
ROUNDS=${ROUNDS:-5}
STEPS=${STEPS:-400}
PY=${PY:-/usr/bin/python3}
mkdir -p "$OUT/runs"
DATA="--ctr-train 200000 --ctr-test 5000 --batch 512 --steps $STEPS"
PY_FLAGS="$DATA --threads 1 --log-every 100 --optimizer adam --lr 0.002 --dense-lr 0.002"
CPP_FLAGS="--model ctr --optimizer adam --lr 0.002 --blas-threads 1 --device cpu --quiet"
SMALL="--emb-dim 16 --bottom 64,16 --top 64,32"
WIDE="--ctr-train 200000 --ctr-test 5000 --batch 2048 --steps $((STEPS / 4)) --emb-dim 64"

launch() {  # NUM_PS NUM_WORKERS NAME -- ARGS
  local ps=$1 workers=$2 name=$3
  shift 4
  "$PY" launch/ferry-launch --num-ps "$ps" --num-workers "$workers" --bin-dir "$BUILD" --base-port 0 \
    --metrics off -- "$@" > "$OUT/runs/$name.log" 2>&1 || { echo "failed: $name (see $OUT/runs/$name.log)" >&2; exit 1; }
}

run() {  # CONFIG ROUND
  local config=$1 round=$2 name="$1-r$2"
  local metrics="$OUT/runs/$name-{rank}.json"
  # shellcheck disable=SC2086
  case $config in
    dlrm_local) PYTHONPATH=$BUILD/python "$PY" examples/dlrm.py --mode local $PY_FLAGS \
                  --metrics-out "${metrics/\{rank\}/0}" > "$OUT/runs/$name.log" 2>&1 ;;
    dlrm_1x1) launch 1 1 "$name" -- "$PY" examples/dlrm.py $PY_FLAGS --metrics-out "$metrics" ;;
    dlrm_2x2) launch 2 2 "$name" -- "$PY" examples/dlrm.py $PY_FLAGS --metrics-out "$metrics" ;;
    ctr_py_1x1) launch 1 1 "$name" -- "$PY" examples/dlrm.py --arch ctr $PY_FLAGS $SMALL --metrics-out "$metrics" ;;
    ctr_py_before_1x1) BUILD=${BEFORE:?set BEFORE to the build to compare against} \
                         launch 1 1 "$name" -- "$PY" examples/dlrm.py --arch ctr $PY_FLAGS $SMALL --metrics-out "$metrics" ;;
    ctr_cpp_1x1) launch 1 1 "$name" -- $CPP_FLAGS $DATA --emb-dim 16 --hidden 64,32 --metrics-out "$metrics" ;;
    ctr_py_prefetch_1x1) launch 1 1 "$name" -- "$PY" examples/dlrm.py --arch ctr --prefetch $PY_FLAGS $SMALL \
                           --metrics-out "$metrics" ;;
    ctr_py_wide_1x1) launch 1 1 "$name" -- "$PY" examples/dlrm.py --arch ctr $PY_FLAGS $WIDE --bottom 64,64 --top 512,256 --metrics-out "$metrics" ;;
    ctr_cpp_wide_1x1) launch 1 1 "$name" -- $CPP_FLAGS $WIDE --hidden 512,256 --metrics-out "$metrics" ;;
  esac
}

read -r -a CONFIGS <<< "${CONFIGS:-dlrm_local dlrm_1x1 dlrm_2x2 ctr_py_1x1 ctr_cpp_1x1 ctr_py_wide_1x1 ctr_cpp_wide_1x1}"
{
  echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results' || echo ' (dirty)')"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "torch $("$PY" -c 'import torch; print(torch.__version__)')"
  echo "rounds $ROUNDS steps $STEPS configs ${CONFIGS[*]}"
  [[ -z "${BEFORE:-}" ]] || echo "before $BEFORE: $(cat "$BEFORE/VERSION" 2>/dev/null || echo '?')"
} > "$OUT/run.log"
for ((round = 1; round <= ROUNDS; round++)); do
  for config in $(printf '%s\n' "${CONFIGS[@]}" | shuf); do
    echo "round $round: $config" >> "$OUT/run.log"
    run "$config" "$round"
  done
done
"$PY" "$(dirname "$0")/summarize.py" "$OUT" > "$OUT/summary.txt"
cat "$OUT/summary.txt"
