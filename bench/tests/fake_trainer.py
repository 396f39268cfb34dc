#!/usr/bin/env python3
"""A stand-in for ferry-trainer that writes the --metrics-out JSON lines of the trainer's contract
without training anything (no server is contacted), so the harness can be tested fast and can
be made to fail on purpose:

  FERRY_FAKE_FAIL=<consistency>  the last worker of a run with that --consistency exits 3
  FERRY_FAKE_HANG=<consistency>  every worker of such a run sleeps for 10 minutes
  FERRY_FAKE_BADJSON=<consistency>  rank 0 of such a run writes a line that is not JSON
"""

import json
import math
import os
import sys
import time

HELP = """usage: ferry-trainer [flags]   (fake, for bench/tests)
  --model mlp|ctr --consistency sync|async|ssp:S --backup-workers K --straggler RANK:DELAY
  --steps N | --epochs E --batch B --eval-every N --log-every N --metrics-out FILE --quiet
"""


def flag(argv, name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


def main(argv):
    if "--help" in argv:
        print(HELP)
        return 0
    rank, m = int(flag(argv, "--rank")), int(flag(argv, "--num-workers"))
    model, cons = flag(argv, "--model", "mlp"), flag(argv, "--consistency", "sync")
    backup = int(flag(argv, "--backup-workers", "0"))
    batch = int(flag(argv, "--batch", "64"))
    steps = int(flag(argv, "--steps", "0")) or int(flag(argv, "--epochs", "1")) * 20
    eval_every = int(flag(argv, "--eval-every", "0"))
    log_every = int(flag(argv, "--log-every", "10"))
    out = flag(argv, "--metrics-out")
    strag = flag(argv, "--straggler")
    print(f"fake trainer rank {rank}/{m} {cons} backup {backup} steps {steps}", flush=True)
    if os.environ.get("FERRY_FAKE_HANG") == cons:
        time.sleep(600)
    if os.environ.get("FERRY_FAKE_FAIL") == cons and rank == m - 1:
        time.sleep(0.2)
        print("fake trainer: failing on purpose", flush=True)
        return 3
    delay = 0.002
    if strag and int(strag.split(":")[0]) == rank:
        d = strag.split(":")[1]
        delay += float(d[:-2]) / 1e3 if d.endswith("ms") else delay * (float(d[1:]) - 1)
    f = open(out.replace("{rank}", str(rank)), "w") if out else None
    t0 = time.monotonic()
    tm = {"pull_s": 0.0, "compute_s": 0.0, "push_s": 0.0, "wait_s": 0.0, "eval_s": 0.0}

    def emit(ev):
        if f:
            f.write(json.dumps(ev) + "\n")
            f.flush()

    def quality(step):
        q = 1 - math.exp(-(step + 1) * m / 8.0)
        return {"accuracy": 0.1 + 0.8 * q, "loss": 2.3 * (1 - q) + 0.3} if model == "mlp" else \
            {"auc": 0.5 + 0.25 * q, "logloss": 0.6 - 0.1 * q}

    def evaluate(step):
        e0 = time.monotonic()
        time.sleep(0.003)
        tm["eval_s"] += time.monotonic() - e0
        ev = {"event": "eval", "rank": rank, "step": step, "wall_s": time.monotonic() - t0,
              "examples": step * batch, "count": 200, "merged": cons == "sync",
              "time": dict(tm)}
        ev.update(quality(step))
        emit(ev)
        return ev

    emit({"event": "start", "rank": rank, "num_workers": m, "model": model, "consistency": cons,
          "backup_workers": backup, "device": "cpu", "batch": batch, "accumulate": 1,
          "train_examples": steps * batch * m, "steps": steps, "wall_s": 0})
    if os.environ.get("FERRY_FAKE_BADJSON") == cons and rank == 0:
        f.write("{not json\n")
    for s in range(steps):
        if rank == 0 and eval_every and s > 0 and s % eval_every == 0:
            evaluate(s)
        time.sleep(delay)
        tm["pull_s"] += delay * 0.2
        tm["compute_s"] += delay * 0.5
        tm["push_s"] += delay * 0.2
        tm["wait_s"] += delay * 0.1
        if (s + 1) % log_every == 0 or s + 1 == steps:
            ev = {"event": "train", "rank": rank, "step": s + 1, "epoch": 0,
                  "wall_s": time.monotonic() - t0, "examples": (s + 1) * batch,
                  "loss": quality(s).get("loss", 0.5), "examples_per_sec": batch / delay,
                  "time": dict(tm), "bytes_sent": (s + 1) * 1000, "bytes_received": (s + 1) * 1000}
            if model == "mlp":
                ev["accuracy"] = quality(s)["accuracy"]
            emit(ev)
    end = {"event": "end", "rank": rank, "steps": steps, "examples": steps * batch,
           "bytes_sent": steps * 1000, "bytes_received": steps * 1000}
    if rank == 0:
        fin = evaluate(steps)
        end["final"] = {k: v for k, v in fin.items() if k not in ("event", "rank", "wall_s",
                                                                  "time")}
        end["staleness"] = {} if cons == "sync" else {"0": steps * m // 2, "1": steps * m // 3,
                                                      "3": steps * m // 6}
    wall = time.monotonic() - t0
    end.update({"wall_s": wall, "examples_per_sec": steps * batch / wall, "time": dict(tm)})
    emit(end)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
