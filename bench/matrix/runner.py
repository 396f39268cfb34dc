"""One run of the matrix: a local cluster started by launch/ferry-launch, waited for with a deadline.

The launcher's own output (every process's lines, prefixed) goes to RUN_DIR/launcher.log, the
per-process logs to RUN_DIR/logs/, each worker's metrics to RUN_DIR/metrics-<rank>.jsonl. A run
that fails or overruns its deadline is reported, never raised: the matrix goes on.

Stopping a run: SIGTERM to the launcher (it stops the whole cluster, SIGKILL after its --grace),
then SIGKILL to the launcher if it is still there after STOP_WAIT_S; its children die with it
(the launcher starts them with PR_SET_PDEATHSIG). The launcher itself gets SIGTERM when
ferry-matrix dies, however it dies (PR_SET_PDEATHSIG too), so no cluster outlives the harness.
"""

import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

LAUNCH_GRACE_S = 5.0     # ferry-launch --grace: SIGTERM to SIGKILL for the cluster's processes
STOP_WAIT_S = 20.0       # how long a SIGTERMed launcher gets to stop its cluster
# How long a launcher that had begun to stop its cluster by the run's deadline (its job had ended:
# every worker finished, or one failed) gets to finish that stop and exit: --grace, then its
# SIGKILL and reaping (ferry_launch.common.REAP_TIMEOUT_S), with room for a loaded machine.
FINISH_WAIT_S = LAUNCH_GRACE_S + 15.0
SUMMARY_MAX_LINES = 30


_PR_SET_PDEATHSIG = 1


def _die_with_harness(harness_pid):
    """preexec_fn for the launcher: it gets SIGTERM (and stops its cluster) when ferry-matrix
    dies, even by SIGKILL; if ferry-matrix is already gone, at once."""
    libc = ctypes.CDLL(None, use_errno=True)

    def setup():
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != harness_pid:
            os.kill(os.getpid(), signal.SIGTERM)
    return setup


def metrics_path(run_dir, rank):
    return os.path.join(run_dir, f"metrics-{rank}.jsonl")


def launcher_argv(spec, launcher, bin_dir, run_dir, rendezvous_timeout_s):
    return ([sys.executable, launcher, "--num-ps", str(spec.num_ps),
             "--num-workers", str(spec.workers), "--bin-dir", bin_dir, "--base-port", "0",
             "--log-dir", os.path.join(run_dir, "logs"),
             "--rendezvous-timeout", f"{rendezvous_timeout_s:g}", "--grace", f"{LAUNCH_GRACE_S:g}",
             # A run measures one job as it ran: a process that dies fails the run, rather than
             # being restarted into a run whose times would mix two processes.
             "--max-restarts", "0",
             "--"] + spec.trainer_args(os.path.join(run_dir, "metrics-{rank}.jsonl")))


def _stop(proc):
    """Stops a launcher we started (by its pid) and reaps it. Bounded: at most ~STOP_WAIT_S + 10 s."""
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(STOP_WAIT_S)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the launcher alone
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass  # a zombie we cannot reap: report it and move on


def failure_lines(log_text):
    """The launcher's summary of what went wrong: its FAILED / error / timeout lines and the
    indented log tail under a FAILED line; the last lines of the log when it said nothing."""
    out, in_failed = [], False
    for line in log_text.splitlines():
        if line.startswith("ferry-launch: "):
            body = line[len("ferry-launch: "):]
            in_failed = body.startswith("FAILED")
            if in_failed or body.startswith(("error", "rendezvous timed out", "warning",
                                             "stopped by", "stopping")):
                out.append(line)
        elif in_failed and line.startswith("  "):
            out.append(line)
        else:
            in_failed = False
    if not out:
        out = log_text.splitlines()[-10:]
    return out[-SUMMARY_MAX_LINES:]


def _log_tails(log_dir, n=3):
    """The last n lines of every process's log: where each one was when a run overran."""
    out = []
    for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
        with open(os.path.join(log_dir, name), encoding="utf-8", errors="replace") as f:
            tail = f.read().splitlines()[-n:]
        out.append(f"  last lines of {name}:")
        out += [f"    {l}" for l in tail] or ["    (no output)"]
    return out


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def job_ended(log_text):
    """True when the launcher's log says it is stopping its cluster: the job has ended (every
    worker finished, or a process failed and the launcher stops the others), and what remains is
    the launcher's bounded stop (--grace, then SIGKILL). ferry-matrix runs it with --max-restarts
    0, so a stop is never one before a restart."""
    return any(line.startswith("ferry-launch: stopping ") for line in log_text.splitlines())


def _attempt(argv, run_dir, timeout_s):
    """One launcher run. Returns (status "ok" | "failed" | "timeout", rc, seconds, log text).

    "timeout" means the job had not ended at the deadline. A job that had (its launcher was
    stopping the cluster: on a loaded machine that stop alone can take seconds) is given
    FINISH_WAIT_S to exit, and the launcher's exit status says whether the run failed."""
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)  # stale metrics of an earlier run must not be read as this one's
    os.makedirs(os.path.join(run_dir, "logs"))
    with open(os.path.join(run_dir, "command.txt"), "w", encoding="utf-8") as f:
        f.write(shlex.join(argv) + "\n")
    log_path = os.path.join(run_dir, "launcher.log")
    start = time.monotonic()
    status, rc = "ok", None
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_harness(os.getpid()))
        try:
            try:
                rc = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                if not job_ended(_read(log_path)):
                    raise
                rc = proc.wait(FINISH_WAIT_S)
        except subprocess.TimeoutExpired:
            status = "timeout"
            _stop(proc)
            rc = proc.returncode
        except KeyboardInterrupt:
            _stop(proc)
            raise
    if status == "ok" and rc != 0:
        status = "failed"
    return status, rc, time.monotonic() - start, _read(log_path)


def _before_workers(log_text):
    """True when the launcher failed before it started any worker: a preflight or rendezvous
    failure, which on a busy machine is usually a port taken between choosing and binding it."""
    return "started worker" not in log_text


def run_one(spec, launcher, bin_dir, run_dir, timeout_s, echo=None):
    """Runs one cluster. Returns a dict: status ("ok" | "failed" | "timeout"), launcher_rc,
    duration_s, summary (lines, for a run that did not succeed), attempts, run_dir, command.

    A cluster that fails before any worker starts is tried once more (the first attempt's
    summary is kept in "first_attempt"); a failed or overrun training run is not.
    KeyboardInterrupt stops the cluster and is re-raised."""
    argv = launcher_argv(spec, launcher, bin_dir, run_dir, min(60.0, timeout_s))
    first = None
    for attempt in (1, 2):
        status, rc, duration, log_text = _attempt(argv, run_dir, timeout_s)
        if status != "failed" or not _before_workers(log_text) or attempt == 2:
            break
        first = [f"ferry-launch exited with status {rc} before starting any worker"] + \
            failure_lines(log_text)
        if echo:
            echo("    failed before any worker started; trying once more:")
            for line in first:
                echo("      " + line)
    summary = []
    if status == "timeout":
        summary = [f"ferry-matrix: no result after {timeout_s:g} s; stopped the cluster "
                   f"(launcher {'exit status ' + str(rc) if rc is not None else 'not reaped'})"]
        summary += failure_lines(log_text) + _log_tails(os.path.join(run_dir, "logs"))
    elif status == "failed":
        summary = [f"ferry-matrix: ferry-launch exited with status {rc}"] + failure_lines(log_text)
    if echo and summary:
        for line in summary:
            echo("    " + line)
    out = {"status": status, "launcher_rc": rc, "duration_s": round(duration, 3),
           "summary": summary, "attempts": attempt, "run_dir": run_dir,
           "command": shlex.join(argv)}
    if first:
        out["first_attempt"] = first
    return out
