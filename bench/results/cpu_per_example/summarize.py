#!/usr/bin/env python3
"""Recomputes bench/results/cpu_per_example/summary.txt from runs.jsonl (run.py): per size, the
CPU microseconds per example of the extra steps (long run minus short run of the same round),
servers' and workers' apart, and the cluster's over one process's (size 0, --local) in the same
round; median (min-max) over the rounds.
  python3 bench/results/cpu_per_example/summarize.py [bench/results/cpu_per_example]
"""
import json
import os
import statistics
import sys


def fmt(v, digits):
    return f"{statistics.median(v):.{digits}f} ({min(v):.{digits}f}-{max(v):.{digits}f})"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    runs = [json.loads(line) for line in open(os.path.join(root, "runs.jsonl")) if line.strip()]
    by = {}  # (round, size) -> {steps: run}
    for r in runs:
        by.setdefault((r["round"], r["size"]), {})[r["steps"]] = r
    per_example = {}  # size -> round -> (total, server, worker) us per example
    for (rnd, size), pair in sorted(by.items()):
        if len(pair) != 2:
            continue
        short, long_ = (pair[s] for s in sorted(pair))
        examples = (long_["steps"] - short["steps"]) * long_["batch"] * max(size, 1)
        server = (long_["server_cpu_s"] - short["server_cpu_s"]) / examples * 1e6
        worker = (long_["worker_cpu_s"] - short["worker_cpu_s"]) / examples * 1e6
        per_example.setdefault(size, {})[rnd] = (server + worker, server, worker)
    local = per_example.get(0, {})
    print("size (servers x workers) | rounds | CPU us / example | servers' | workers' | over one process's")
    for size in sorted(per_example):
        rows = per_example[size]
        rounds = sorted(rows)
        total = [rows[r][0] for r in rounds]
        server = [rows[r][1] for r in rounds]
        worker = [rows[r][2] for r in rounds]
        ratio = [rows[r][0] / local[r][0] for r in rounds if r in local]
        name = "one process (--local)" if size == 0 else f"{size}x{size}"
        print(f"{name} | {len(rounds)} | {fmt(total, 2)} | {fmt(server, 2)} | {fmt(worker, 2)} | "
              f"{fmt(ratio, 3) if size and ratio else '-'}")


if __name__ == "__main__":
    main()
