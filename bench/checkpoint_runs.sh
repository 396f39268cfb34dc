#!/bin/sh
# bench/checkpoint_runs.sh — the runs behind bench/results/HISTORY.md's "Checkpoints (issue 14)": RUNS runs of
# ferry-ckpt-bench, each after dd has written the same folder's disk (zeros, 192 MiB and 1536 MiB:
# about the 64 MiB and 512 MiB shards' images; and 1536 MiB of random bytes, in case the disk
# treats zeros apart). Every dd and benchmark file goes into a fresh folder under PARENT, removed
# afterwards.
#
#   bench/checkpoint_runs.sh [BUILD_DIR [OUT_DIR [PARENT [RUNS]]]]
#
# Defaults: build, bench/results/checkpoints, /tmp, 3. Writes OUT_DIR/run-N.json (Google
# Benchmark's JSON), OUT_DIR/run-N.log (its console output: every round's figures, and the
# server's line per checkpoint) and OUT_DIR/dd.txt (each dd's last line).
set -eu
build=${1:-build}
out=${2:-bench/results/checkpoints}
parent=${3:-/tmp}
runs=${4:-3}
bin=$build/bench/ferry-ckpt-bench
[ -x "$bin" ] || { echo "no $bin: cmake --build $build --target ferry-ckpt-bench" >&2; exit 1; }
mkdir -p "$out"
folder=$(mktemp -d "$parent/ferry-ckpt-dd-XXXXXX")
random=$(mktemp /dev/shm/ferry-ckpt-random-XXXXXX)
trap 'rm -rf "$folder" "$random"' EXIT INT TERM
dd if=/dev/urandom of="$random" bs=1M count=1536 status=none
: > "$out/dd.txt"
for run in $(seq 1 "$runs"); do
  for what in zero:192 zero:1536 random:1536; do
    src=/dev/zero
    [ "${what%%:*}" = random ] && src=$random
    count=${what#*:}
    line=$(dd if="$src" of="$folder/ddtest" bs=1M count="$count" conv=fdatasync 2>&1 | tail -n 1)
    rm -f "$folder/ddtest"
    echo "run $run $(date -u +%H:%M:%S) dd if=${src} bs=1M count=$count conv=fdatasync: $line" | tee -a "$out/dd.txt"
  done
  "$bin" --dir="$parent" --benchmark_out="$out/run-$run.json" --benchmark_out_format=json 2>&1 |
    tee "$out/run-$run.log"
done
