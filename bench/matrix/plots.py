"""PNG plots with gnuplot (Debian: gnuplot-nox), three per model:

  <model>-quality-vs-time.png   test quality against training time (wall time minus evaluation;
                                raw wall time with --plot-time wall), one panel per worker
                                count, one line per mode, the target as a dashed line
  <model>-quality-vs-steps.png  the same against rank 0's steps
  <model>-throughput.png        examples/s (all workers, and per worker) against worker count,
                                one line per mode

Each plot is written as a self-contained gnuplot script (the data in datablocks) under
plots/src/, so it can be re-rendered or restyled by hand: `gnuplot plots/src/<name>.gp` from the
result folder. Only successful runs are drawn.
"""

import os
import shutil
import subprocess

GNUPLOT_TIMEOUT_S = 60
PANEL_W, PANEL_H = 640, 520
# One colour and point type per mode, in the order of the matrix's mode list.
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
          "#17becf"]
POINTS = [7, 5, 9, 11, 13, 15, 4, 6]
QUALITY_LABEL = {"accuracy": "test accuracy (fraction correct)", "auc": "test AUC (ROC)"}


class PlotError(Exception):
    pass


def find_gnuplot():
    """The gnuplot executable; PlotError with what to install when there is none."""
    path = shutil.which("gnuplot")
    if not path:
        raise PlotError("gnuplot not found on PATH: install Debian's gnuplot-nox "
                        "(apt-get install gnuplot-nox; ./build.sh installs it)")
    return path


def _terminal(gnuplot):
    try:
        r = subprocess.run([gnuplot, "-e", "set terminal pngcairo"], capture_output=True,
                           text=True, timeout=GNUPLOT_TIMEOUT_S)
        if r.returncode == 0 and not r.stderr.strip():
            return "pngcairo"
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "png"


def _q(text):
    """A gnuplot double-quoted string."""
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _style(i):
    return f"lc rgb {_q(COLORS[i % len(COLORS)])} pt {POINTS[i % len(POINTS)]} ps 1.0 lw 2"


class _Script:
    def __init__(self, terminal, out_png, panels, title):
        self.blocks, self.body, self.n = [], [], 0
        w = PANEL_W * panels
        font = "Sans,11" if terminal == "pngcairo" else "Sans 10"
        self.head = [f"set terminal {terminal} size {w},{PANEL_H} noenhanced font {_q(font)}",
                     f"set output {_q(out_png)}",
                     "set grid",
                     f"set multiplot layout 1,{panels} title {_q(title)} font {_q('Sans,13')}"
                     if terminal == "pngcairo" else
                     f"set multiplot layout 1,{panels} title {_q(title)}"]

    def data(self, rows):
        name = f"$d{self.n}"
        self.n += 1
        self.blocks += [f"{name} << EOD"] + [" ".join(f"{v:.6g}" for v in r) for r in rows] + \
            ["EOD"]
        return name

    def panel(self, title, xlabel, ylabel, plots, extra=()):
        self.body += ["set autoscale", "unset label 1",
                      "set key below horizontal box maxcols 3 Left reverse width 2",
                      "set bmargin 7",
                      f"set title {_q(title)}", f"set xlabel {_q(xlabel)}",
                      f"set ylabel {_q(ylabel)}"] + list(extra)
        if plots:
            self.body.append("plot " + ", \\\n     ".join(plots))
        else:
            self.body += ["set xrange [0:1]", "set yrange [0:1]",
                          'set label 1 "no successful run" at graph 0.5, 0.5 center',
                          "plot NaN notitle"]

    def text(self):
        return "\n".join(self.head + self.blocks + self.body + ["unset multiplot", ""])


def _ok_runs(doc, model):
    return [r for r in doc["runs"] if r["status"] == "ok" and r.get("result")
            and r["settings"]["model"] == model]


def _quality_plot(doc, model, m, terminal, xcol, xlabel, what, out_png):
    cfg = doc["config"]
    runs = _ok_runs(doc, model)
    workers = cfg["workers"]
    strag = cfg.get("straggler")
    title = (f"{m['title']}: {QUALITY_LABEL[m['quality']].split(' (')[0]} vs {what}"
             f" - {doc['name']}" + (f", straggler {strag} on the last worker" if strag else ""))
    sc = _Script(terminal, out_png, len(workers), title)
    for w in workers:
        plots = []
        for i, mode in enumerate(cfg["modes"]):
            run = next((r for r in runs if r["settings"]["workers"] == w
                        and r["settings"]["mode"] == mode), None)
            if not run or not run["result"]["curve"]:
                continue
            rows = [(p["step"], p["wall_s"], p["train_s"], p["quality"])
                    for p in run["result"]["curve"]]
            d = sc.data(rows)
            plots.append(f"{d} using {xcol}:4 with linespoints {_style(i)} title {_q(mode)}")
        if plots:
            plots.append(f"{m['target']} with lines dt 2 lw 1.5 lc rgb \"gray40\" "
                         f"title {_q('target ' + str(m['target']))}")
        ptitle = f"{w} worker" + ("s" if w != 1 else "")
        if strag and w > 1:
            ptitle += f" (rank {w - 1} slowed: {strag})"
        sc.panel(ptitle, xlabel, QUALITY_LABEL[m["quality"]], plots)
    return sc.text()


def _throughput_plot(doc, model, m, terminal, out_png):
    cfg = doc["config"]
    runs = _ok_runs(doc, model)
    strag = cfg.get("straggler")
    title = (f"{m['title']}: training throughput vs worker count - {doc['name']}" +
             (f", straggler {strag} on the last worker" if strag else ""))
    sc = _Script(terminal, out_png, 2, title)
    series = []
    for i, mode in enumerate(cfg["modes"]):
        rows = sorted((r["settings"]["workers"], r["result"]["throughput"]["total"],
                       r["result"]["throughput"]["per_worker_mean"])
                      for r in runs if r["settings"]["mode"] == mode)
        if rows:
            series.append((i, mode, sc.data(rows)))
    ws = cfg["workers"]
    extra = [f"set xtics ({', '.join(str(w) for w in ws)})",
             f"set xrange [{min(ws) - 0.5}:{max(ws) + 0.5}]", "set yrange [0:*]"]
    for col, ptitle, ylabel in ((2, "all workers", "examples/s, all workers (evaluation excluded)"),
                                (3, "per worker (mean)", "examples/s per worker (evaluation excluded)")):
        plots = [f"{d} using 1:{col} with linespoints {_style(i)} title {_q(mode)}"
                 for i, mode, d in series]
        sc.panel(ptitle, "workers", ylabel, plots, extra)
    return sc.text()


def make_plots(doc, result_dir):
    """Writes plots/src/*.gp and renders plots/*.png. Returns the PNG paths relative to
    result_dir. PlotError when gnuplot is missing, fails, or leaves no PNG."""
    gnuplot = find_gnuplot()
    terminal = _terminal(gnuplot)
    plots_dir = os.path.join(result_dir, "plots")
    src_dir = os.path.join(plots_dir, "src")
    os.makedirs(src_dir, exist_ok=True)
    jobs = []
    for name, m in doc["config"]["models"].items():
        if not any(r["settings"]["model"] == name for r in doc["runs"]):
            continue
        if doc["config"].get("plot_time", "train") == "wall":
            xcol, xlabel, what = 2, "wall time since training started (s)", "wall time"
        else:
            xcol, xlabel, what = 3, "training time (s, wall time minus evaluation)", "training time"
        jobs.append((f"{name}-quality-vs-time", _quality_plot(
            doc, name, m, terminal, xcol, xlabel, what, f"{name}-quality-vs-time.png")))
        jobs.append((f"{name}-quality-vs-steps", _quality_plot(
            doc, name, m, terminal, 1, "training steps (rank 0)", "training steps",
            f"{name}-quality-vs-steps.png")))
        jobs.append((f"{name}-throughput", _throughput_plot(
            doc, name, m, terminal, f"{name}-throughput.png")))
    made = []
    for base, script in jobs:
        gp = os.path.join(src_dir, base + ".gp")
        with open(gp, "w", encoding="utf-8") as f:
            f.write(script)
        png = os.path.join(plots_dir, base + ".png")
        if os.path.exists(png):
            os.remove(png)
        try:
            r = subprocess.run([gnuplot, os.path.join("src", base + ".gp")], cwd=plots_dir,
                               capture_output=True, text=True, timeout=GNUPLOT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PlotError(f"gnuplot took more than {GNUPLOT_TIMEOUT_S} s on {gp}") from None
        if r.returncode != 0 or not os.path.isfile(png) or os.path.getsize(png) == 0:
            raise PlotError(f"gnuplot failed on {gp} (exit {r.returncode}): "
                            f"{r.stderr.strip()[-1500:]}")
        made.append(os.path.join("plots", base + ".png"))
    return made
