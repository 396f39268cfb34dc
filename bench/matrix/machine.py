"""What the runs ran on: CPU, memory, OS, GPU, load, code version. Every probe is bounded by a
timeout and yields "unknown" rather than failing the matrix."""

import datetime
import os
import platform
import shutil
import subprocess
import sys

PROBE_TIMEOUT_S = 10


def _run(argv, cwd=None):
    try:
        r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _relative(path, root):
    path = os.path.abspath(path)
    return os.path.relpath(path, root) if path.startswith(os.path.abspath(root) + os.sep) else path


def describe(repo_root, trainer_bin, results_dir=None):
    """The machine and code of a matrix. Results are not code: changes under bench/results/ and
    results_dir (the matrix's own output folder, tracked and now being regenerated) are not
    counted as uncommitted changes."""
    cpu = next((l.split(":", 1)[1].strip() for l in _read("/proc/cpuinfo").splitlines()
                if l.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(l.split()[1]) for l in _read("/proc/meminfo").splitlines()
                   if l.startswith("MemTotal:")), None)
    os_name = next((l.split("=", 1)[1].strip().strip('"')
                    for l in _read("/etc/os-release").splitlines()
                    if l.startswith("PRETTY_NAME=")), platform.system())
    gpu = None
    if shutil.which("nvidia-smi"):
        gpu = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=repo_root)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo_root)
    results = tuple(_relative(d, repo_root).rstrip("/") + "/"
                    for d in [os.path.join(repo_root, "bench", "results")] + [results_dir or ""]
                    if d)
    # "XY path" lines (the first one's leading blank is stripped by _run)
    dirty = None if status is None else "\n".join(
        l for l in status.splitlines() if not l.split(maxsplit=1)[1].startswith(results))
    gnuplot = _run(["gnuplot", "--version"]) if shutil.which("gnuplot") else None
    trainer_mtime = None
    try:
        trainer_mtime = datetime.datetime.fromtimestamp(
            os.path.getmtime(trainer_bin), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1) if mem_kb else None,
        "os": os_name,
        "kernel": platform.release(),
        "gpu": gpu or "none",
        "python": sys.version.split()[0],
        "gnuplot": gnuplot,
        "git_commit": commit,
        "git_dirty": bool(dirty) if dirty is not None else None,
        "git_modified": [l.split(maxsplit=1)[1] for l in dirty.splitlines()] if dirty else [],
        "trainer_binary": _relative(trainer_bin, repo_root),
        "trainer_built": trainer_mtime,
    }
