"""The trainer's JSON-lines metrics (--metrics-out) -> one record per run.

Every line of metrics-<rank>.jsonl is one object with "event" (start | train | eval | end), "rank"
and "wall_s" (seconds since that worker started training). Evaluations ("eval" events, and the
"final" object of the end event) are written by rank 0 only. What is derived here, and how:

- quality: "accuracy" (mlp) or "auc" (ctr) of rank 0's evaluations; the curve is every eval
  event (plus the final evaluation when no eval event has its step).
- training time = wall_s - time.eval_s (the worker's cumulative evaluation time at that event);
  time to target = the first evaluation whose quality >= target, given both as training time and
  as raw wall_s; steps to target = that evaluation's step (rank 0's steps).
- throughput per worker = examples / train_s of its end event (seconds to its final pull, less
  evaluation; not the closing wait for the other workers, final_wait_s; an older trainer without
  train_s: wall_s - eval_s); the trainer's own examples_per_sec, evaluation included, is kept as
  *_raw; total = the sum over workers.
- bytes: bytes_sent (pushed) and bytes_received (pulled) summed over the workers' end events.
- time split: each worker's cumulative time.{pull,compute,push,wait,eval}_s / its steps, in ms,
  then the mean over workers (the per-worker values are kept too). The trainer's parts add up to
  its wall time; its wait_s (measured by the servers: pulls held for the other workers, barriers,
  all-reduces) includes the closing wait for the other workers, final_wait_s, which is left out
  here as it is from the throughput.
- staleness: rank 0's end "staleness" histogram (updates applied with each staleness, summed
  over servers); empty in sync mode.
"""

import json
import math
import os

from . import runner

SPLIT = ("pull", "compute", "push", "wait", "eval")


class MetricsError(Exception):
    """A metrics file is missing, unreadable, or lacks what a finished run must have."""


def read_jsonl(path):
    """The events of one metrics file, in order. MetricsError names the file and line."""
    try:
        # A byte that is not UTF-8 turns into U+FFFD and fails as "not JSON" with its line.
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise MetricsError(f"cannot read {path}: {e.strerror}") from None
    events = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsError(f"{path}:{i}: not JSON ({e.msg})") from None
        if not isinstance(ev, dict) or "event" not in ev:
            raise MetricsError(f"{path}:{i}: not an object with an \"event\" field")
        events.append(ev)
    return events


def _num(obj, key, where, default=None):
    v = obj.get(key, default)
    if v is None:
        if default is not None:
            return default
        raise MetricsError(f"{where}: missing \"{key}\"")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise MetricsError(f"{where}: \"{key}\" is not a finite number ({v!r})")
    return v


def _one(events, kind, where):
    found = [e for e in events if e.get("event") == kind]
    if not found:
        raise MetricsError(f"{where}: no \"{kind}\" event")
    return found[-1] if kind == "end" else found[0]


# ferry-ps counts staleness in buckets 0..64, the last one holding every update of staleness
# >= 64 (kStalenessBuckets in ps/server/internal/server_impl.h): a max of 64 means "64 or more", and the mean
# then counts those updates as 64 (a lower bound).
STALENESS_LAST_BUCKET = 64


def staleness_stats(hist):
    """{"0": n0, "3": n3} -> dict(hist={0: n0, 3: n3}, updates, mean, max, capped); None when
    empty. capped: updates in the last bucket (staleness >= STALENESS_LAST_BUCKET)."""
    if not hist:
        return None
    h = {int(k): int(v) for k, v in hist.items() if int(v) > 0}
    n = sum(h.values())
    if n == 0:
        return None
    return {"hist": dict(sorted(h.items())), "updates": n,
            "mean": sum(k * v for k, v in h.items()) / n, "max": max(h),
            "capped": h.get(STALENESS_LAST_BUCKET, 0)}


def _eval_point(ev, quality, loss_name, where):
    wall = _num(ev, "wall_s", where)
    eval_s = _num(ev.get("time") or {}, "eval_s", where + " time", 0.0)
    return {"step": int(_num(ev, "step", where)), "wall_s": wall,
            "train_s": max(0.0, wall - eval_s), "quality": _num(ev, quality, where),
            "loss": next((ev[k] for k in (loss_name, "log_loss", "logloss", "loss")
                          if isinstance(ev.get(k), (int, float))), None),
            "examples": ev.get("examples"), "merged": ev.get("merged")}


# Fields of each worker's end event copied into the run's record as they are.
WORKER_FIELDS = ("steps", "wall_s", "train_s", "final_wait_s", "global_step", "pushes_used",
                 "pushes_dropped")


def time_split_check(per_rank):
    """How far the time split (pull + compute + push + wait + eval) is from wall_s, over every
    train and end event of every worker: {"events", "max_abs_s", "max_rel"}; max_rel over the
    events past 2 s of wall time (earlier, a few ms of scheduling noise is a large fraction)."""
    n, max_abs, max_rel = 0, 0.0, 0.0
    for events in per_rank:
        for ev in events:
            t = ev.get("time")
            if ev.get("event") not in ("train", "end") or not isinstance(t, dict):
                continue
            wall = ev.get("wall_s")
            parts = [t.get(f"{k}_s") for k in SPLIT]
            if not isinstance(wall, (int, float)) or not all(isinstance(v, (int, float)) for v in parts):
                continue
            err = abs(sum(parts) - wall)
            n += 1
            max_abs = max(max_abs, err)
            if wall > 2.0:
                max_rel = max(max_rel, err / wall)
    return {"events": n, "max_abs_s": max_abs, "max_rel": max_rel}


def summarize(spec, run_dir):
    """Reads a finished run's metrics files and returns its record (see the module docstring).
    Raises MetricsError when a file is missing or incomplete."""
    model = spec.model
    q, target = model.quality, model.target
    starts, ends, per_rank = [], [], []
    for r in range(spec.workers):
        path = runner.metrics_path(run_dir, r)
        where = os.path.basename(path)
        events = read_jsonl(path)
        per_rank.append(events)
        starts.append(_one(events, "start", where))
        ends.append(_one(events, "end", where))

    checks = []
    s0 = starts[0]
    for key, want in (("num_workers", spec.workers), ("model", model.name),
                      ("consistency", spec.mode.consistency),
                      ("backup_workers", spec.mode.backup_workers)):
        if key in s0 and s0[key] != want:
            checks.append(f"start event says {key}={s0[key]!r}, the harness asked for {want!r}")

    # Quality curve and time to target: rank 0's evaluations.
    # An evaluation whose quality is null (the trainer writes null for an undefined AUC: a test
    # range of one class) is left out of the curve and named in the checks.
    curve = []
    for i, ev in enumerate(e for e in per_rank[0] if e.get("event") == "eval"):
        if ev.get(q, 0) is None:
            checks.append(f"eval #{i + 1} (step {ev.get('step')}) has no {q}; left out")
            continue
        curve.append(_eval_point(ev, q, model.loss_name, f"metrics-0.jsonl eval #{i + 1}"))
    # The job's steps: the start event's budget (sync: global steps, which a backup worker that
    # fell behind stops short of, so its end event's "steps", the steps it ran, may be fewer).
    job_steps = s0.get("steps", ends[0].get("steps"))
    final_obj = ends[0].get("final")
    final = None
    if isinstance(final_obj, dict) and final_obj.get(q) is not None:
        fp = dict(final_obj)
        fp.setdefault("step", job_steps)
        fp.setdefault("wall_s", ends[0].get("wall_s"))
        fp.setdefault("time", ends[0].get("time"))
        final = _eval_point(fp, q, model.loss_name, "metrics-0.jsonl end.final")
        same = next((p for p in curve if p["step"] == final["step"]), None)
        if same:
            final["merged"] = same["merged"]  # end.final repeats that eval line, less "merged"
        else:
            curve.append(final)
    elif curve:
        final = curve[-1]
    if final is None:
        raise MetricsError(f"metrics-0.jsonl: no evaluation with \"{q}\" (no eval event and no "
                           "end.final)")
    curve.sort(key=lambda p: (p["step"], p["wall_s"]))
    hit = next((p for p in curve if p["quality"] >= target), None)

    # Throughput, bytes, time split: every worker's end event.
    steps, rate, rate_raw, split = [], [], [], {k: [] for k in SPLIT}
    sent = received = examples = 0
    train_times = []
    for r, end in enumerate(ends):
        where = f"metrics-{r}.jsonl end"
        n = int(_num(end, "steps", where))
        ex = _num(end, "examples", where)
        wall = _num(end, "wall_s", where)
        t = end.get("time") or {}
        eval_s = _num(t, "eval_s", where + " time", 0.0)
        train_s = _num(end, "train_s", where, wall - eval_s)
        train_times.append((wall, train_s, eval_s))
        steps.append(n)
        examples += ex
        rate.append(ex / train_s if train_s > 0 else 0.0)
        rate_raw.append(_num(end, "examples_per_sec", where, ex / wall if wall > 0 else 0.0))
        sent += _num(end, "bytes_sent", where, 0)
        received += _num(end, "bytes_received", where, 0)
        closing = _num(end, "final_wait_s", where, 0.0)
        for k in SPLIT:
            v = _num(t, f"{k}_s", where + " time", 0.0) - (closing if k == "wait" else 0.0)
            split[k].append(1e3 * max(0.0, v) / max(1, n))

    wall0, train0, eval0 = train_times[0]
    # What each worker's end event says of its run (sync: the global step it ended at, its
    # gradients used and dropped), kept here because the metrics files are not tracked.
    workers = [{k: end.get(k) for k in WORKER_FIELDS if k in end} for end in ends]
    return {
        "device": s0.get("device"),
        # The synthetic CTR data's planted model: the best AUC / log-loss to expect.
        "planted": {k: s0[k] for k in ("planted_auc", "planted_log_loss") if k in s0} or None,
        "steps": job_steps,
        "steps_per_worker": steps,  # the steps each worker ran
        "workers": workers,
        "time_split": time_split_check(per_rank),
        "examples_total": examples,
        "wall_s": wall0,
        "train_s": train0,
        "eval_s": eval0,
        "cluster_wall_s": max(_num(e, "wall_s", "end") for e in ends),
        "final": {"step": final["step"], "quality": final["quality"], "loss": final["loss"],
                  "count": (final_obj or {}).get("count"), "merged": final.get("merged")},
        "target": {"metric": q, "value": target, "reached": hit is not None,
                   "train_s": hit["train_s"] if hit else None,
                   "wall_s": hit["wall_s"] if hit else None,
                   "step": hit["step"] if hit else None},
        "throughput": {"per_worker": rate, "per_worker_mean": sum(rate) / len(rate),
                       "total": sum(rate), "per_worker_raw": rate_raw,
                       "total_raw": sum(rate_raw)},
        "bytes": {"sent": sent, "received": received},
        "step_ms": {k: sum(v) / len(v) for k, v in split.items()},
        "step_ms_per_worker": split,
        "staleness": staleness_stats(ends[0].get("staleness")),
        "curve": curve,
        "checks": checks,
    }
