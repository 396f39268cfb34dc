#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "Against ferry-ps processes" from run.json: per benchmark the
median (min-max) of bytes_per_second over the repetitions, and each Ferry operation's median over
the median raw ZeroMQ round trip of the same size and placement (ps_proc/ against raw_proc/, ps/
against raw/; payload bytes per second both, as the vs_raw counters count them).
  python3 bench/results/processes/summarize.py [bench/results/processes/run.json]
"""
import json
import os
import re
import statistics
import sys

path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.json")
with open(path) as f:
    data = json.load(f)
rates = {}
for b in data["benchmarks"]:
    if b.get("run_type") != "iteration":
        continue
    name = re.sub(r"/iterations:\d+/real_time(/threads:\d+)?", "", b["run_name"])
    rates.setdefault(name, []).append(b["bytes_per_second"])

print(f"{data['context']['date']}  {data['context']['host_name']}  {data['context']['num_cpus']} cpus")
print("benchmark | reps | GB/s median (min-max) | / raw")
for size in ("4KiB", "1MiB", "16MiB"):
    for where, raw in (("ps_proc", "raw_proc"), ("ps", "raw")):
        raw_name = f"{raw}/tcp/{size}"
        raw_med = statistics.median(rates[raw_name])
        print(f"{raw_name} | {len(rates[raw_name])} | {raw_med / 1e9:.3f} ({min(rates[raw_name]) / 1e9:.3f}-{max(rates[raw_name]) / 1e9:.3f}) | 1")
        for op in ("push", "pull", "pushpull"):
            name = f"{where}/{op}/tcp/{size}/1s1w"
            v = rates[name]
            med = statistics.median(v)
            print(f"{name} | {len(v)} | {med / 1e9:.3f} ({min(v) / 1e9:.3f}-{max(v) / 1e9:.3f}) | {med / raw_med:.3f}")
