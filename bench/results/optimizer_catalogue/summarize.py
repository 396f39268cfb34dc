#!/usr/bin/env python3
"""Medians of results.txt (run.sh's output): per (optimizer, dim), the median ns per row update of
old and new and the median of the per-pair ratios new/old; then the median ratio over all pairs."""
import statistics
import sys

NAMES = {0: "sgd", 3: "adam"}
path = sys.argv[1] if len(sys.argv) > 1 else __file__.rsplit("/", 1)[0] + "/results.txt"
rows = [line.split() for line in open(path) if line[0].isdigit()]
cases = {}
for rep, t, d, old, new in rows:
    cases.setdefault((int(t), int(d)), []).append((float(old), float(new)))
ratios = []
print("optimizer dim  old_ns(median) new_ns(median) new/old(median of pairs) pairs")
for (t, d), pairs in sorted(cases.items()):
    r = [n / o for o, n in pairs]
    ratios += r
    print(f"{NAMES[t]:9} {d:3}  {statistics.median(o for o, _ in pairs):14.1f} "
          f"{statistics.median(n for _, n in pairs):14.1f} {statistics.median(r):24.3f} {len(pairs)}")
print(f"all pairs: median new/old {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
      f"{sum(r > 1 for r in ratios)} of {len(ratios)} pairs slower")
