#!/usr/bin/env python3
"""Recomputes bench/results/HISTORY.md "ipc or tcp on one host" from tcp/runs and ipc/runs (the trainers'
metrics files; run.sh): per configuration, the job's examples/s and the communication per step
over each transport (medians over the rounds, min-max), and ipc / tcp of the job's examples/s per
round.
  python3 bench/results/transport/summarize.py [bench/results/transport]
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "pipeline"))
from summarize import fmt, load, per_run  # noqa: E402

root = sys.argv[1] if len(sys.argv) > 1 else here
tcp, ipc = load(os.path.join(root, "tcp")), load(os.path.join(root, "ipc"))
print("model mode pipeline workers | rounds | tcp examples/s | ipc examples/s | tcp comm ms | ipc comm ms | ipc / tcp")
for key in sorted(tcp):
    rounds = sorted(set(tcp[key]) & set(ipc.get(key, {})))
    t = [per_run(tcp[key][r]) for r in rounds]
    i = [per_run(ipc[key][r]) for r in rounds]
    print(f"{' '.join(map(str, key))} | {len(rounds)} | {fmt([x['eps'] for x in t], 0)} | {fmt([x['eps'] for x in i], 0)} | "
          f"{fmt([x['comm_ms'] for x in t], 3)} | {fmt([x['comm_ms'] for x in i], 3)} | "
          f"{fmt([b['eps'] / a['eps'] for a, b in zip(t, i)], 3)}")
