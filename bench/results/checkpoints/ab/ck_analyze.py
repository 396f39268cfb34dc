"""Prints the before/after table of the checkpoint A/B (bench/results/HISTORY.md) from pairN-{before,after}.json."""
import collections, json, statistics, sys

d = sys.argv[1]
KEYS = {"pause": ["snapshot_ms", "memcpy_warm_ms", "memcpy_fresh_ms", "snapshot_vs_memcpy"], "write": ["ckpt_write_s", "disk_write_s", "ckpt_vs_disk"]}
vals = collections.defaultdict(lambda: collections.defaultdict(dict))
for i in range(1, 5):
    for v in ("before", "after"):
        for b in json.load(open(f"{d}/pair{i}-{v}.json"))["benchmarks"]:
            name = b["name"].split("/iterations")[0]
            for k, x in b.items():
                if isinstance(x, (int, float)) and k not in ("iterations", "repetitions", "family_index",
                                                           "per_family_instance_index", "repetition_index", "threads"):
                    vals[(name, k)][v][i] = x
for (name, k), vs in sorted(vals.items()):
    group = name.split("/")[0]
    if k not in KEYS.get(group, []):
        continue
    b, a = vs["before"], vs["after"]
    pairs = [a[i] / b[i] for i in sorted(set(a) & set(b)) if b[i]]
    print(f"| `{name}` {k} | {statistics.median(b.values()):.3f} | {statistics.median(a.values()):.3f} | "
          f"{statistics.median(pairs):.3f} | {sum(r < 1 for r in pairs)} of {len(pairs)} | "
          f"{', '.join(f'{r:.3f}' for r in pairs)} |")
