"""The Slurm backend, the launcher's side: one srun step with a task per process."""

import json
import os
import queue
import re
import shlex
import shutil
import signal
import time

from . import common
from .commands import Binaries, build_commands, passed_through
from .curve import (
    check_key_folder, curve_by_default, exposure_warning, folder_for_commands, make_job_keys)
from .common import (
    EXIT_FAILED, EXIT_OK, LAUNCHER_PATH, LaunchError, SRUN_LABEL_RE, SRUN_TASK_ERROR_RE,
    STOP_MARGIN_S, StartFailed, TASK_EXIT_RE, TASK_STARTED_RE)
from .hosts import expand_hostlist, is_local
from .preflight import (
    check_binaries_here, check_checkpoint_folder, check_port_here, check_port_there,
    check_program_here, ferry_binaries, make_log_dir, program_warning)
from .spec import cluster_from_nodes
from .supervise import Child, Stream, Supervisor, cause_report, describe_status, reap_all


class SlurmLauncher(Supervisor):
    """Runs the cluster as one srun step and supervises it through srun's labelled output.

    Rendezvous: every task must have started its process (a worker's task first waits for the
    servers) within --rendezvous-timeout of srun's start; until then the launcher says every
    WAIT_REPORT_EVERY_S which tasks it waits for (not started by srun yet, e.g. while srun
    waits for resources, or started and waiting)."""

    def __init__(self, cluster, opts, console, signals, srun_argv, hostfile):
        super().__init__(opts, console, signals)
        self.cluster, self.srun_argv, self.hostfile = cluster, srun_argv, hostfile
        self.tasks = cluster.tasks
        # Written by the reader thread before the event that tells the main thread.
        self.rc = [None] * len(self.tasks)      # exit status each task reported
        self.heard = [False] * len(self.tasks)  # the task wrote a line: srun started it
        self.up = [False] * len(self.tasks)     # the task started its process
        self.child = None

    def _on_line(self, text):
        m = SRUN_LABEL_RE.match(text)
        if m and int(m.group(1)) < len(self.tasks):
            i = int(m.group(1))
            self.streams[i].line(m.group(2))
            self.heard[i] = True
            if not self.up[i] and TASK_STARTED_RE.match(m.group(2)):
                self.up[i] = True
                self.events.put(("up", i))
            end = TASK_EXIT_RE.search(m.group(2))
            if end and self.rc[i] is None:
                self.rc[i] = int(end.group(1))
                self.events.put(("task", i))
            return
        self.srun_stream.line(text)
        # A task that died without its exit line (killed, or the task wrapper itself failed):
        # srun says "srun: error: HOST: task 3: Exited with exit code 1" / "tasks 0-1: Killed".
        m = SRUN_TASK_ERROR_RE.match(text)
        if not m:
            return
        code = re.search(r"exit code (\d+)", m.group(2))
        rc = int(code.group(1)) if code else (-signal.SIGKILL if "Killed" in m.group(2) else 1)
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                continue
            for i in range(int(lo), int(hi or lo) + 1):
                if i < len(self.tasks) and self.rc[i] is None:
                    self.rc[i] = rc
                    self.events.put(("task", i))

    def stop_all(self, reason):
        """Closes the step's stdin (each task stops its process: SIGTERM, SIGKILL after the grace
        period); if srun is still there STOP_MARGIN_S later, SIGTERM to srun (Slurm then kills
        the step), and SIGKILL another STOP_MARGIN_S later."""
        self.signals.stopping = True
        c = self.child
        if c is None:
            return
        if not c.done.is_set():
            self.say(f"stopping the srun step ({reason})")
            c.close_stdin()
            if not c.done.wait(self.opts.grace + STOP_MARGIN_S):
                self.say("srun still running; sending it SIGTERM (Slurm kills the step's tasks)",
                         err=True)
                c.signal_group(signal.SIGTERM)
                if not c.done.wait(STOP_MARGIN_S):
                    self.say("srun ignored SIGTERM; sending SIGKILL", err=True)
                    c.signal_group(signal.SIGKILL)
        reap_all([(c, f"srun pid {c.pid}")], self.say)
        c.close_stdin()
        c.join_output()

    def failure_summary(self, i, what):
        t, s = self.tasks[i], self.streams[i]
        lines = [f"{t.name} (slurm task {i} on {t.host}) {what}: {describe_status(self.rc[i])}"]
        lines += cause_report(s)
        self.say("FAILED: " + "\n".join(lines), err=True)

    def _waiting_for(self, waiting):
        """Which tasks the rendezvous still waits for, and why: one line."""
        def names(ids):
            return ", ".join(f"{self.tasks[i].name} (slurm task {i} on {self.tasks[i].host})"
                             for i in ids)
        silent = [i for i in waiting if not self.heard[i]]
        started = [i for i in waiting if self.heard[i]]
        parts = []
        if silent:
            parts.append(f"not started by srun yet (waiting for resources?): {names(silent)}")
        if started:
            parts.append(f"started, not running yet (workers wait for their servers): "
                         f"{names(started)}")
        return "; ".join(parts)

    def _task_ended(self, i, running):
        """Task i reported its exit: None to go on, else the launcher's exit status."""
        t = self.tasks[i]
        if t.role == "worker" and self.rc[i] == 0:
            running.discard(i)
            self.say(f"{t.name} finished (exit status 0)")
            return None
        what = "failed" if t.role == "worker" else "exited unexpectedly"
        self.stop_all(f"{t.name} {what}")
        self.failure_summary(i, what)
        return EXIT_FAILED

    def _run(self):
        log = self.opts.log_dir
        self.say(f"logs in {log}")
        self.streams = [Stream(t.name, os.path.join(log, f"{t.role}-{t.rank}.log"), self.console)
                        for t in self.tasks]
        self.srun_stream = Stream("srun", os.path.join(log, "srun.log"), self.console)
        env = dict(os.environ, SLURM_HOSTFILE=self.hostfile)
        with self.signals.held():
            # If the launcher dies, srun gets SIGTERM and has Slurm kill the step.
            try:
                self.child = Child(self.srun_argv, self.events, self._on_line, "srun", env=env,
                                   keep_stdin=True, death_signal=signal.SIGTERM)
            except OSError as e:
                raise StartFailed(f"cannot start {self.srun_argv[0]}: {e.strerror}") from None
            self.say(f"started srun pid {self.child.pid}: SLURM_HOSTFILE={self.hostfile} "
                     f"{shlex.join(self.srun_argv)}")
        start = time.monotonic()
        deadline, next_report = start + self.opts.rendezvous_timeout, start + common.WAIT_REPORT_EVERY_S
        rendezvous = True  # until every task has started its process
        running = {i for i, t in enumerate(self.tasks) if t.role == "worker"}
        while running:
            timeout = None  # afterwards: supervise until the workers or srun end
            if rendezvous:
                waiting = [i for i in range(len(self.tasks))
                           if not self.up[i] and self.rc[i] is None]
                now = time.monotonic()
                if not waiting:
                    rendezvous = False
                    self.say(f"rendezvous: all {len(self.tasks)} tasks of the step running "
                             f"({now - start:.1f} s)")
                elif now >= deadline:
                    self.say(f"rendezvous timed out after {self.opts.rendezvous_timeout:g} s: "
                             f"{self._waiting_for(waiting)}", err=True)
                    self.stop_all("rendezvous timed out")
                    return EXIT_FAILED
                else:
                    if now >= next_report:
                        self.say(f"waiting for the srun step, {now - start:.0f} s: "
                                 f"{self._waiting_for(waiting)}")
                        next_report = now + common.WAIT_REPORT_EVERY_S
                    timeout = min(deadline, next_report) - now
            try:
                kind, what = self.events.get(timeout=timeout)
            except queue.Empty:
                continue
            if kind == "up":
                continue
            if kind == "task":
                rc = self._task_ended(what, running)
                if rc is not None:
                    return rc
                continue
            # srun ended. Exit lines still in its pipe come first: read them, then judge.
            self.child.join_output()
            while running:
                try:
                    kind, what = self.events.get_nowait()
                except queue.Empty:
                    break
                if kind != "task":
                    continue
                rc = self._task_ended(what, running)
                if rc is not None:
                    return rc
            if not running:
                break
            silent = [t.name for i, t in enumerate(self.tasks) if self.rc[i] is None]
            lines = [f"srun (pid {self.child.pid}) ended with "
                     f"{describe_status(self.child.returncode)} before all workers finished"]
            if silent:
                lines.append(f"  no exit reported by: {', '.join(silent)}")
            lines += cause_report(self.srun_stream)
            self.say("FAILED: " + "\n".join(lines), err=True)
            return EXIT_FAILED
        self.stop_all("all workers finished")
        self.say(f"done: {len(self.cluster.workers)} workers finished, "
                 f"{len(self.cluster.ps)} servers stopped")
        return EXIT_OK


def slurm_task_argv(cluster, binaries, opts):
    """What every task of the step runs: this launcher in --slurm-task mode, with the plan."""
    plan = {"ps": [t.address for t in cluster.ps], "worker": [t.host for t in cluster.workers]}
    gpus = "auto" if opts.gpus_per_host is None else str(opts.gpus_per_host)
    return ([LAUNCHER_PATH, "--slurm-task", "--spec-json", json.dumps(plan, separators=(",", ":")),
             "--bin-dir", binaries.bin_dir, "--ps-threads", str(opts.ps_threads),
             "--gpus-per-host", gpus, "--rendezvous-timeout", f"{opts.rendezvous_timeout:g}",
             "--grace", f"{opts.grace:g}", "--metrics", getattr(opts, "metrics", "loopback")]
            + ([f"--ps-arg={shlex.join(opts.ps_args)}"] if opts.ps_args else [])
            + (["--resume", opts.resume] if opts.resume else
               ["--checkpoint-dir", opts.checkpoint_dir] if opts.checkpoint_dir else [])
            + (["--checkpoint-every", str(opts.checkpoint_every)] if opts.checkpoint_every
               else [])
            + (["--curve-keys", folder_for_commands(opts)] if folder_for_commands(opts) else [])
            + (["--disk-tier-dir", opts.disk_tier_dir] if getattr(opts, "disk_tier_dir", None) else [])
            + ["--"] + passed_through(opts))


def run_slurm(opts, console, signals, why):
    """The Slurm backend: plan, print (--dry-run) or preflight, then one srun step."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError("--slurm: SLURM_JOB_NODELIST is not set (run inside an allocation: "
                          "sbatch or salloc)")
    if opts.spec:
        raise LaunchError("--slurm takes its hosts from SLURM_JOB_NODELIST; it cannot be "
                          "combined with --spec")
    if opts.num_ps is None or opts.num_workers is None:
        raise LaunchError("the Slurm backend needs --num-ps and --num-workers (hosts come from "
                          "SLURM_JOB_NODELIST)")
    nodes = expand_hostlist(nodelist)
    srun = shlex.split(opts.srun)
    if not srun:
        raise LaunchError("--srun: empty command")
    cluster = cluster_from_nodes(nodes, opts.num_ps, opts.num_workers, opts.base_port)
    binaries = Binaries(opts.bin_dir)
    explicit = opts.gpus_per_host
    # Shown and checked here; each task rebuilds its own command on its node (where "auto"
    # means that node's CUDA_VISIBLE_DEVICES, else its nvidia-smi -L count).
    cards = [str(i) for i in range(explicit or 0)]
    curve_note = curve_by_default(cluster, opts)
    build_commands(cluster, binaries, opts, lambda t: cards)
    warning = exposure_warning(cluster, opts)
    hosts = [t.host for t in cluster.tasks]
    used = list(dict.fromkeys(hosts))
    srun_argv = srun + [f"--ntasks={len(hosts)}", f"--nodes={len(used)}",
                        "--distribution=arbitrary", "--label", "--input=all"]
    srun_base = len(srun_argv)
    srun_argv += slurm_task_argv(cluster, binaries, opts)
    hostfile = os.path.join(opts.log_dir or "LOG_DIR", "slurm-hostfile")

    console.say(f"Slurm backend ({why}): {len(cluster.ps)} ps + {len(cluster.workers)} workers "
                f"on {len(used)} of {len(nodes)} nodes of SLURM_JOB_NODELIST={nodelist}; "
                "ps r on node r mod K, worker w on node w mod K")
    if curve_note:
        console.say(curve_note)
    if opts.checkpoint_dir or getattr(opts, "replication", 1) == 2:
        console.say("Slurm backend: nothing is restarted (--max-restarts does not apply): a "
                    "process that dies ends the step" +
                    ("; --resume DIR then continues the job from its newest checkpoint"
                     if opts.checkpoint_dir else "") +
                    (" (with --replication 2 too: a dead server is not replaced with --recover "
                     "here, as the local and ssh backends do)"
                     if getattr(opts, "replication", 1) == 2 else ""))
    python_note = program_warning(opts)
    if python_note:
        console.say(python_note, err=True)
    if explicit is None:
        console.say("trainers: --gpus-per-host auto: each task takes its node's GPUs from "
                    "CUDA_VISIBLE_DEVICES when set there, else counts them (nvidia-smi -L), and "
                    "gives trainers one each in turn")
    if opts.dry_run:
        print(f"[srun] SLURM_HOSTFILE={hostfile} {shlex.join(srun_argv)}")
        print(f"[hostfile] {','.join(hosts)}")
        for i, t in enumerate(cluster.tasks):
            print(f"[{t.name}] (slurm task {i} on {t.host}) {t.command_text()}")
        if opts.curve:
            console.say(f"--curve: {binaries.keys_tool} would make the job's keys in "
                        f"{folder_for_commands(opts)}")
        if warning:
            console.say(warning, err=True)
        return EXIT_OK

    if shutil.which(srun[0]) is None:
        raise LaunchError(f"preflight: srun command not found: {srun[0]} (--srun sets it)")
    program = opts.worker_command[0] if opts.worker_command else None
    check_binaries_here([LAUNCHER_PATH] + ferry_binaries(cluster.tasks, binaries, False, program)
                        + ([binaries.keys_tool] if opts.curve else []))
    if program:  # on this machine: every node sees the same file system
        check_program_here(program)
    for t in cluster.ps:
        (check_port_here if is_local(t.host) else check_port_there)(t)
    if opts.curve_keys:  # every node reads it at this path: all of it must be here too
        check_key_folder(opts.keys_dir, cluster.tasks, len(cluster.workers))
    check_checkpoint_folder(opts)
    make_log_dir(opts)
    if opts.curve:  # each task checks, on its node, the files its process reads
        make_job_keys(binaries.keys_tool, opts, len(cluster.workers), console.say)
        build_commands(cluster, binaries, opts, lambda t: cards)
        srun_argv = srun_argv[:srun_base] + slurm_task_argv(cluster, binaries, opts)
        console.say(f"--curve: the job's keys are in {opts.keys_dir} (owner-only; every node "
                    "must see this folder at this path; --curve-keys uses them again)")
    hostfile = os.path.join(opts.log_dir, "slurm-hostfile")
    try:
        with open(hostfile, "w", encoding="utf-8") as f:
            f.write("\n".join(hosts) + "\n")
    except OSError as e:
        raise LaunchError(f"preflight: cannot write {hostfile}: {e.strerror}") from None
    if opts.resume_from:
        manifest, step, _ = opts.resume_from
        console.say(f"--resume: the job goes on from {opts.resume}: its newest checkpoint is "
                    f"{manifest} (step {step})")
    for t in cluster.tasks:
        console.say(f"plan: {t.name} on {t.host}" + (f":{t.port}" if t.port else ""))
    if warning:
        console.say(warning, err=True)
    return SlurmLauncher(cluster, opts, console, signals, srun_argv, hostfile).run()
