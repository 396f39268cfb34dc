#!/bin/bash
# bench/results/paired/check_cost.sh — what the server's NaN/Inf check of a push costs: ps_paired/
# push and push+pull of 1 MiB and 16 MiB against a ferry-ps built with nocheck.patch applied, run
# with and without FERRY_EXPERIMENT_NO_CHECK (the two arms alternating, which goes first rotating).
#   git apply bench/results/paired/nocheck.patch && ninja -C build ferry-ps ferry-bench
#   BUILD=build OUT=bench/results/paired ROUNDS=4 bash bench/results/paired/check_cost.sh
#   git apply -R bench/results/paired/nocheck.patch && ninja -C build ferry-ps
set -euo pipefail
BUILD=${BUILD:-build}
OUT=${OUT:-bench/results/paired}
ROUNDS=${ROUNDS:-4}
bench=$BUILD/bench/ferry-bench
grep -q FERRY_EXPERIMENT_NO_CHECK ps/server/src/handlers/dense.cc || { echo "apply nocheck.patch first" >&2; exit 1; }
for ((r = 1; r <= ROUNDS; ++r)); do
  arms=(check nocheck)
  [ $((r % 2)) -eq 0 ] && arms=(nocheck check)
  for arm in "${arms[@]}"; do
    flag=()
    [ "$arm" = nocheck ] && flag=(FERRY_EXPERIMENT_NO_CHECK=1)
    env "${flag[@]}" timeout 600 "$bench" --benchmark_filter='^ps_paired/(push|pushpull)/tcp/(1|16)MiB' \
      --benchmark_out="$OUT/$arm-r$r.json" > "$OUT/$arm-r$r.log" 2>&1
  done
done
