"""The ferry-matrix command line: expand the matrix, run every cell, write the reports.

Exit status: 0 every run succeeded and every output was written; 1 some run failed or timed out
(it is recorded as such, and every output was still written); 2 bad usage or preflight (nothing
ran); 3 an output could not be produced (gnuplot failed); 130 interrupted by SIGINT, SIGTERM or
SIGHUP (the running cluster is stopped; what finished so far is written).
"""

import argparse
import copy
import datetime
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from . import machine, metrics, plots, presets, report, runner

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXIT_OK, EXIT_RUNS_FAILED, EXIT_USAGE, EXIT_OUTPUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
HELP_TIMEOUT_S = 20
# Flags the contract adds to ferry-trainer; a binary without them is older than the harness.
REQUIRED_TRAINER_FLAGS = ("--metrics-out", "--backup-workers", "--straggler")
GENERATED = ("runs", "plots", "runs.json", "runs.csv", "summary.md")


class UsageError(Exception):
    pass


def _utc():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _csv_ints(text, what):
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{what} '{text}': want comma-separated integers") from None
    if not vals or min(vals) < 1:
        raise UsageError(f"{what} '{text}': want integers >= 1")
    return sorted(set(vals))


def parse_args(argv):
    epilog = "presets:\n" + "\n".join(
        f"  {p.name:6} {p.description}; {p.expected}" for p in presets.PRESETS.values())
    ap = argparse.ArgumentParser(
        prog="ferry-matrix", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a matrix of Ferry training jobs (replication modes x worker counts x "
                    "models) on local clusters started by launch/ferry-launch; write runs.json, "
                    "runs.csv, summary.md and PNG plots under bench/results/<name>/.",
        epilog=epilog)
    ap.add_argument("--preset", default="small", choices=sorted(presets.PRESETS),
                    help="the matrix to run (default %(default)s)")
    ap.add_argument("--name", help="result folder name (default: the preset, plus "
                                   "-straggler-<delay> with --straggler)")
    ap.add_argument("--out", help="result folder (default bench/results/<name>)")
    ap.add_argument("--workers", help="worker counts, e.g. 1,2,4 (default: the preset's)")
    ap.add_argument("--modes", help="modes, e.g. sync,sync+backup1,async,ssp:2 "
                                    "(default: the preset's; ssp:{ssp} is --ssp's bound)")
    ap.add_argument("--models", help="models, e.g. mlp,ctr (default: the preset's)")
    ap.add_argument("--ssp", type=int, help="the second ssp bound of the matrix "
                                            "(default: the preset's)")
    ap.add_argument("--straggler", help="slow the last worker of every run with more than one "
                                        "worker: a delay per step (50ms) or a factor (x2)")
    ap.add_argument("--seed", type=int, default=1, help="trainer --seed (default %(default)s)")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--epochs", type=int, help="budget for every model, in epochs")
    budget.add_argument("--steps", type=int, help="budget for every model, in steps per worker")
    ap.add_argument("--evals", type=int, help="evaluations per run (default: the preset's)")
    ap.add_argument("--target-accuracy", type=float, help="mlp target (default: the preset's)")
    ap.add_argument("--target-auc", type=float, help="ctr target (default: the preset's)")
    ap.add_argument("--num-ps", type=int, help="ferry-ps servers per run (default: the preset's)")
    ap.add_argument("--run-timeout", type=float, metavar="S",
                    help="seconds one run may take before its job ends (default: the preset's); "
                         "a job that ended by then (its launcher stopping the cluster) is given "
                         "that stop, and recorded ok or failed")
    ap.add_argument("--plot-time", choices=("train", "wall"),
                    help="x axis of the quality-vs-time plots: training time (wall time minus "
                         "evaluation, as time to target; the default) or raw wall time")
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build"),
                    help="build dir or flat dir with ferry-ps and ferry-trainer "
                         "(default %(default)s)")
    ap.add_argument("--launcher", default=os.path.join(REPO, "launch", "ferry-launch"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--trainer-arg", action="append", default=[], metavar="ARG",
                    help="one more flag for every trainer (repeatable; e.g. "
                         "--trainer-arg=--device --trainer-arg=cpu)")
    ap.add_argument("--dry-run", action="store_true", help="print the launcher commands only")
    ap.add_argument("--report-only", metavar="DIR",
                    help="redo runs.csv, summary.md and the plots from DIR/runs.json")
    return ap.parse_args(argv)


def configure(args):
    """Options -> (preset, models, workers, modes, runs, skipped, name, out_dir)."""
    preset = presets.PRESETS[args.preset]
    try:
        if args.straggler:
            presets.parse_straggler(args.straggler)
        ssp = preset.ssp if args.ssp is None else args.ssp
        if ssp < 0:
            raise UsageError("--ssp must be >= 0")
        modes = presets.expand_modes(args.modes.split(",") if args.modes else preset.modes, ssp)
        presets.check_extra_args(args.trainer_arg)
    except ValueError as e:
        raise UsageError(str(e)) from None
    workers = _csv_ints(args.workers, "--workers") if args.workers else list(preset.workers)
    names = [n.strip() for n in args.models.split(",")] if args.models else list(preset.models)
    models = []
    for n in names:
        if n not in preset.models:
            raise UsageError(f"--models: unknown model '{n}' (known: "
                             f"{', '.join(preset.models)})")
        m = copy.deepcopy(preset.models[n])
        if args.epochs is not None or args.steps is not None:
            if (args.epochs or args.steps or 0) < 1:
                raise UsageError("--epochs / --steps must be >= 1")
            m.epochs, m.steps = args.epochs, args.steps
        if args.evals is not None:
            m.evals = max(1, args.evals)
        if n == "mlp" and args.target_accuracy is not None:
            m.target = args.target_accuracy
        if n == "ctr" and args.target_auc is not None:
            m.target = args.target_auc
        models.append(m)
    num_ps = args.num_ps or preset.num_ps
    runs, skipped = presets.build_runs(models, workers, modes, num_ps, args.seed,
                                       args.straggler, args.trainer_arg)
    if not runs:
        raise UsageError("the matrix is empty (every cell was skipped)")
    name = args.name or (preset.name + (f"-straggler-{args.straggler}" if args.straggler else ""))
    out = os.path.abspath(args.out or os.path.join(REPO, "bench", "results", name))
    return preset, models, workers, modes, runs, skipped, name, out


def find_binaries(bin_dir):
    found = []
    for name, sub in (("ferry-ps", "bin"), ("ferry-trainer", "bin")):
        cands = [os.path.join(bin_dir, sub, name), os.path.join(bin_dir, name)]
        path = next((c for c in cands if os.path.isfile(c) and os.access(c, os.X_OK)), None)
        if not path:
            raise UsageError(f"{name} not found in {bin_dir} (looked at {', '.join(cands)}); "
                             "build first: cmake --build build")
        found.append(path)
    return found


def preflight(args, trainer_bin):
    if not os.path.isfile(args.launcher):
        raise UsageError(f"launcher not found: {args.launcher}")
    try:
        r = subprocess.run([trainer_bin, "--help"], capture_output=True, text=True,
                           timeout=HELP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UsageError(f"{trainer_bin} --help did not answer in {HELP_TIMEOUT_S} s") from None
    except OSError as e:
        raise UsageError(f"cannot run {trainer_bin}: {e.strerror}") from None
    text = r.stdout + r.stderr
    missing = [f for f in REQUIRED_TRAINER_FLAGS if f not in text]
    if missing:
        raise UsageError(f"{trainer_bin} lacks {', '.join(missing)} (its --help does not list "
                         "them): this trainer is older than the harness; rebuild it")
    try:
        plots.find_gnuplot()
    except plots.PlotError as e:
        raise UsageError(str(e)) from None


def _model_doc(m):
    return {"name": m.name, "title": m.title, "args": m.args, "batch": m.batch,
            "budget": m.budget_text(), "epochs": m.epochs, "steps": m.steps, "evals": m.evals,
            "test_limit": m.test_limit, "quality": m.quality, "target": m.target,
            "loss_name": m.loss_name}


def write_outputs(doc, out, with_plots=True):
    """runs.json, runs.csv, plots, summary.md. Returns the plot error text, or None."""
    report.write_json(doc, os.path.join(out, "runs.json"))
    report.write_csv(doc, os.path.join(out, "runs.csv"))
    pngs, err = [], None
    if with_plots:
        try:
            pngs = plots.make_plots(doc, out)
        except plots.PlotError as e:
            err = str(e)
    report.write_summary(doc, os.path.join(out, "summary.md"), pngs)
    return err


def _say(msg):
    print(msg, flush=True)


def _one_line(spec, rec):
    if rec["status"] != "ok":
        return rec["status"].upper()
    r = rec["result"]
    t = r["target"]
    reached = (f"target at {t['train_s']:.1f} s / step {t['step']}" if t["reached"]
               else "target not reached")
    st = r["staleness"]
    return (f"ok  {spec.model.quality} {r['final']['quality']:.4f}, {reached}, "
            f"{r['throughput']['total']:,.0f} ex/s" +
            (f", staleness mean {st['mean']:.2f} max {st['max']}" if st else ""))


def respec(doc, run):
    """The RunSpec of a recorded run, rebuilt from runs.json (for --report-only)."""
    s = run["settings"]
    m = doc["config"]["models"][s["model"]]
    model = presets.ModelConfig(
        name=m["name"], title=m["title"], args=m["args"], batch=m["batch"],
        train_examples=0, quality=m["quality"], target=m["target"], epochs=m["epochs"],
        steps=m["steps"], evals=m["evals"], test_limit=m["test_limit"],
        loss_name=m.get("loss_name", "loss"))
    mode = presets.Mode(s["mode"], s["consistency"], s["backup_workers"])
    return presets.RunSpec(model, s["workers"], mode, s["num_ps"], s["seed"], s["straggler"])


def report_only(path, plot_time):
    try:
        doc = report.load_json(os.path.join(path, "runs.json"))
    except (OSError, ValueError) as e:
        print(f"ferry-matrix: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if plot_time:
        doc["config"]["plot_time"] = plot_time
    # Successful runs are summarised again from their metrics files, so a change in how the
    # harness derives its figures applies without running anything again.
    for run in doc["runs"]:
        run_dir = os.path.join(path, run.get("run_dir") or "")
        if run["status"] == "ok" and os.path.isfile(runner.metrics_path(run_dir, 0)):
            try:
                run["result"] = metrics.summarize(respec(doc, run), run_dir)
            except metrics.MetricsError as e:
                print(f"ferry-matrix: warning: {run['run_id']}: kept the recorded result: {e}",
                      file=sys.stderr)
    err = write_outputs(doc, path)
    if err:
        print(f"ferry-matrix: error: plots: {err}", file=sys.stderr)
        return EXIT_OUTPUT
    _say(f"ferry-matrix: rewrote {path}/runs.json, runs.csv, summary.md and plots/")
    return EXIT_OK


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv):
    # SIGTERM and SIGHUP (a cancelled job, a closed terminal) stop the matrix like Ctrl-C: the
    # running cluster is stopped and what finished is written.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    args = parse_args(argv)
    if args.report_only:
        return report_only(os.path.abspath(args.report_only), args.plot_time)
    try:
        preset, models, workers, modes, runs, skipped, name, out = configure(args)
        if args.dry_run:
            for spec in runs:
                argv_ = runner.launcher_argv(spec, args.launcher, args.bin_dir,
                                             os.path.join(out, "runs", spec.run_id), 60)
                print(f"[{spec.run_id}] {shlex.join(argv_)}")
            return EXIT_OK
        ps_bin, trainer_bin = find_binaries(args.bin_dir)
        preflight(args, trainer_bin)
    except UsageError as e:
        print(f"ferry-matrix: error: {e}", file=sys.stderr)
        return EXIT_USAGE

    timeout = args.run_timeout or preset.run_timeout_s
    os.makedirs(out, exist_ok=True)
    for g in GENERATED:  # everything here is ours and regenerated
        p = os.path.join(out, g)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    started = time.monotonic()
    doc = {
        "format": report.FORMAT, "name": name, "preset": preset.name,
        "description": preset.description,
        "command": "bench/ferry-matrix " + shlex.join(argv) if argv else "bench/ferry-matrix",
        "started_utc": _utc(), "finished_utc": None, "duration_s": 0.0,
        "load_average": {"start": machine.load_average(), "end": None},
        "machine": machine.describe(REPO, trainer_bin, out),
        "config": {"workers": workers, "modes": [m.name for m in modes],
                   "ssp": args.ssp if args.ssp is not None else preset.ssp,
                   "straggler": args.straggler, "seed": args.seed,
                   "num_ps": runs[0].num_ps, "run_timeout_s": timeout,
                   "extra_args": args.trainer_arg, "plot_time": args.plot_time or "train", "bin_dir": os.path.abspath(args.bin_dir),
                   "models": {m.name: _model_doc(m) for m in models}},
        "skipped": [{"model": a, "workers": b, "mode": c, "why": d} for a, b, c, d in skipped],
        "runs": [],
    }
    _say(f"ferry-matrix: preset {preset.name}, {len(runs)} runs -> {out}")
    interrupted = False
    try:
        for i, spec in enumerate(runs, 1):
            run_dir = os.path.join(out, "runs", spec.run_id)
            _say(f"[{i}/{len(runs)}] {spec.run_id}"
                 + (f" (straggler {spec.straggler})" if spec.straggler else "") + " ...")
            rec = runner.run_one(spec, args.launcher, args.bin_dir, run_dir, timeout, echo=_say)
            rec["result"] = None
            if rec["status"] == "ok":
                try:
                    rec["result"] = metrics.summarize(spec, run_dir)
                except metrics.MetricsError as e:
                    rec["status"] = "failed"
                    rec["summary"] = [f"ferry-matrix: bad metrics: {e}"]
                    _say("    " + rec["summary"][0])
            rec["run_dir"] = os.path.relpath(run_dir, out)
            doc["runs"].append({"run_id": spec.run_id, "settings": spec.describe(), **rec})
            _say(f"    {_one_line(spec, rec)}  ({rec['duration_s']:.1f} s)")
            doc["duration_s"] = round(time.monotonic() - started, 1)
            report.write_json(doc, os.path.join(out, "runs.json"))  # progress survives a crash
    except KeyboardInterrupt:
        interrupted = True
        _say("ferry-matrix: interrupted; writing what finished")
    doc["finished_utc"] = _utc()
    doc["duration_s"] = round(time.monotonic() - started, 1)
    doc["load_average"]["end"] = machine.load_average()
    err = write_outputs(doc, out)
    failed = [r["run_id"] for r in doc["runs"] if r["status"] != "ok"]
    _say(f"ferry-matrix: {len(doc['runs'])} runs in {doc['duration_s']:.0f} s, "
         f"{len(failed)} did not succeed{': ' + ', '.join(failed) if failed else ''}")
    _say(f"ferry-matrix: wrote {out}/runs.json, runs.csv, summary.md" +
         (", plots/" if not err else ""))
    _say(f"ferry-matrix: each run's metrics and logs: {os.path.join(out, 'runs')}/ (not tracked by git)")
    if interrupted:
        return EXIT_INTERRUPTED
    if err:
        print(f"ferry-matrix: error: plots: {err}", file=sys.stderr)
        return EXIT_OUTPUT
    return EXIT_RUNS_FAILED if failed else EXIT_OK
