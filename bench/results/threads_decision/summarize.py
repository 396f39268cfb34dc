#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "The server's threads, decided" from grain<G>-threads<T>-round<R>.json.

Per benchmark and variant (grain 2^16 or 2^18, 0 or 1 helper threads): the median and range over
the rounds; Criteo-shaped steps in M unique rows/s (higher is better), dense pushes and
push+pulls in microseconds a call (lower is better). Then, per benchmark, each variant's median
relative to the best variant's (1.000 = the best; larger = worse, in either unit), and the
variant whose worst case over all benchmarks is least bad.
    python3 bench/results/threads_decision/summarize.py [folder]
"""
import glob
import json
import os
import re
import statistics
import sys

folder = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
runs = {}  # (variant, name) -> [value]
units = {}
for path in sorted(glob.glob(os.path.join(folder, "grain*-threads*-round*.json"))):
    m = re.match(r"grain(\d+)-threads(\d+)-round(\d+)\.json", os.path.basename(path))
    variant = f"2^{m.group(1)}/{m.group(2)}"
    for b in json.load(open(path))["benchmarks"]:
        if b.get("run_type") != "iteration" or "error_occurred" in b:
            continue
        name = b["run_name"].split("/iterations")[0]
        if name.startswith("criteo_step"):
            value, unit = b["unique_rows_per_second"] / 1e6, "M unique rows/s"
        else:
            scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]
            value, unit = b["real_time"] * scale, "us a call"
        runs.setdefault((variant, name), []).append(value)
        units[name] = unit
variants = ["2^16/0", "2^16/1", "2^18/0", "2^18/1"]
names = sorted(units)
rounds = {len(v) for v in runs.values()}
print(f"rounds per variant: {sorted(rounds)}")
print("| benchmark | unit | " + " | ".join(f"grain {v.split('/')[0]}, {v.split('/')[1]} helper: median (min-max)" for v in variants) + " |")
print("|---|---|" + "---:|" * len(variants))
worst = {v: 1.0 for v in variants}
relative = {}
for n in names:
    meds = {v: statistics.median(runs[(v, n)]) for v in variants}
    higher_better = units[n] != "us a call"
    best = max(meds.values()) if higher_better else min(meds.values())
    rel = {v: (best / meds[v] if higher_better else meds[v] / best) for v in variants}
    relative[n] = rel
    for v in variants:
        worst[v] = max(worst[v], rel[v])
    cells = [f"{meds[v]:.2f} ({min(runs[(v, n)]):.2f}-{max(runs[(v, n)]):.2f})" for v in variants]
    print(f"| {n} | {units[n]} | " + " | ".join(cells) + " |")
print()
print("| benchmark | " + " | ".join(f"{v} vs best" for v in variants) + " |")
print("|---|" + "---:|" * len(variants))
for n in names:
    print(f"| {n} | " + " | ".join(f"{relative[n][v]:.3f}" for v in variants) + " |")
print("| worst over all | " + " | ".join(f"{worst[v]:.3f}" for v in variants) + " |")
geo = {}
for v in variants:
    prod = 1.0
    for n in names:
        prod *= relative[n][v]
    geo[v] = prod ** (1.0 / len(names))
print("| geometric mean | " + " | ".join(f"{geo[v]:.3f}" for v in variants) + " |")
