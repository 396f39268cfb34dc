"""Summarizes bench/results/malloc_tuning/runs (run.sh): per benchmark and mode, the median
(min-max) over rounds of the time a call (ms, real time); per round the ratio off / on (how many
times faster the tuned client is); and for push+pull, whose bytes are raw_proc's (the payload
there and back), its speed as a fraction of raw ZeroMQ's in the same run (raw time / Ferry time).

  /usr/bin/python3 bench/results/malloc_tuning/summarize.py bench/results/malloc_tuning
"""
import collections
import glob
import json
import os
import re
import statistics
import sys


def med(xs, fmt="{:.4g}"):
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main(out):
    t = collections.defaultdict(dict)  # (mode, name) -> round -> ms
    for path in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
        mode, rnd = re.match(r"(\w+)-r(\d+)\.json$", os.path.basename(path)).groups()
        with open(path) as fh:
            for b in json.load(fh)["benchmarks"]:
                name = b["name"].split("/iterations")[0]
                unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
                t[(mode, name)][int(rnd)] = b["real_time"] * unit
    names = sorted({n for _, n in t}, key=lambda n: (not n.startswith("raw"), n))
    print("benchmark | ms a call, off | ms a call, on | off / on per round")
    for n in names:
        off, on = t.get(("off", n), {}), t.get(("on", n), {})
        rounds = sorted(set(off) & set(on))
        print(f"{n} | {med(list(off.values()))} | {med(list(on.values()))} | "
              f"{med([off[r] / on[r] for r in rounds], '{:.3f}')}")
    print()
    print("push+pull against raw ZeroMQ in the same run (raw ms / Ferry ms), per round:")
    for size in ("4KiB", "1MiB", "16MiB"):
        raw = f"raw_proc/tcp/{size}"
        pp = f"ps_proc/pushpull/tcp/{size}/1s1w"
        for mode in ("off", "on"):
            r, p = t.get((mode, raw), {}), t.get((mode, pp), {})
            rounds = sorted(set(r) & set(p))
            if rounds:
                print(f"{size} {mode}: {med([r[k] / p[k] for k in rounds], '{:.3f}')}")


if __name__ == "__main__":
    main(sys.argv[1])
