#!/bin/bash
# bench/results/HISTORY.md "The caller reads its own replies": bench/results/before_after/run.sh (two
# ferry-bench binaries alternating, which first chosen at random each round) over the small and
# large round trips, Ferry's and raw ZeroMQ's, in one process and between processes.
#   BEFORE=/path/to/b8f6fcb/ferry-bench AFTER=/path/to/74f2730/ferry-bench ROUNDS=9 \
#     OUT=bench/results/client_drive bash bench/results/client_drive/run.sh   (and OUT=.../run2)
# no_notify/ is the same with ROUNDS=11, BEFORE the 74f2730 binary, AFTER that code without the
# I/O thread's wake in Submit, and NO_NOTIFY=1 (the 4 KiB push+pull cases and their raw baselines).
set -euo pipefail
FILTER='^(raw/tcp/(4KiB|16MiB)|raw_proc/tcp/(4KiB|16MiB)|ps/pushpull/tcp/(4KiB|16MiB)/(1s1w|2s2w)|ps_proc/(push|pull|pushpull)/tcp/(4KiB|16MiB))'
if [ "${NO_NOTIFY:-0}" = 1 ]; then
  FILTER='^(raw_proc/tcp/4KiB|ps_proc/pushpull/tcp/4KiB|raw/tcp/4KiB|ps/pushpull/tcp/4KiB/1s1w)'
fi
export FILTER
exec bash "$(dirname "$0")/../before_after/run.sh"
