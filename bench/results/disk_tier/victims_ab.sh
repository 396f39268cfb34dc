#!/bin/bash
# Which rows the RAM tier keeps, before and after TinyLFU's rule (the least pushed of the sample
# demoted, a row taking a victim's place only if pushed more often, else on probation):
# ferry-disk-bench --mode shard from two builds in alternating rounds (the first arm alternating
# too), the same flags. OLD: the commit before the rule (a git worktree built with
# `ninja -C BUILD ferry-disk-bench`), NEW: this tree's. Writes OUT/{old,new}-R.{json,log} and
# OUT/meta.txt; summarize_victims.py OUT prints the medians and the per-round ratios.
#   bench/results/disk_tier/victims_ab.sh OLD_BIN NEW_BIN OUT ROUNDS [ferry-disk-bench flags...]
set -euo pipefail
old=$1 new=$2 out=$3 rounds=$4
shift 4
args=(--mode shard --rows 1000000 --seconds 3 --rounds 2 "$@")
mkdir -p "$out"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "old: $old; new: $new ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- ps bench || echo ' with changes'))"
  echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(lscpu | sed -n 's/^Model name: *//p')"
  echo "command: ferry-disk-bench ${args[*]}"
} > "$out/meta.txt"
for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then order=(old new); else order=(new old); fi
  for arm in "${order[@]}"; do
    bin=$old
    [[ $arm == new ]] && bin=$new
    "$bin" "${args[@]}" > "$out/$arm-$r.json" 2> "$out/$arm-$r.log"
    echo "round $r $arm done"
  done
done
