#!/usr/bin/env python3
"""sparse_push.txt: `sparse/push/` of ferry-bench (100,000 Zipf ids a call, an async SGD table,
one in-process server over tcp), rounds alternating the binary before (d937474) and after.
Prints per dim each round's after/before ratio and the medians' ratio."""
import statistics
import sys
from collections import defaultdict

ms = defaultdict(lambda: defaultdict(dict))  # dim -> side -> round -> ms
for line in open(sys.argv[1] if len(sys.argv) > 1 else "sparse_push.txt"):
    rnd, side, name, value = line.split()
    ms[name.split("/")[2]][side][int(rnd)] = float(value)
for dim, t in ms.items():
    rounds = sorted(t["before"])
    ratios = [t["after"][r] / t["before"][r] for r in rounds]
    b, a = statistics.median(t["before"].values()), statistics.median(t["after"].values())
    print(f"{dim}: before {b:.2f} ms, after {a:.2f} ms (medians), medians' ratio {a / b:.2f}; "
          f"per round {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})")
