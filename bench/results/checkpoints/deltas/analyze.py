#!/usr/bin/env python3
"""The table of RESULTS.md's "Delta checkpoints" from ferry-delta-ckpt-bench's JSON.

  python3 analyze.py run-10M.json

Medians over the rounds. Ratios: a delta's figure / the full checkpoint's of the same round
(median of the rounds' ratios); the write rates against the disk's (raw write + fsync of the full
shard's bytes, in the same round).
"""
import json
import statistics
import sys


def main(path):
    d = json.load(open(path))
    rounds = d["rounds"]
    print(f"{d['rows']:,} rows of dim {d['dim']} ({d['optimizer']}), {len(rounds)} rounds")
    full_mb = statistics.median(r["full"]["bytes"] for r in rounds) / 1e6
    full_pause = statistics.median(r["full"]["pause_s"] for r in rounds)
    full_write = statistics.median(r["full"]["write_s"] for r in rounds)
    raw_rate = statistics.median(r["full"]["bytes"] / r["raw_write_s"] / 1e6 for r in rounds)
    full_rate = statistics.median(r["full"]["bytes"] / r["full"]["write_s"] / 1e6 for r in rounds)
    print(f"| checkpoint | MB written | pause s | write s | pause / full | MB / full | write / full |")
    print("|---|---|---|---|---|---|---|")
    print(f"| full | {full_mb:.1f} | {full_pause:.3f} | {full_write:.3f} | 1 | 1 | 1 |")
    for share in ["0.1", "1", "10", "100"]:
        ds = [r["delta"][share] for r in rounds]
        pause = statistics.median(x["pause_s"] for x in ds)
        write = statistics.median(x["write_s"] for x in ds)
        mb = statistics.median(x["bytes"] for x in ds) / 1e6
        pr = statistics.median(r["delta"][share]["pause_s"] / r["full"]["pause_s"] for r in rounds)
        br = statistics.median(r["delta"][share]["bytes"] / r["full"]["bytes"] for r in rounds)
        wr = statistics.median(r["delta"][share]["write_s"] / r["full"]["write_s"] for r in rounds)
        print(f"| delta, {share}% of rows changed | {mb:.1f} | {pause:.3f} | {write:.3f} | {pr:.4f} | {br:.4f} "
              f"| {wr:.4f} |")
    print(f"full write rate {full_rate:.0f} MB/s = {full_rate / raw_rate:.2f} of the disk's raw write + fsync "
          f"({raw_rate:.0f} MB/s, median of the rounds)")
    m = d["median"]
    print(f"restore: full {m['restore_full_s']:.3f} s, full + 10 deltas of 1% {m['restore_chain_s']:.3f} s "
          f"(x{m['restore_chain_s'] / m['restore_full_s']:.2f}); rounds: full {d['series']['restore_full_s']}, "
          f"chain {d['series']['restore_chain_s']}")


if __name__ == "__main__":
    main(sys.argv[1])
