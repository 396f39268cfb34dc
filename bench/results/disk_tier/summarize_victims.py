#!/usr/bin/env python3
"""victims_ab.sh's runs: for each shard with a disk tier, the RAM tier's misses (rows promoted an
id looked up, over the run's rounds) and ids/s of the builds before (old) and after (new) TinyLFU's
rule, each against the frequency-optimal cache of the same size (Zipf: one minus the mass of the
max_rows most probable ids; uniform: one minus the tier's share); the medians over the runs and
the per-round ratios new/old.
    summarize_victims.py OUT   (standard library only)"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from summarize import median, zipf_top_mass  # noqa: E402


def main():
    out = sys.argv[1]
    runs = {"old": {}, "new": {}}
    for path in sorted(glob.glob(os.path.join(out, "*-*.json"))):
        arm, r = os.path.basename(path)[:-len(".json")].split("-")
        with open(path) as f:
            runs[arm][int(r)] = json.load(f)
    first = next(iter(runs["new"].values()))
    ids = first.get("ids", "zipf1.1")
    print(f"rows {first['rows']:,}, steps of {first['batch']} {ids} ids (a pull and a push); "
          f"{len(runs['old'])} runs of each build, alternating, {len(first['arms']['step/ram']['per_round'])} rounds "
          f"of {first['seconds']} s each")
    print()
    print(f"{'shard':<8} {'max_rows':>9} {'ideal':>7} | {'miss/id old':>11} {'new':>7} {'x ideal':>7} {'->':>2} "
          f"{'x ideal':>7} | {'ids/s old':>10} {'new':>10} {'new/old':>7} {'per round':>17}")
    for shard in ("tier10", "tier1"):
        name = "step/" + shard
        k = first["max_rows"][shard]
        share = k / first["rows"]
        ideal = 1 - (zipf_top_mass(first["rows"], 1.1, k) if ids == "zipf1.1" else share)
        miss = {a: median([sum(d["arms"][name]["promoted_per_id"]) / len(d["arms"][name]["promoted_per_id"])
                           for d in runs[a].values()]) for a in runs}
        rate = {a: median([d["arms"][name]["median"] for d in runs[a].values()]) for a in runs}
        ratios = sorted(runs["new"][r]["arms"][name]["median"] / runs["old"][r]["arms"][name]["median"]
                        for r in runs["new"] if r in runs["old"])
        print(f"{shard:<8} {k:>9,} {ideal:7.4f} | {miss['old']:11.4f} {miss['new']:7.4f} "
              f"{miss['old'] / ideal:7.2f} -> {miss['new'] / ideal:7.2f} | {rate['old']:10,.0f} {rate['new']:10,.0f} "
              f"{rate['new'] / rate['old']:7.3f} {ratios[0]:8.3f}-{ratios[-1]:.3f}")


if __name__ == "__main__":
    main()
