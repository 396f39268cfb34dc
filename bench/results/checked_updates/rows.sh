#!/usr/bin/env bash
# Before/after for the checked update rules on sparse rows (the per-row call SparseShard makes):
# d937474's rules and ps::ApplyUpdate against this tree's rules (target_clones, -fno-math-errno,
# -ffp-contract=off for optimizers.cc, as messages/base/CMakeLists.txt builds it) and
# ps::ApplyUpdateChecked, alternating in each pair. Prints "rep type dim before_ns after_ns".
# Usage: rows.sh [REPS]   (from anywhere in the repository's checkout)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(git -C "$here" rev-parse --show-toplevel); tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old"
git -C "$root" archive d937474 messages/base ps/server/internal/optimizer.h ps/server/src/optimizer.cc |
  tar -x -C "$tmp/old"
flags=(-std=c++20 -O3 -DNDEBUG -ffp-contract=off)
build() {  # $1: source root, $2: output, $3: extra flags for the rules, rest: for rows.cc
  local src=$1 out=$2 rules=$3; shift 3
  g++ "${flags[@]}" $rules -c "$src/messages/base/src/optimizers.cc" -I "$src/messages/base/include" \
      -o "$out.rules.o"
  g++ "${flags[@]}" "$@" -I "$src/messages/base/include" -I "$src/ps/server" "$here/rows.cc" \
      "$src/ps/server/src/optimizer.cc" "$out.rules.o" "$src/messages/base/src/nearest.cc" \
      "$src/messages/base/src/status.cc" -o "$out"
}
build "$tmp/old" "$tmp/before" ""                  # as d937474 built it
build "$root" "$tmp/after" "-fno-math-errno" -DCHECKED
echo "rep type dim before_ns after_ns"
for rep in $(seq 1 "${1:-5}"); do
  for t in 0 3 4; do for d in 16 64; do
    echo "$rep $t $d $("$tmp/before" $t $d) $("$tmp/after" $t $d)"
  done; done
done
