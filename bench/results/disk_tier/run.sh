#!/bin/bash
# The disk tier's store against the disk and the RAM-only table (bench/disk_tier_bench.cc; RESULTS.md,
# "The disk tier"; `--mode shard` for the tier in the shard, `--mode server` for servers with and
# without disk readers). Writes run-N.json (the bench's JSON), run-N.log (its rounds), meta-N.txt (machine,
# commit, command) and summary-N.txt (summarize.py's ratios) here, N=${RUN:-1}.
#   RUN=2 bench/results/disk_tier/run.sh [BUILD_DIR] [ferry-disk-bench flags...]   (from the repository root)
set -euo pipefail
build=${1:-build}
shift || true
here=$(dirname "$0")
n=${RUN:-1}
command -v fio > /dev/null || { echo "needs fio (Debian: apt-get install fio)" >&2; exit 1; }
args=(--rows 2000000 --seconds 3 --rounds 3 "$@")
{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- ps bench || echo ' (with changes)')"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
  echo "disk: $(df -h --output=source,fstype,size "${TMPDIR:-/var/tmp}" | tail -1)"
  echo "fio: $(fio --version)"
  echo "command: $build/bench/ferry-disk-bench ${args[*]}"
} > "$here/meta-$n.txt"
"$build/bench/ferry-disk-bench" "${args[@]}" > "$here/run-$n.json" 2> "$here/run-$n.log"
/usr/bin/python3 "$here/summarize.py" "$here/run-$n.json" | tee "$here/summary-$n.txt"
