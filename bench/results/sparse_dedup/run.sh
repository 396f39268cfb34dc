#!/bin/bash
# The client's deduplication of sparse ids (ShareTable), before and after its slots were
# prefetched and its shares sized once: ferry-client-bench's sparse calls (100,000 distinct ids of
# dim 16, deduplicated by default, and said distinct as a control) against one ferry-ps process
# started afresh each round, and ferry-bench's sparse/ and criteo_step/ rows (Zipf ids that repeat,
# servers in the process), the two binaries of each alternating, which first chosen at random.
# OUT/client/ and OUT/bench/ get before-R.json and after-R.json (before_after/summarize.py reads them).
#   CB_BEFORE=/tmp/cb-before CB_AFTER=build/bench/ferry-client-bench FB_BEFORE=/tmp/fb-before \
#     FB_AFTER=build/bench/ferry-bench PS=build/bin/ferry-ps OUT=bench/results/sparse_dedup ROUNDS=6 \
#     bash bench/results/sparse_dedup/run.sh
set -euo pipefail
ROUNDS=${ROUNDS:-6}
mkdir -p "$OUT/client" "$OUT/bench"
for ((r = 1; r <= ROUNDS; r++)); do
  log=$(mktemp)
  timeout 600 "$PS" --bind tcp://127.0.0.1:0 > "$log" 2>&1 &
  ps=$!
  for _ in $(seq 50); do grep -q "tcp://" "$log" && break; sleep 0.1; done
  ep=$(grep -o "tcp://127.0.0.1:[0-9]*" "$log" | head -1)
  for which in $(printf 'before\nafter\n' | shuf); do
    cb=$CB_BEFORE fb=$FB_BEFORE
    [ "$which" = after ] && cb=$CB_AFTER fb=$FB_AFTER
    "$cb" --servers="$ep" --benchmark_filter='Sparse' --benchmark_min_time=0.5 \
      --benchmark_out="$OUT/client/$which-$r.json" --benchmark_out_format=json > /dev/null 2>&1
    "$fb" --benchmark_filter='^(sparse/(pull|push)/dim16|criteo_step/(pull|push)/together/(1s1w|2s1w))' \
      --benchmark_out="$OUT/bench/$which-$r.json" --benchmark_out_format=json > /dev/null 2>&1
    echo "round $r $which done"
  done
  kill "$ps"
  wait "$ps" 2> /dev/null || true
  rm -f "$log"
done
