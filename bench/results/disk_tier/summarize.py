#!/usr/bin/env python3
"""The disk tier's store against its limits (bench/results/disk_tier/run.json from
bench/disk_tier_bench.cc): each arm's median lookups per second over the rounds, as a share of the
disk's random 4 KiB reads with the same number of threads (fio, O_DIRECT, synchronous: the most a
thread reading the store one block at a time can get), and the RAM-only table's lookups against the
store's.
    summarize.py run.json
"""
import json
import sys


def median(v):
    v = sorted(v)
    m = len(v) // 2
    return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])


def zipf_top_mass(n, s, k):
    """The probability mass of the k most probable of n Zipf(s) ranks: the hit rate of the
    frequency-optimal cache of k rows."""
    weights = [1.0 / (r + 1) ** s for r in range(n)]
    return sum(weights[:k]) / sum(weights)


def shard_mode(d):
    """--mode shard: training steps (pull + push of a batch) on shards with the tier."""
    arms = dict(d["arms"])
    fio = arms.pop("fio_randread_4k/j1", None)  # (runs before it was measured have none)
    med = {name: a["median"] for name, a in arms.items()}
    ids = d.get("ids", "zipf1.1")
    named = "Zipf 1.1" if ids == "zipf1.1" else "uniform"
    print(f"rows {d['rows']:,} of dim {d['dim']} (Adam), steps of {d['batch']} {named} ids (a pull and a push), "
          f"block cache {d['cache_mb']} MiB, {len(next(iter(arms.values()))['per_round'])} rounds of {d['seconds']} s")
    print()
    print(f"{'arm':<20} {'max_rows':>10} {'ids/s':>12} {'min':>12} {'max':>12} {'vs ram':>7} {'vs cap':>7}"
          f" {'miss/id':>8} {'ideal':>7} {'miss/ideal':>10}")
    for name in sorted(med, key=lambda n: -med[n]):
        kind = name.split("/", 1)[1]
        rounds = arms[name]["per_round"]
        max_rows = d["max_rows"].get(kind, 0)
        miss = median(arms[name]["promoted_per_id"])
        # The frequency-optimal cache of max_rows rows misses the mass beyond its rows.
        top = zipf_top_mass(d["rows"], 1.1, max_rows) if ids == "zipf1.1" else min(1.0, max_rows / d["rows"])
        ideal = 1 - top if kind.startswith("tier") else 0.0
        ratio = f"{miss / ideal:.2f}" if ideal > 0 else ""
        print(f"{name:<20} {max_rows:>10,} {med[name]:>12,.0f} {min(rounds):>12,.0f} {max(rounds):>12,.0f}"
              f" {med[name] / med['step/ram']:>7.3f} {med[name] / med['step/ram_max_rows']:>7.3f}"
              f" {miss:>8.4f} {ideal:>7.4f} {ratio:>10}")
    if fio is None:
        return
    iops = median(fio["per_round"])
    print()
    print(f"the disk, fio random 4 KiB reads (O_DIRECT, one synchronous job, a {d['fio_file_bytes'] / 2**20:,.0f} MiB "
          f"file in the same folder, the same rounds): {iops:,.0f} IOPS")
    for name in sorted(med, key=lambda n: -med[n]):
        miss = median(arms[name]["promoted_per_id"])
        if miss > 0:
            print(f"{name:<20} rows read back {med[name] * miss:>10,.0f} /s: {med[name] * miss / iops:.3f} of the disk's reads")


def server_mode(d):
    """--mode server: workers' training steps on servers with the tier, the I/O thread reading
    cold rows itself ("inline") against disk readers ("readersN")."""
    arms = dict(d["arms"])
    fio = {name: median(arms.pop(name)["per_round"]) for name in list(arms) if name.startswith("fio")}
    med = {name: a["median"] for name, a in arms.items()}
    ids = d.get("ids", "zipf1.1")
    named = "Zipf 1.1" if ids == "zipf1.1" else "uniform"
    rounds = len(next(iter(arms.values()))["per_round"])
    print(f"{d['workers']} workers, rows {d['rows']:,} of dim {d['dim']} (Adam), RAM tier {d['max_rows']:,} rows, "
          f"steps of {d['batch']} {named} ids (a pull and a push), block cache {d['cache_mb']} MiB, "
          f"{rounds} rounds of {d['seconds']} s")
    print()
    print(f"{'arm':<10} {'ids/s':>10} {'min':>10} {'max':>10} {'vs inline':>9} {'miss/id':>8} {'rows read/s':>11}"
          f" {'fio':>6} {'vs fio':>7} {'inline rows':>11} {'held':>8}")
    for name in sorted(med, key=lambda n: -med[n]):
        per = arms[name]["per_round"]
        miss = median(arms[name]["promoted_per_id"])
        jobs = 1 if name == "inline" else int(name.replace("readers", ""))
        limit = fio.get(f"fio_randread_4k/j{jobs}")
        read_rate = med[name] * miss
        vs_fio = f"{read_rate / limit:.3f}" if limit else ""
        print(f"{name:<10} {med[name]:>10,.0f} {min(per):>10,.0f} {max(per):>10,.0f} {med[name] / med['inline']:>9.3f}"
              f" {miss:>8.4f} {read_rate:>11,.0f} {'j' + str(jobs):>6} {vs_fio:>7}"
              f" {median(arms[name]['rows_read_inline']):>11,.0f} {median(arms[name]['requests_held_for_disk']):>8,.0f}")
    print()
    print("per round, readers / inline: " + ", ".join(
        f"{r / i:.3f}" for r, i in zip(arms["readers4"]["per_round"], arms["inline"]["per_round"])))
    print("the disk, fio random 4 KiB reads (O_DIRECT, synchronous, the same rounds): " +
          ", ".join(f"{name.split('/')[1]} {v:,.0f} IOPS" for name, v in sorted(fio.items())))


def main(path):
    d = json.load(open(path))
    if d.get("mode") == "shard":
        return shard_mode(d)
    if d.get("mode") == "server":
        return server_mode(d)
    arms = d["arms"]
    med = {name: a["median"] for name, a in arms.items()}
    print(f"rows {d['rows']:,} of {d['row_bytes']} bytes (dim {d['dim']}, Adam), batches of {d['batch']} ids, "
          f"{d['store_file_bytes'] / 2**20:.1f} MiB of table files, block cache {d['cache_mb']} MiB, "
          f"{len(next(iter(arms.values()))['per_round'])} rounds of {d['seconds']} s")
    print()
    print(f"{'arm':<26} {'median /s':>12} {'min /s':>12} {'max /s':>12} {'vs disk':>8} {'RAM / it':>9}")
    for name in sorted(med):
        rounds = arms[name]["per_round"]
        kind, *rest = name.split("/")
        vs_disk = ram_over = ""
        if kind.startswith("disk"):
            dist, threads = rest
            jobs = threads.replace("t", "j")
            vs_disk = f"{med[name] / med['fio_randread_4k/' + jobs]:.3f}"
            ram_over = f"{med['ram/' + dist + '/t1'] / med[name]:.0f}x"
        print(f"{name:<26} {med[name]:>12,.0f} {min(rounds):>12,.0f} {max(rounds):>12,.0f} {vs_disk:>8} {ram_over:>9}")

    # What a RAM tier of a share of the rows could give: the hit rate of the frequency-optimal cache
    # (the most probable rows), and the lookups/s it implies when a hit costs the RAM table's
    # lookup and a miss a cold read at the store's uniform rate with one reader (a model from this
    # run's medians, not a measurement).
    n = d["rows"]
    print()
    print("RAM tier share   ideal hit rate (uniform, zipf1.1)   modelled lookups/s, 1 reader (uniform, zipf1.1)")
    for share in (1.0, 0.1, 0.01):
        top = int(n * share)
        hits = {"uniform": share, "zipf1.1": zipf_top_mass(n, 1.1, top)}
        rate = {dist: 1.0 / (h / med[f"ram/{dist}/t1"] + (1 - h) / med["disk/uniform/t1"]) for dist, h in hits.items()}
        print(f"{share:>14.0%}   {hits['uniform']:>14.4f} {hits['zipf1.1']:>8.4f}"
              f"            {rate['uniform']:>18,.0f} {rate['zipf1.1']:>10,.0f}")


if __name__ == "__main__":
    main(sys.argv[1])
