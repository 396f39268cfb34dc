#!/usr/bin/env python3
"""Summarizes a bench/gpu/torch_front.sh folder: the GPU test's outcome, and examples/dlrm.py's
runs on each device (examples/s a worker and for the job, a step's split, test AUC), then the
ratios that compare them: GPU over CPU for each setup, and Ferry's servers (ps) over torch's own
nn.EmbeddingBag in one process (local) on each device.

Usage: summarize_torch.py OUT_DIR   (standard library only)"""
import glob
import json
import os
import re
import sys


def records(path, kind):
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if r.get("kind") == kind]


def runs(out):
    """{name: {"workers", "device", "model", "mode", "per_worker", "job", "pull_ms", "push_ms",
    "compute_ms", "auc"}} from each run's metrics files (one per worker)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out, "*-0.jsonl"))):
        name = os.path.basename(path)[:-len("-0.jsonl")]
        start = records(path, "start")[0]
        ends = []
        for rank in range(8):
            p = os.path.join(out, f"{name}-{rank}.jsonl")
            if os.path.exists(p):
                ends += records(p, "end")
        if not ends:
            continue
        e0 = [e for e in ends if e["rank"] == 0][0]
        found[name] = dict(
            mode=start["mode"], device=start["device"], workers=start["workers"],
            model="wide" if "_wide_" in name else "small",
            per_worker=e0["examples_per_s"], job=sum(e["examples_per_s"] for e in ends),
            pull_ms=1e3 * e0["pull_s"], push_ms=1e3 * e0["push_s"], compute_ms=1e3 * e0["compute_s"],
            auc=e0.get("auc", float("nan")), threads=start["threads"])
    return found


def main():
    out = sys.argv[1]
    for name in ("test_torch_gpu.txt", "test_torch_gpu_fixed.txt"):
        path = os.path.join(out, name)
        if os.path.exists(path):
            text = open(path).read()
            tests = re.findall(r"^(test_\w+) .*?\.\.\. .*?(ok|FAIL|ERROR|skipped.*)$", text, re.M | re.S)
            ran = re.search(r"^Ran (\d+) tests? in ([\d.]+)s", text, re.M)
            verdict = re.search(r"^(OK.*|FAILED.*)$", text, re.M)
            print(f"{name}: {verdict.group(1) if verdict else 'no verdict'}"
                  f"{f', {ran.group(1)} tests in {ran.group(2)} s' if ran else ''}")
            for t, outcome in tests:
                print(f"  {t}: {outcome}")
    r = runs(out)
    print(f"\n{'run':22} {'mode':5} {'device':6} {'workers':>7} {'threads':>7} {'ex/s worker':>12} {'ex/s job':>10} "
          f"{'pull ms':>8} {'push ms':>8} {'compute ms':>10} {'auc':>8}")
    for name, s in sorted(r.items(), key=lambda kv: (kv[1]["model"], kv[1]["mode"], kv[1]["workers"], kv[1]["device"])):
        print(f"{name:22} {s['mode']:5} {s['device']:6} {s['workers']:7d} {s['threads']:7d} {s['per_worker']:12.0f} "
              f"{s['job']:10.0f} {s['pull_ms']:8.3f} {s['push_ms']:8.3f} {s['compute_ms']:10.3f} {s['auc']:8.4f}")
    print("\nthe job's examples/s, cuda over cpu (the same run on each device):")
    for name, s in sorted(r.items()):
        if s["device"] == "cuda":
            other = r.get(name.replace("_cuda", "_cpu"))
            if other:
                print(f"  {name.replace('_cuda', ''):18} {s['job']:8.0f} / {other['job']:8.0f} = {s['job'] / other['job']:6.2f}x"
                      f"   auc {s['auc']:.6f} vs {other['auc']:.6f}")
    print("\nthe job's examples/s, Ferry's servers (ps, 1 worker) over nn.EmbeddingBag in one process (local):")
    for model in ("small", "wide"):
        for device in ("cuda", "cpu"):
            ps, local = r.get(f"dlrm_{model}_{device}_1w"), r.get(f"local_{model}_{device}")
            if ps and local:
                print(f"  {model:5} on {device:4}: {ps['job']:8.0f} / {local['job']:8.0f} = {ps['job'] / local['job']:5.2f}"
                      f"   (ps step: pull {ps['pull_ms']:.3f} + push {ps['push_ms']:.3f} + compute "
                      f"{ps['compute_ms']:.3f} ms)")


if __name__ == "__main__":
    main()
