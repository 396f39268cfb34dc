#!/usr/bin/env bash
# bench/gpu/run.sh — the GPU measurements of issue 31, repeatable on any machine with an NVIDIA
# GPU and a tree built with nvcc (./build.sh build):
#   1. the CUDA tests (ctest -R 'Cuda|cuda': the kernels against their CPU twins, the trainer's
#      CUDA device, training on the GPU against the CPU device, --push-by-layer on the GPU);
#   2. ferry-gpu-bench: every kernel, the models' GEMMs and host<->device copies against the
#      GPU's limits measured in the same run;
#   3. training through ferry-launch (2 servers on tcp loopback): the Fashion-MNIST MLP and the
#      synthetic ctr model, 2 workers sharing the GPU, the same again (sync: the same bits?), the
#      same on the CPU twin, and 1 worker alone; the GPU runs with FERRY_DEVICE_TIMING=1, so their
#      metrics split a step's device time into host->device, compute and device->host, and by call;
#      the MLP also with other seeds on both devices (MORE_SEEDS, "2 3") and with --push-by-layer;
#   4. the rest of the test suite with the GPU visible (RUN_ALL_TESTS=0 skips it).
# Then summarize.py prints the table bench/RESULTS.md quotes.
#
# Usage: bench/gpu/run.sh [BUILD_DIR] [OUT_DIR]
#   MLP_EPOCHS (2), CTR_STEPS (1500), TEST_TIMEOUT_S (240): the sizes of the runs;
#   MORE_SEEDS ("2 3"), SKIP_BENCH (0), MLP (1: the MLP runs, which need Fashion-MNIST), RUN_ALL_TESTS (1):
#   what runs. BUILD_DIR may be a bench/gpu/pack.sh folder's build/ (its lib/ beside it is then
#   put on LD_LIBRARY_PATH; without CMake's files there, the tests run without ctest).
#   PYTHON (python3): the interpreter for the launcher and the summary (standard library only).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$REPO/build}" && pwd)
OUT=${2:-$REPO/bench/results/gpu/runs/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
if [[ -d $BUILD/../lib && -d $BUILD/../pylink ]]; then  # a pack.sh folder
  export LD_LIBRARY_PATH=$(cd "$BUILD/../lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
say() { echo "[gpu] $*" | tee -a "$OUT/log.txt"; }

if ! nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1; then
  say "no NVIDIA GPU here (nvidia-smi -L failed): nothing to measure"
  exit 3
fi
nvidia-smi >> "$OUT/nvidia-smi.txt" 2>&1
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader)"
say "commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?'), build $BUILD, out $OUT"

# 1. The CUDA tests (without ctest, or CMake's files, the three programs that hold them).
if command -v ctest > /dev/null && [[ -f $BUILD/CTestTestfile.cmake ]]; then
  timeout 300 ctest --test-dir "$BUILD" -R 'Cuda|cuda' -j 4 --output-on-failure -V > "$OUT/ctest_cuda.txt" 2>&1
  say "CUDA tests (exit $?): $(grep -E 'tests passed|tests failed' "$OUT/ctest_cuda.txt")"
else
  for t in tests/unit/kernels/ferry_kernels_cuda_test tests/cluster/trainer/trainer_cuda_train_test \
           "tests/trainer_options_test --gtest_filter=*Cuda*"; do
    timeout 300 $BUILD/$t >> "$OUT/ctest_cuda.txt" 2>&1
    say "$t (no ctest here): exit $?"
  done
fi
say "  passed: $(grep -c '\[       OK \]' "$OUT/ctest_cuda.txt"), skipped: $(grep -c '\[  SKIPPED \]' "$OUT/ctest_cuda.txt")"

# 2. The kernels against the GPU's limits (SKIP_BENCH=1: not this time).
if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
  timeout 300 "$BUILD/bench/ferry-gpu-bench" --json "$OUT/gpu_bench.jsonl" > "$OUT/gpu_bench.txt" 2>&1
  say "ferry-gpu-bench: exit $?"
fi

# 3. Training through the launcher.
MLP=(--model mlp --hidden 256,128 --optimizer adam --lr 0.001 --batch 64 --consistency sync
     --epochs "${MLP_EPOCHS:-2}" --log-every 0)
CTR=(--model ctr --optimizer adam --lr 0.001 --batch 256 --consistency sync --steps "${CTR_STEPS:-1500}"
     --seed 1 --log-every 0)
train() {  # NAME WORKERS DEVICE TIMING FLAGS...
  local name=$1 workers=$2 device=$3 timing=$4
  shift 4
  local start=$SECONDS
  FERRY_DEVICE_TIMING=$timing timeout 300 "$PY" "$REPO/launch/ferry-launch" --num-ps 2 --num-workers "$workers" \
    --bin-dir "$BUILD" --base-port 0 --log-dir "$OUT/$name" --max-restarts 0 -- \
    --device "$device" --metrics-out "$OUT/$name/metrics{rank}.jsonl" "$@" > "$OUT/$name.txt" 2>&1
  say "$name: exit $?, $((SECONDS - start)) s"
}
if [[ ${MLP:-1} == 1 ]]; then
  train mlp_gpu_2w 2 cuda 1 "${MLP[@]}" --seed 1
  train mlp_gpu_2w_again 2 cuda 0 "${MLP[@]}" --seed 1
  train mlp_cpu_2w 2 cpu 0 "${MLP[@]}" --seed 1
  for seed in ${MORE_SEEDS-2 3}; do  # other initialisations: how far apart runs of one device land
    train "mlp_gpu_2w_seed$seed" 2 cuda 0 "${MLP[@]}" --seed "$seed"
    train "mlp_cpu_2w_seed$seed" 2 cpu 0 "${MLP[@]}" --seed "$seed"
  done
  train mlp_gpu_2w_bylayer 2 cuda 1 "${MLP[@]}" --seed 1 --push-by-layer
  train mlp_gpu_1w 1 cuda 1 "${MLP[@]}" --seed 1
fi
train ctr_gpu_2w 2 cuda 1 "${CTR[@]}"
train ctr_gpu_2w_again 2 cuda 0 "${CTR[@]}"
train ctr_cpu_2w 2 cpu 0 "${CTR[@]}"
train ctr_gpu_1w 1 cuda 1 "${CTR[@]}"

# 4. Everything else, with the GPU visible.
if [[ "${RUN_ALL_TESTS:-1}" == 1 ]] && command -v ctest > /dev/null && [[ -f $BUILD/CTestTestfile.cmake ]]; then
  timeout "${TEST_TIMEOUT_S:-240}" ctest --test-dir "$BUILD" -E 'Cuda|cuda' -j "$(nproc)" --timeout 200 \
    > "$OUT/ctest_all.txt" 2>&1
  say "the other tests (exit $?): $(grep -E 'tests passed|tests failed' "$OUT/ctest_all.txt")"
  grep -E '^\s+[0-9]+ - ' "$OUT/ctest_all.txt" | head -40 | tee -a "$OUT/log.txt"
fi

"$PY" "$REPO/bench/gpu/summarize.py" "$OUT" | tee "$OUT/summary.txt"
