"""runs.json (everything), runs.csv (one row per run) and summary.md (tables) from one document.

The document is what runs.json holds, so `ferry-matrix --report-only DIR` can redo the CSV, the
summary and the plots from a finished matrix without running anything.
"""

import csv
import json
import os

from . import metrics

FORMAT = "ferry-matrix/1"

CSV_COLUMNS = [
    "run_id", "model", "workers", "mode", "consistency", "backup_workers", "straggler", "status",
    "error", "device", "steps", "examples_total", "wall_s", "train_s", "eval_s",
    "quality_metric", "final_quality", "final_loss", "target", "target_reached",
    "time_to_target_train_s", "time_to_target_wall_s", "steps_to_target",
    "examples_per_sec_per_worker", "examples_per_sec_total", "examples_per_sec_total_raw",
    "examples_per_sec_by_rank", "staleness_updates", "staleness_mean", "staleness_max",
    "staleness_hist", "bytes_pushed", "bytes_pulled",
    "pull_ms_per_step", "compute_ms_per_step", "push_ms_per_step", "wait_ms_per_step",
    "eval_ms_per_step", "launcher_rc", "duration_s", "run_dir",
]


def write_json(doc, path):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)


def load_json(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a ferry-matrix result (format {doc.get('format')!r})")
    return doc


def _bucket(k):
    return f"{k}+" if int(k) >= metrics.STALENESS_LAST_BUCKET else str(k)


def hist_text(st):
    return " ".join(f"{_bucket(k)}:{v}" for k, v in st["hist"].items()) if st else ""


def csv_row(run):
    s, r = run["settings"], run.get("result")
    row = {"run_id": run["run_id"], "model": s["model"], "workers": s["workers"],
           "mode": s["mode"], "consistency": s["consistency"],
           "backup_workers": s["backup_workers"], "straggler": s["straggler"] or "",
           "status": run["status"], "error": " | ".join(run.get("summary") or []),
           "quality_metric": s["quality_metric"], "target": s["target"],
           "launcher_rc": run.get("launcher_rc"), "duration_s": run.get("duration_s"),
           "run_dir": run.get("run_dir")}
    if r:
        st, t = r["staleness"], r["target"]
        row.update({
            "device": r["device"], "steps": r["steps"], "examples_total": r["examples_total"],
            "wall_s": _r(r["wall_s"], 3), "train_s": _r(r["train_s"], 3),
            "eval_s": _r(r["eval_s"], 3),
            "final_quality": _r(r["final"]["quality"], 6), "final_loss": _r(r["final"]["loss"], 6),
            "target_reached": int(t["reached"]),
            "time_to_target_train_s": _r(t["train_s"], 3),
            "time_to_target_wall_s": _r(t["wall_s"], 3), "steps_to_target": t["step"],
            "examples_per_sec_per_worker": _r(r["throughput"]["per_worker_mean"], 1),
            "examples_per_sec_total": _r(r["throughput"]["total"], 1),
            "examples_per_sec_total_raw": _r(r["throughput"]["total_raw"], 1),
            "examples_per_sec_by_rank": ";".join(f"{x:.1f}" for x in r["throughput"]["per_worker"]),
            "staleness_updates": st["updates"] if st else "",
            "staleness_mean": _r(st["mean"], 4) if st else "",
            "staleness_max": _bucket(st["max"]) if st else "",
            "staleness_hist": hist_text(st),
            "bytes_pushed": r["bytes"]["sent"], "bytes_pulled": r["bytes"]["received"],
        })
        for k in ("pull", "compute", "push", "wait", "eval"):
            row[f"{k}_ms_per_step"] = _r(r["step_ms"][k], 4)
    return row


def _r(x, nd):
    return None if x is None else round(x, nd)


def write_csv(doc, path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="raise")
        w.writeheader()
        for run in doc["runs"]:
            w.writerow({k: ("" if v is None else v) for k, v in csv_row(run).items()})


# ---------------------------------------------------------------------------------------------
# Markdown

def _fmt_s(x):
    return "–" if x is None else f"{x:.2f}" if x < 10 else f"{x:.1f}"


def _fmt_rate(x):
    return "–" if x is None else f"{x:,.0f}"


def _fmt_mb(x):
    return f"{x / 1e6:,.1f}"


def _table(header, rows, align):
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def _duration(s):
    s = int(round(s))
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def _load(triple):
    return ", ".join(f"{x:.2f}" for x in triple) if triple else "unknown"


def summary_markdown(doc, plot_files):
    cfg, mach = doc["config"], doc["machine"]
    runs = doc["runs"]
    ok = [r for r in runs if r["status"] == "ok"]
    lines = [f"# Ferry training matrix: `{doc['name']}`", ""]
    lines += [f"Preset `{doc['preset']}`: {doc['description']}. Command: `{doc['command']}`.",
              f"{len(runs)} runs, {len(ok)} succeeded, {len(runs) - len(ok)} did not; "
              f"{doc['started_utc']} to {doc['finished_utc']} ({_duration(doc['duration_s'])}). "
              "Every number below is read from the workers' metrics files "
              "(`runs/<run>/metrics-<rank>.jsonl`, beside this file where the matrix ran; git does "
              "not track them, runs.json keeps what was read from them); nothing is typed in.", ""]

    lines += ["## Machine", ""]
    load = doc.get("load_average") or {}
    rows = [("CPU", f"{mach['cpu']}, {mach['cpus']} logical CPUs"),
            ("memory", f"{mach['memory_gib']} GiB"), ("OS", f"{mach['os']}, Linux {mach['kernel']}"),
            ("GPU", mach["gpu"]),
            ("code", f"commit {mach['git_commit']}" + (
                " with uncommitted changes to " + ", ".join(f"`{f}`" for f in mach["git_modified"])
                if mach.get("git_modified") else " with uncommitted changes"
                if mach.get("git_dirty") else "")),
            ("trainer", f"`{mach['trainer_binary']}` (built {mach['trainer_built']})"),
            ("load average (1, 5, 15 min)",
             f"{_load(load.get('start'))} at the start, {_load(load.get('end'))} at the end")]
    lines += _table(["", ""], rows, "ll") + [""]

    lines += ["## Settings", ""]
    strag = cfg.get("straggler")
    lines.append(f"- servers: {cfg['num_ps']} `ferry-ps`; workers: "
                 f"{', '.join(map(str, cfg['workers']))}; modes: "
                 f"{', '.join(cfg['modes'])}; seed {cfg['seed']}.")
    lines.append("- straggler: " + (f"`{strag}` on the last worker (rank M-1) of every run with "
                                    "M > 1 workers" if strag else "none") + ".")
    for m in cfg["models"].values():
        tl = f"{m['test_limit']} test examples" if m.get("test_limit") else "the whole test set"
        lines.append(f"- {m['title']} (`{m['name']}`): budget {m['budget']}, batch {m['batch']} "
                     f"per worker, about {m['evals']} evaluations per run on {tl} (rank 0), "
                     f"target {m['quality']} >= {m['target']}. Trainer flags: "
                     f"`{' '.join(m['args'])}`.")
    if cfg.get("extra_args"):
        lines.append(f"- extra trainer flags: `{' '.join(cfg['extra_args'])}`.")
    for sk in doc.get("skipped", []):
        lines.append(f"- not run: {sk['model']}, {sk['workers']} worker(s), {sk['mode']} "
                     f"({sk['why']}).")
    lines.append("")

    lines += [
        "Definitions: *training time* = a worker's wall time minus its evaluation time: at "
        "an evaluation `wall_s - time.eval_s`, for the whole run the end event's `train_s` (to "
        "the final parameters; the closing wait for the other workers is left out). Time to "
        "target is the first evaluation (rank 0) whose quality reaches the target, as training "
        "time and as raw wall time since training started. Steps are rank 0's. Examples/s are "
        "examples / training time; *total* is the sum over workers. Bytes are the workers' `bytes_sent` (pushed) and `bytes_received` "
        "(pulled), summed. Per-step times are each worker's cumulative time / its steps, "
        "averaged over workers. Staleness: updates applied with each staleness, summed over "
        "servers (async and ssp); the servers' last bucket holds every staleness >= "
        f"{metrics.STALENESS_LAST_BUCKET} (shown as {metrics.STALENESS_LAST_BUCKET}+, counted as "
        f"{metrics.STALENESS_LAST_BUCKET} in the mean).", ""]

    for name, m in cfg["models"].items():
        mruns = [r for r in runs if r["settings"]["model"] == name]
        if not mruns:
            continue
        q = m["quality"]
        lines += [f"## {m['title']}: {q} and time to target ({q} >= {m['target']})", ""]
        planted = next((r["result"]["planted"] for r in mruns
                        if r.get("result") and r["result"].get("planted")), None)
        if planted and "planted_auc" in planted:
            lines += [f"The data's planted model scores AUC {planted['planted_auc']:.4f} on the "
                      "test set: the best a trained model can expect.", ""]
        rows = []
        for r in mruns:
            s, res = r["settings"], r.get("result")
            if not res:
                rows.append([s["workers"], s["mode"], f"**{r['status']}**"] + ["–"] * 6)
                continue
            t = res["target"]
            rows.append([s["workers"], s["mode"], r["status"], res["steps"],
                         f"{res['final']['quality']:.4f}", _fmt_s(res["train_s"]),
                         _fmt_s(t["train_s"]) if t["reached"] else "not reached",
                         _fmt_s(t["wall_s"]) if t["reached"] else "not reached",
                         t["step"] if t["reached"] else "–"])
        lines += _table(["workers", "mode", "status", "steps", f"final {q}",
                         "training time (s)", "to target: training s", "to target: wall s",
                         "steps to target"], rows, "rllrrrrrr") + [""]

        lines += [f"## {m['title']}: throughput, traffic and time per step", ""]
        rows = []
        for r in mruns:
            s, res = r["settings"], r.get("result")
            if not res:
                rows.append([s["workers"], s["mode"]] + ["–"] * 9)
                continue
            st, ms = res["staleness"], res["step_ms"]
            rows.append([s["workers"], s["mode"], _fmt_rate(res["throughput"]["per_worker_mean"]),
                         _fmt_rate(res["throughput"]["total"]),
                         f"{st['mean']:.2f} / {_bucket(st['max'])}" if st else "–",
                         _fmt_mb(res["bytes"]["sent"]), _fmt_mb(res["bytes"]["received"]),
                         f"{ms['pull']:.2f}", f"{ms['compute']:.2f}", f"{ms['push']:.2f}",
                         f"{ms['wait']:.2f}"])
        lines += _table(["workers", "mode", "examples/s per worker", "examples/s total",
                         "staleness mean / max", "MB pushed", "MB pulled", "pull ms/step",
                         "compute ms/step", "push ms/step", "wait ms/step"],
                        rows, "rlrrrrrrrrr") + [""]

    stale = [r for r in ok if r["result"]["staleness"]]
    if stale:
        lines += ["## Staleness histograms (staleness: updates)", ""]
        lines += [f"- `{r['run_id']}`: {hist_text(r['result']['staleness'])}" for r in stale]
        lines.append("")
    checks = [(r["run_id"], c) for r in ok for c in r["result"].get("checks", [])]
    if checks:
        lines += ["## Warnings", ""] + [f"- `{rid}`: {c}" for rid, c in checks] + [""]
    bad = [r for r in runs if r["status"] != "ok"]
    if bad:
        lines += ["## Runs that did not succeed", ""]
        for r in bad:
            lines += [f"### `{r['run_id']}`: {r['status']}", "", "```"]
            lines += (r.get("summary") or ["(no summary)"]) + ["```", ""]
    if plot_files:
        lines += ["## Plots", ""]
        lines += [f"![{os.path.splitext(os.path.basename(p))[0]}]({p})" for p in plot_files]
        lines.append("")
    return "\n".join(lines)


def write_summary(doc, path, plot_files):
    with open(path, "w", encoding="utf-8") as f:
        f.write(summary_markdown(doc, plot_files))
