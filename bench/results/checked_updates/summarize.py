#!/usr/bin/env python3
"""Before/after of the checked update rules (runs.txt: `opt/` of bench/ferry_bench.cc, 16M
elements, one thread; rounds alternate the binary built before (d937474) and after).
Prints per optimizer each round's after/before ratio and the medians' ratio."""
import re
import statistics
import sys
from collections import defaultdict

times = defaultdict(lambda: defaultdict(list))  # opt -> side -> [ms]
side = None
for line in open(sys.argv[1] if len(sys.argv) > 1 else "runs.txt"):
    m = re.match(r"== (before|after) round (\d+)", line)
    if m:
        side = m.group(1)
        continue
    m = re.match(r"opt/(\w+)/\S+\s+([\d.]+) ms", line)
    if m:
        times[m.group(1)][side].append(float(m.group(2)))
print("| optimizer | before ms (median) | after ms (median) | after / before per round | medians' ratio |")
print("|---|---:|---:|---|---:|")
for opt, t in times.items():
    b, a = t["before"], t["after"]
    ratios = ", ".join(f"{x / y:.2f}" for x, y in zip(a, b))
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"| {opt} | {mb:.1f} | {ma:.1f} | {ratios} | {ma / mb:.2f} |")
