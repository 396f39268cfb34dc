#!/usr/bin/env bash
# bench/gpu/torch_front.sh PACK [OUT_DIR] — ferry.torch on a GPU, on a machine prepared from a
# bench/gpu/pack.sh folder (or any tree built with nvcc and the Python package, as PACK/build):
#   1. builds the Python package for this machine's python3 (bench/gpu/build_python.sh), unless
#      PACK/build/python/ferry holds one already;
#   2. tests/e2e/test_torch_gpu.py: the model on the GPU against a CPU reference, and the bits of
#      two sync workers sharing the GPU repeated;
#   3. examples/dlrm.py through ferry-launch (2 servers on tcp loopback), --device cuda against
#      --device cpu, one worker and two, the example's small model and a wide one, and the same
#      model with torch's own nn.EmbeddingBag in one process (--mode local) on each device:
#      examples/s, the step's split (pull / push / compute) and the test AUC.
# Usage: bench/gpu/torch_front.sh PACK [OUT_DIR]; STEPS (400), PYTHON (python3).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PACK=$(cd "$1" && pwd)
OUT=${2:-$REPO/bench/results/gpu/runs/torch-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
say() { echo "[torch] $*" | tee -a "$OUT/log.txt"; }
if [[ -d $PACK/lib ]]; then export LD_LIBRARY_PATH=$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
export PYTHONPATH=$PACK/build/python${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ! ls "$PACK"/build/python/ferry/_ferry.*so > /dev/null 2>&1; then
  PYTHON=$PY "$REPO/bench/gpu/build_python.sh" "$PACK" > "$OUT/build_python.txt" 2>&1
  say "build_python.sh: exit $? ($(tail -1 "$OUT/build_python.txt"))"
fi
say "$("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
       torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>&1)"

(cd "$REPO/tests/e2e" && FERRY_BUILD_DIR=$PACK/build timeout 300 "$PY" -m unittest -v test_torch_gpu \
  > "$OUT/test_torch_gpu.txt" 2>&1)
say "test_torch_gpu (exit $?): $(grep -E '^(OK|FAILED)' "$OUT/test_torch_gpu.txt")"

SMALL=()
WIDE=(--bottom 512,256,16 --top 1024,1024,512)
dlrm() {  # NAME WORKERS (0: --mode local, no servers) FLAGS...
  local name=$1 workers=$2
  shift 2
  local start=$SECONDS cmd
  if [[ $workers == 0 ]]; then
    cmd=("$PY" "$REPO/examples/dlrm.py" --mode local)
  else
    cmd=("$PY" "$REPO/launch/ferry-launch" --num-ps 2 --num-workers "$workers" --bin-dir "$PACK/build"
         --base-port 0 --log-dir "$OUT/$name" --max-restarts 0 -- "$PY" "$REPO/examples/dlrm.py")
  fi
  timeout 300 "${cmd[@]}" --steps "${STEPS:-400}" --log-every 100 --metrics-out "$OUT/$name-{rank}.jsonl" "$@" \
    > "$OUT/$name.txt" 2>&1
  say "$name: exit $?, $((SECONDS - start)) s: $(grep -h 'final:' "$OUT/$name.txt" | tail -1)"
}
for dev in cuda cpu; do
  for model in small wide; do
    if [[ $model == small ]]; then flags=("${SMALL[@]}"); else flags=("${WIDE[@]}"); fi
    dlrm "dlrm_${model}_${dev}_1w" 1 --device "$dev" "${flags[@]}"
    dlrm "dlrm_${model}_${dev}_2w" 2 --device "$dev" "${flags[@]}"
    dlrm "local_${model}_${dev}" 0 --device "$dev" "${flags[@]}"
  done
done
