"""Summarizes cost_ab.sh's rounds: per benchmark, the median rows/s of each arm and the median,
lowest and highest of the per-round ratios new/old (1.0: no cost; below 1: the new build slower).
    python3 summarize_cost.py DIR ROUNDS"""
import json
import statistics
import sys

folder, rounds = sys.argv[1], int(sys.argv[2])


def rates(path):
    with open(path) as f:
        return {b["name"].split("/iterations")[0]: b["rows_per_second"] for b in json.load(f)["benchmarks"]}


runs = [(rates(f"{folder}/cost-{r}-old.json"), rates(f"{folder}/cost-{r}-new.json")) for r in range(1, rounds + 1)]
print(f"{rounds} rounds, arms alternating; rows/s (median over rounds) and new/old per round")
print(f"{'benchmark':<22} {'old rows/s':>12} {'new rows/s':>12} {'new/old median':>15} {'min':>7} {'max':>7}")
for name in runs[0][0]:
    old = [o[name] for o, _ in runs]
    new = [n[name] for _, n in runs]
    ratios = [n / o for o, n in zip(old, new)]
    print(f"{name:<22} {statistics.median(old):>12,.0f} {statistics.median(new):>12,.0f} "
          f"{statistics.median(ratios):>15.3f} {min(ratios):>7.3f} {max(ratios):>7.3f}")
