#!/usr/bin/env python3
"""Summarizes a bench/gpu/run.sh folder: the kernels as ratios to the GPU's limits, and the
training runs (quality, examples/s, a step's time by part on the host and on the device).

Usage: summarize.py OUT_DIR   (standard library only)"""
import json
import os
import sys


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def bench(out):
    path = os.path.join(out, "gpu_bench.jsonl")
    if not os.path.exists(path):
        print("no gpu_bench.jsonl")
        return
    rows = read_jsonl(path)
    head, rows = rows[0], rows[1:]
    print(f"device {head['device']}, driver {head['driver']}, runtime {head['runtime']}, "
          f"{head['sms']} SMs, L2 {head['l2_bytes'] >> 20} MiB")
    print(f"{'group':7} {'what':66} {'ms':>10} {'rate':>9} {'unit':8} {'of limit':>8}  limit")
    for r in rows:
        ratio = f"{r['rate'] / r['limit']:8.3f}" if r["limit"] else " " * 8
        print(f"{r['group']:7} {r['name']:66} {r['ms']:10.4f} {r['rate']:9.2f} {r['unit']:8} {ratio}  "
              f"{r['limit_name']}")


def run_summary(out, name):
    d = os.path.join(out, name)
    ends = []
    for rank in range(8):
        path = os.path.join(d, f"metrics{rank}.jsonl")
        if os.path.exists(path):
            ends += [e for e in read_jsonl(path) if e.get("event") == "end"]
    if not ends:
        return None
    zero = next((e for e in ends if e["rank"] == 0), ends[0])
    final = zero.get("final", {})
    steps = sum(e["steps"] for e in ends)
    t = {k: sum(e["time"][k] for e in ends) / max(steps, 1) * 1e3 for k in ("pull_s", "compute_s", "push_s", "wait_s")}
    dev = [e["device_time"] for e in ends if "device_time" in e]
    d = None
    if dev:
        d = {k: sum(x[k] for x in dev) / max(steps, 1) * 1e3 for k in ("h2d_s", "compute_s", "d2h_s")}
        d["h2d_kib"] = sum(x["h2d_bytes"] for x in dev) / max(steps, 1) / 1024
        d["d2h_kib"] = sum(x["d2h_bytes"] for x in dev) / max(steps, 1) / 1024
        d["pageable"] = sum(x["pageable_bytes"] for x in dev)
        by_op = {}
        for x in dev:
            for k, v in x.get("by_op", {}).items():
                o = by_op.setdefault(k, {"s": 0.0, "calls": 0})
                o["s"] += v["s"]
                o["calls"] += v["calls"]
        d["by_op"] = by_op
    return {"final": final, "eps": sum(e["examples_per_sec"] for e in ends), "t": t, "d": d, "steps": steps}


def training(out):
    names = sorted(n for n in os.listdir(out) if os.path.isdir(os.path.join(out, n)))
    print()
    print(f"{'run':18} {'loss':>20} {'acc':>7} {'auc':>7} {'ex/s':>9} | per step, ms: "
          f"{'pull':>6} {'compute':>7} {'push':>6} {'wait':>6} | device: {'h2d':>6} {'kernels':>7} {'d2h':>6}"
          f" {'KiB h2d':>8} {'d2h':>6}")
    summaries = {}
    for n in names:
        s = run_summary(out, n)
        if s is None:
            print(f"{n:18} (no end event: see {n}.txt)")
            continue
        summaries[n] = s
        f, t, d = s["final"], s["t"], s["d"]
        auc = f.get("auc")
        line = (f"{n:18} {f.get('loss', float('nan')):20.17g} {f.get('accuracy', float('nan')):7.4f} "
                f"{auc if auc is not None else float('nan'):7.4f} {s['eps']:9.0f} | {'':13}"
                f"{t['pull_s']:6.3f} {t['compute_s']:7.3f} {t['push_s']:6.3f} {t['wait_s']:6.3f}")
        if d:
            line += (f" | {'':8}{d['h2d_s']:6.3f} {d['compute_s']:7.3f} {d['d2h_s']:6.3f} {d['h2d_kib']:8.1f} "
                     f"{d['d2h_kib']:6.1f}")
            if d["pageable"]:
                line += f" (pageable bytes: {d['pageable']})"
        print(line)
    for n, s in summaries.items():
        ops = s["d"] and s["d"].get("by_op")
        if ops:
            top = sorted(ops.items(), key=lambda kv: -kv[1]["s"])[:6]
            print(f"{n}: device time per step by call, ms (calls per step): " + ", ".join(
                f"{k} {v['s'] / s['steps'] * 1e3:.3f} ({v['calls'] / s['steps']:.1f})" for k, v in top))
    for device in ("gpu", "cpu"):
        runs = [s for n, s in summaries.items() if n == f"mlp_{device}_2w" or n.startswith(f"mlp_{device}_2w_seed")]
        acc = [r["final"].get("accuracy") for r in runs if r["final"].get("accuracy") is not None]
        if len(acc) > 1:
            mean = sum(acc) / len(acc)
            sd = (sum((a - mean) ** 2 for a in acc) / (len(acc) - 1)) ** 0.5
            print(f"mlp on the {device}, 2 workers, {len(acc)} seeds: test accuracy {mean:.4f} +- {sd:.4f} "
                  f"(min {min(acc):.4f}, max {max(acc):.4f})")
    for model in ("mlp", "ctr"):
        a, b = summaries.get(f"{model}_gpu_2w"), summaries.get(f"{model}_gpu_2w_again")
        if a and b:
            same = a["final"].get("loss") == b["final"].get("loss")
            print(f"{model}: two sync runs on the GPU end with {'the same' if same else 'DIFFERENT'} test loss "
                  f"({a['final'].get('loss')!r} and {b['final'].get('loss')!r})")


def main():
    out = sys.argv[1]
    if os.path.exists(os.path.join(out, "log.txt")):
        print(open(os.path.join(out, "log.txt")).read().rstrip())
        print()
    bench(out)
    training(out)


if __name__ == "__main__":
    main()
