#!/usr/bin/env python3
"""Recomputes every figure of bench/results/HISTORY.md "The step pipeline" from runs/*.json (the
trainers' metrics files: the "end" line of each worker).

Per run (one configuration, one round): the job's examples/s (the workers' examples over the
longest train_s), and per step (means over the workers) the step time train_s / steps, the
compute compute_s / steps and the communication comm_s / steps. Printed: medians over the rounds
(with min-max), step / max(compute, comm) and step / (compute + comm), and the job's examples/s
against --local's in the same round; and each mode against the one before it, per round (NAME
against none; NAME_layers, --push-by-layer, against NAME).
  python3 bench/results/pipeline/summarize.py [bench/results/pipeline]
"""
import glob
import json
import os
import re
import statistics
import sys


ORDER = ["local", "none", "exchange", "exchange_layers", "prefetch", "prefetch_layers"]


def load(root):
    """(model, mode, pipeline, workers) -> {round: [each worker's end line]} of root/runs."""
    runs = {}
    for path in glob.glob(os.path.join(root, "runs", "*.json")):
        m = re.match(r"(\w+)-(\w+)-(\w+)-(\d)w-r(\d+)-(\d+)\.json$", os.path.basename(path))
        model, mode, pipeline, workers, rnd, _ = m.groups()
        with open(path) as f:
            end = [json.loads(l) for l in f if '"event":"end"' in l]
        assert len(end) == 1, path
        runs.setdefault((model, mode, pipeline, int(workers)), {}).setdefault(int(rnd), []).append(end[0])
    return runs


def per_run(ends):
    steps = ends[0]["steps"]
    n = len(ends)
    step = sum(e["train_s"] / e["steps"] for e in ends) / n
    compute = sum(e["time"]["compute_s"] / e["steps"] for e in ends) / n
    comm = sum(e["comm_s"] / e["steps"] for e in ends) / n
    eps = sum(e["examples"] for e in ends) / max(e["train_s"] for e in ends)
    final = next((e["final"] for e in ends if "final" in e), {})  # worker 0's end line has it
    acc = final.get("accuracy")
    auc = final.get("auc")
    return dict(steps=steps, step_ms=1e3 * step, compute_ms=1e3 * compute, comm_ms=1e3 * comm, eps=eps,
                over_max=step / max(compute, comm) if comm > 0 else None,
                over_sum=step / (compute + comm) if comm > 0 else None, acc=acc, auc=auc)


def fmt(values, digits):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    runs = load(root)
    print("model mode pipeline workers | rounds | step ms | compute ms | comm ms | step/max | step/sum | job examples/s | vs local | final acc/auc")
    for key in sorted(runs, key=lambda k: (k[0], k[3], k[1], ORDER.index(k[2]))):
        model, mode, pipeline, workers = key
        rounds = runs[key]
        rows = {r: per_run(e) for r, e in rounds.items()}
        local = runs.get((model, "sync", "local", 1), {})
        vs_local = [rows[r]["eps"] / per_run(local[r])["eps"] for r in rows if r in local]
        quality = [row["auc"] if model == "ctr" else row["acc"] for row in rows.values()]
        print(f"{model} {mode} {pipeline} {workers} | {len(rows)} | "
              f"{fmt([x['step_ms'] for x in rows.values()], 3)} | {fmt([x['compute_ms'] for x in rows.values()], 3)} | "
              f"{fmt([x['comm_ms'] for x in rows.values()], 3)} | {fmt([x['over_max'] for x in rows.values()], 2)} | "
              f"{fmt([x['over_sum'] for x in rows.values()], 2)} | {fmt([x['eps'] for x in rows.values()], 0)} | "
              f"{fmt(vs_local, 3)} | {fmt(quality, 4)}")

    # Each mode against the one before it, per round (same model, mode, workers): the job's
    # examples/s ratio.
    print()
    print("after / before (job examples/s, per round; median (min-max)):")
    for key in sorted(runs):
        model, mode, pipeline, workers = key
        if pipeline in ("local", "none"):
            continue
        base = pipeline[: -len("_layers")] if pipeline.endswith("_layers") else "none"
        before = runs.get((model, mode, base, workers), {})
        both = [r for r in runs[key] if r in before]
        if not both:
            continue
        eps = [per_run(runs[key][r])["eps"] / per_run(before[r])["eps"] for r in both]
        print(f"  {model} {mode} {workers}w {pipeline} / {base}: {fmt(eps, 3)}")


if __name__ == "__main__":
    main()
