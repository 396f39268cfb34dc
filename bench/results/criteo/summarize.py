"""Recomputes every figure of bench/results/HISTORY.md's "Reading Criteo files" from criteo.json.

    python3 bench/results/criteo/summarize.py [criteo.json]
"""
import json
import os
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "criteo.json")
with open(path) as f:
    runs = [b for b in json.load(f)["benchmarks"] if b.get("run_type") == "iteration"]
rate = {}
eps = {}
for b in runs:
    name = b["run_name"].split("/iterations")[0]
    rate.setdefault(name, []).append(b["bytes_per_second"] / 1e6)
    if "examples_per_s" in b:
        eps.setdefault(name, []).append(b["examples_per_s"] / 1e6)
med = {k: statistics.median(v) for k, v in rate.items()}
print("| | MB/s of text (median) | min | max | million examples/s |")
print("|---|---:|---:|---:|---:|")
for k in ["disk/cold", "cache/read", "gzip/inflate", "parse/plain", "parse/gzip", "parse/cold"]:
    e = "%.2f" % statistics.median(eps[k]) if k in eps else ""
    print("| %s | %.0f | %.0f | %.0f | %s |" % (k, med[k], min(rate[k]), max(rate[k]), e))
print()
print("parse/plain / disk/cold  = %.3f" % (med["parse/plain"] / med["disk/cold"]))
print("parse/plain / cache/read = %.3f" % (med["parse/plain"] / med["cache/read"]))
print("parse/gzip / gzip/inflate = %.3f" % (med["parse/gzip"] / med["gzip/inflate"]))
print("parse/cold / parse/plain = %.3f" % (med["parse/cold"] / med["parse/plain"]))
print("disk/cold / cache/read = %.3f" % (med["disk/cold"] / med["cache/read"]))
