#!/usr/bin/env bash
# Before/after for the optimizer catalogue (issue 33): the per-row update the sparse tables make
# (one ps::ApplyUpdate call per row), with the switch of commit ee0ea15 ("old") and the
# catalogue's function pointer ("new"), same flags as the build (-O3 -ffp-contract=off),
# alternating old/new in each pair. Prints "rep type dim old_ns new_ns" (ns per row update, the
# best of 5 passes over 2M updates). Usage: run.sh [REPS]  (from the repository root's checkout)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); root=$(cd "$here/../../.." && pwd); tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/old/ferry" "$tmp/old/internal"
git -C "$root" show ee0ea15:messages/base/include/ferry/table_spec.h > "$tmp/old/ferry/table_spec.h"
git -C "$root" show ee0ea15:messages/base/include/ferry/status.h > "$tmp/old/ferry/status.h"
git -C "$root" show ee0ea15:ps/server/internal/optimizer.h > "$tmp/old/internal/optimizer.h"
git -C "$root" show ee0ea15:ps/server/src/optimizer.cc > "$tmp/old_optimizer.cc"
flags=(-std=c++20 -O3 -DNDEBUG -ffp-contract=off)
g++ "${flags[@]}" -I "$tmp/old" "$here/rows.cc" "$tmp/old_optimizer.cc" -o "$tmp/old_bin"
g++ "${flags[@]}" -I "$root/messages/base/include" -I "$root/ps/server" "$here/rows.cc" \
    "$root/ps/server/src/optimizer.cc" "$root/messages/base/src/optimizers.cc" \
    "$root/messages/base/src/nearest.cc" "$root/messages/base/src/status.cc" -o "$tmp/new_bin"
echo "rep type dim old_ns new_ns"
for rep in $(seq 1 "${1:-5}"); do
  for t in 0 3; do for d in 16 64; do
    echo "$rep $t $d $("$tmp/old_bin" $t $d) $("$tmp/new_bin" $t $d)"
  done; done
done
