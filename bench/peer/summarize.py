#!/usr/bin/env python3
"""Ferry against ps-lite: the folder bench/peer/run.sh wrote, as text.

Per operation and size: each arm's ms per call (per worker: with several workers, the mean of
their times in a round), median (min-max) over the rounds; Ferry's speed over ps-lite's per round
(ps-lite's ms over Ferry's: above 1, Ferry is faster), then its median (min-max); and each arm's
share of raw ZeroMQ's payload rate, computed as bench/ferry_bench.cc computes `vs_raw` (which
bench/results/dense_pieces/vs_raw.py reads): the call's payload bytes per second over those of
raw_proc/tcp/<size> in the same round, where a push or a pull moves the tensor once, a push+pull
and a raw round trip twice; with W workers, all workers' bytes over their mean time (ferry-bench's
aggregate), against one raw pair. Then the share of raw ZeroMQ moving the same bytes: a push over
raw_proc_up/tcp/<size> (the frame one way, an empty reply), a pull over raw_proc_down/tcp/<size>
(an empty request, the frame back), a push+pull over the round trip (folders from before
raw_proc_up/ and raw_proc_down/ existed have no such table). Sparse calls have no raw counterpart.
Output depends on the folder's files only (bench/results/check_summaries.sh recomputes it).
  /usr/bin/python3 bench/peer/summarize.py OUT
"""
import glob
import json
import os
import re
import statistics
import sys

SIZES = {1024: "4KiB", 262144: "1MiB", 4194304: "16MiB"}
# (label, Google Benchmark name in both binaries, floats, times the tensor travels per call)
OPS = ([(f"pull_dense/{SIZES[n]}", f"BM_PullDense/{n}/real_time", n, 1) for n in SIZES] +
       [(f"push_dense/{SIZES[n]}", f"BM_PushDense/{n}/real_time", n, 1) for n in SIZES] +
       [(f"pushpull_dense/{SIZES[n]}", f"BM_PushPullDense/{n}/real_time", n, 2) for n in SIZES] +
       # Ferry only (PullDenseView, PushPullDenseView): the values left where they arrived.
       [(f"pull_dense_view/{SIZES[n]}", f"BM_PullDenseView/{n}/real_time", n, 1) for n in SIZES] +
       [(f"pushpull_dense_view/{SIZES[n]}", f"BM_PushPullDenseView/{n}/real_time", n, 2) for n in SIZES] +
       [("pull_sparse/100k_ids_dim16", "BM_PullSparse/real_time", None, 0),
        ("push_sparse/100k_ids_dim16", "BM_PushSparse/real_time", None, 0),
        ("pull_sparse_distinct/100k_ids_dim16", "BM_PullSparseDistinct/real_time", None, 0),
        ("push_sparse_distinct/100k_ids_dim16", "BM_PushSparseDistinct/real_time", None, 0)])
# ps-lite is always given its keys sorted and distinct (its API's contract): its one sparse call
# is both rows' ps-lite side. Ferry's BM_PullSparse deduplicates the ids on every call (the
# default, SparseIds::kMayRepeat); BM_PullSparseDistinct says they are distinct (kDistinct).
PSLITE_NAME = {"BM_PullSparseDistinct/real_time": "BM_PullSparse/real_time",
               "BM_PushSparseDistinct/real_time": "BM_PushSparse/real_time"}
TO_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
FILE = re.compile(r"^(?P<arm>[a-z0-9_]+)-r(?P<round>[0-9]+)(?:-w(?P<worker>[0-9]+))?\.json$")


def read_ms(path):
    """{benchmark name: ms per iteration} of one Google Benchmark JSON file; failed runs left out."""
    out = {}
    for b in json.load(open(path))["benchmarks"]:
        if b.get("error_occurred") or b.get("run_type", "iteration") != "iteration":
            continue
        out[b["name"].replace("/iterations:" + str(b["iterations"]), "")] = b["real_time"] * TO_MS[b["time_unit"]]
    return out


def load(folder, meta):
    """times[arm][round][op label] = per-worker ms (mean of the workers, all of whom must have it);
    raw[round][floats] = ms per raw round trip; one_way[round][(direction, floats)] = ms per raw
    one-way call, direction "up" or "down"."""
    files = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        m = FILE.match(os.path.basename(path))
        if m:
            files.setdefault((m["arm"], int(m["round"])), []).append(read_ms(path))
    times, raw, one_way = {}, {}, {}
    for (arm, rnd), runs in sorted(files.items()):
        if arm == "raw":
            for n, size in SIZES.items():
                if f"raw_proc/tcp/{size}/real_time" in runs[0]:
                    raw.setdefault(rnd, {})[n] = runs[0][f"raw_proc/tcp/{size}/real_time"]
                for direction in ("up", "down"):
                    name = f"raw_proc_{direction}/tcp/{size}/real_time"
                    if name in runs[0]:
                        one_way.setdefault(rnd, {})[(direction, n)] = runs[0][name]
            continue
        for label, name, _, _ in OPS:
            if arm == "pslite":
                name = PSLITE_NAME.get(name, name)
            got = [r[name] for r in runs if name in r]
            if len(got) == meta["workers"]:
                times.setdefault(arm, {}).setdefault(rnd, {})[label] = statistics.fmean(got)
    return times, raw, one_way


def cell(values, digits=3):
    if not values:
        return "-"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main(folder):
    meta = json.load(open(os.path.join(folder, "meta.json")))
    times, raw, one_way = load(folder, meta)
    arms = [a for a in meta["arms"] if a != "raw"]
    ferries = [a for a in arms if a != "pslite"]
    rounds = range(1, meta["rounds"] + 1)
    w = meta["workers"]
    peer = "pslite" in arms
    print(f"Ferry against {'ps-lite' if peer else 'raw ZeroMQ'}: {meta['servers']} server(s) and {w} worker(s) "
          f"per system, {meta['rounds']} round(s), Google Benchmark min time {meta['min_time_s']:g} s, "
          f"{meta['host_cores']} cores")
    print(f"Ferry source {meta['ferry_source_head'][:12]}"
          + (f", ps-lite {meta['pslite_head'][:12]}" if peer else "") + "; arms: " + ", ".join(meta["arms"]))

    def series(arm, label):
        return [times[arm][r][label] for r in rounds if label in times.get(arm, {}).get(r, {})]

    # The operations some arm measured (a folder from before an operation existed has none of it).
    ops = [op for op in OPS if any(series(a, op[0]) for a in arms)]

    print()
    print("ms per call (per worker), median (min-max) over rounds; raw: ms per round trip of one frame of that size")
    print(f"{'operation':28s}" + "".join(f" {a:>24s}" for a in arms) + f" {'raw round trip':>24s}")
    for label, _, n, _ in ops:
        raw_ms = [raw[r][n] for r in rounds if n is not None and n in raw.get(r, {})]
        print(f"{label:28s}" + "".join(f" {cell(series(a, label)):>24s}" for a in arms) + f" {cell(raw_ms):>24s}")

    pairs = ([(f, "pslite") for f in ferries] if peer else []) + ([("ferry", ferries[1])] if len(ferries) > 1 else [])
    for fast, slow in pairs:
        print()
        print(f"{fast} speed over {slow}'s ({slow} ms / {fast} ms; above 1: {fast} faster): median (min-max); per round")
        for label, _, _, _ in ops:
            per = [times[slow][r][label] / times[fast][r][label] for r in rounds
                   if label in times.get(slow, {}).get(r, {}) and label in times.get(fast, {}).get(r, {})]
            if per or slow == "pslite":  # an older Ferry lacks the newer calls: no row
                print((f"{label:28s} {cell(per):>24s}   " + " ".join(f"{x:.3f}" for x in per)).rstrip())

    # The same arm's calls with and without the copy into the caller's buffer, round by round.
    views = [(label, label.replace("_view/", "/")) for label, _, _, _ in ops if "_view/" in label]
    for a in ferries:
        if not any(series(a, v) for v, _ in views):
            continue
        print()
        print(f"{a}: the values left where they arrived over the copying call (copy ms / view ms; above 1: the view "
              "is faster): median (min-max); per round")
        for view, copy in views:
            per = [times[a][r][copy] / times[a][r][view] for r in rounds
                   if view in times.get(a, {}).get(r, {}) and copy in times.get(a, {}).get(r, {})]
            print((f"{view:28s} {cell(per):>24s}   " + " ".join(f"{x:.3f}" for x in per)).rstrip())

    def share_table(title, share):
        """A row per dense operation: each arm's share(arm, label, n, moves, round) over the rounds
        (None: not measured that round)."""
        print()
        print(title)
        print(f"{'operation':28s}" + "".join(f" {a:>24s}" for a in arms))
        for label, _, n, moves in ops:
            if n is None:
                continue
            row = []
            for a in arms:
                got = [share(a, label, n, moves, r) for r in rounds if label in times.get(a, {}).get(r, {})]
                row.append(cell([x for x in got if x is not None]))
            print(f"{label:28s}" + "".join(f" {c:>24s}" for c in row))

    share_table("share of raw ZeroMQ's payload rate (raw_proc/tcp/<size> of the same round), median (min-max)",
                lambda a, label, n, moves, r: (w * moves * raw[r][n] / (2 * times[a][r][label])
                                               if n in raw.get(r, {}) else None))

    # The yardstick that moves what the call moves (a push one way, a pull the other way).
    def same_bytes_ms(label, n, r):
        if label.startswith("push_dense/"):
            return one_way.get(r, {}).get(("up", n))
        if label.startswith("pull_dense"):
            return one_way.get(r, {}).get(("down", n))
        return raw.get(r, {}).get(n)

    if one_way:
        share_table("share of raw ZeroMQ moving the same bytes (a push: raw_proc_up/tcp/<size>, the frame one way and "
                    "an empty reply; a pull: raw_proc_down/tcp/<size>; a push+pull: the round trip), median (min-max)",
                    lambda a, label, n, moves, r: (w * same_bytes_ms(label, n, r) / times[a][r][label]
                                                   if same_bytes_ms(label, n, r) is not None else None))
        print(f"{'raw one way, ms per call':28s}")
        for direction in ("up", "down"):
            for n, size in SIZES.items():
                ms = [one_way[r][(direction, n)] for r in rounds if (direction, n) in one_way.get(r, {})]
                print(f"  {direction + ' ' + size:26s} {cell(ms):>24s}")
    missing = [f"{a}: {label}" for a in arms for label, _, _, _ in ops if not series(a, label)]
    if missing:
        print()
        print("not measured (absent from every round, or failed): " + "; ".join(missing))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
