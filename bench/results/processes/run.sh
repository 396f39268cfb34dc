#!/bin/bash
# ferry-bench against ferry-ps processes (issue 17; bench/results/HISTORY.md "Against ferry-ps processes"):
# dense push, pull and push+pull of 4 KiB, 1 MiB and 16 MiB to a ferry-ps child process (ps_proc/)
# beside the raw ZeroMQ round trip to another process (raw_proc/), and the same in one process
# (ps/ and raw/ over tcp, 1 server, 1 worker), 5 repetitions interleaved at random.
#   BENCH=build/bench/ferry-bench OUT=bench/results/processes bash bench/results/processes/run.sh
set -euo pipefail
BENCH=${BENCH:-build/bench/ferry-bench}
OUT=${OUT:-bench/results/processes}
"$BENCH" --benchmark_filter='^(raw_proc/tcp|ps_proc/(push|pull|pushpull)/tcp|raw/tcp|ps/(push|pull|pushpull)/tcp)/(4KiB|1MiB|16MiB)(/1s1w)?/' \
  --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true \
  --benchmark_out="$OUT/run.json" --benchmark_out_format=json > "$OUT/run.log" 2>&1
