"""Summarizes bench/results/torch_dlrm/runs (run.sh): per configuration over the rounds, the
median (min-max) of job examples/s (the workers' training examples per second of their own
training loop, summed over the workers) and of the per-step time split of worker 0 (pull, push,
compute, in ms); then per round the ratios the text cites, as median (min-max) over rounds:
  ferry / local     dlrm_1x1 and dlrm_2x2 job examples/s over dlrm_local's in the same round
  cpp / py          ctr_cpp_1x1 examples/s over ctr_py_1x1's (the Python path's cost; aim <= 1.3),
                    and the same for the wide pair
  after / before    ctr_py_1x1 over ctr_py_before_1x1 (the same run with another build's package)
and the final test AUC of each configuration.

  /usr/bin/python3 bench/results/torch_dlrm/summarize.py bench/results/torch_dlrm
"""

import collections
import glob
import json
import os
import re
import statistics
import sys


def load(path):
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def end_of(records):
    """(examples/s, steps, per-step pull/push/compute seconds, auc) of one worker's file, for
    either program: dlrm.py writes "kind" records, ferry-trainer "event" records."""
    for r in records:
        if r.get("kind") == "end":
            return (r["examples_per_s"], r["steps"], r["pull_s"], r["push_s"], r["compute_s"], r.get("auc"))
        if r.get("event") == "end":
            steps = r["steps"]
            t = r["time"]
            # ferry-trainer: cumulative; waiting for the other workers (wait_s) is part of its pulls.
            auc = next((e.get("auc") for e in reversed(records) if e.get("event") == "eval"), None)
            return (r["examples"] / r["train_s"], steps, (t["pull_s"] + t["wait_s"]) / steps, t["push_s"] / steps,
                    t["compute_s"] / steps, auc)
    raise ValueError("no end record")


def med(xs):
    return f"{statistics.median(xs):.4g} ({min(xs):.4g}-{max(xs):.4g})"


def main(out):
    runs = collections.defaultdict(dict)  # config -> round -> [per-worker end tuples]
    for path in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
        m = re.match(r"(.+)-r(\d+)-(\d+)\.json$", os.path.basename(path))
        config, rnd = m.group(1), int(m.group(2))
        runs[config].setdefault(rnd, []).append(end_of(load(path)))
    print("config | rounds | job examples/s | worker 0 ms/step: pull | push | compute | final auc")
    job = {}
    for config in sorted(runs):
        per = runs[config]
        job[config] = {r: sum(w[0] for w in ws) for r, ws in per.items()}
        w0 = [sorted(ws, key=lambda w: w[5] is None)[0] for ws in per.values()]
        aucs = [w[5] for w in w0 if w[5] is not None]
        print(f"{config} | {len(per)} | {med(list(job[config].values()))} | "
              f"{med([w[2] * 1e3 for w in w0])} | {med([w[3] * 1e3 for w in w0])} | "
              f"{med([w[4] * 1e3 for w in w0])} | {med(aucs) if aucs else '-'}")
    print()
    print("ratios per round, median (min-max) over rounds:")
    for num, den in (("dlrm_1x1", "dlrm_local"), ("dlrm_2x2", "dlrm_local"), ("dlrm_2x2", "dlrm_1x1"),
                     ("ctr_cpp_1x1", "ctr_py_1x1"), ("ctr_cpp_1x1", "ctr_py_prefetch_1x1"),
                     ("ctr_py_prefetch_1x1", "ctr_py_1x1"), ("ctr_cpp_wide_1x1", "ctr_py_wide_1x1"),
                     ("ctr_py_1x1", "ctr_py_before_1x1"), ("ctr_cpp_1x1", "ctr_py_before_1x1")):
        rounds = sorted(set(job.get(num, {})) & set(job.get(den, {})))
        if rounds:
            print(f"{num} / {den}: {med([job[num][r] / job[den][r] for r in rounds])}")


if __name__ == "__main__":
    main(sys.argv[1])
