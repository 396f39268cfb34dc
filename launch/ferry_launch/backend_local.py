"""The local and ssh backends: start, supervise and stop every process from here."""

import os
import queue
import shlex
import signal
import time

from .commands import remote_argv
from .common import EXIT_FAILED, EXIT_OK, STOP_MARGIN_S, StartFailed
from .supervise import (
    Child, Stream, Supervisor, cause_report, describe_status, reap_all, wait_for_servers)


class TaskProc:
    """One task started here or over ssh."""

    def __init__(self, task, child, stream):
        self.task, self.child, self.stream = task, child, stream
        self.stopping = False  # set when the launcher asked it to stop

    @property
    def done(self):
        return self.child.done.is_set()

    @property
    def pid(self):
        return self.child.pid

    def request_stop(self):
        if self.task.via_ssh:
            self.child.close_stdin()  # the remote wrapper sees EOF and stops the process
        else:
            self.child.signal_group(signal.SIGTERM)

    def describe(self):
        if self.task.via_ssh:
            return f"{self.task.name} on {self.task.host} (ssh pid {self.pid})"
        return f"{self.task.name} (pid {self.pid})"

    def describe_exit(self):
        return describe_status(self.child.returncode, self.task.via_ssh)


class Launcher(Supervisor):
    """Supervises a cluster started by the local and ssh backends."""

    def __init__(self, cluster, opts, console, signals):
        super().__init__(opts, console, signals)
        self.cluster = cluster
        self.ssh = shlex.split(opts.ssh)
        self.procs = []

    def start(self, task):
        with self.signals.held():  # never lose track of a pid between fork and bookkeeping
            stream = Stream(task.name, os.path.join(self.opts.log_dir,
                                                    f"{task.role}-{task.rank}.log"), self.console)
            if task.via_ssh:
                argv, env = remote_argv(self.ssh, task, self.opts.grace), None
            else:
                argv = task.argv
                env = dict(os.environ, **task.env) if task.env else None
            p = TaskProc(task, None, stream)
            try:
                p.child = Child(argv, self.events, stream.line, p, env=env,
                                keep_stdin=task.via_ssh)
            except OSError as e:
                raise StartFailed(f"cannot start {task.name}: {argv[0]}: {e.strerror}") from None
            self.procs.append(p)
            # Said before a pending signal is honoured: every started pid is in the output.
            if task.via_ssh:
                self.say(f"started {task.name} on {task.host} (ssh pid {p.pid}): "
                         f"{task.command_text()}")
            else:
                self.say(f"started {task.name} pid {p.pid}: {task.command_text()}")
        return p

    def stop_all(self, reason):
        """Asks every live process to stop (SIGTERM to a local process group, EOF to a remote
        wrapper), forces it after the grace period (+STOP_MARGIN_S over ssh); reaps them all."""
        self.signals.stopping = True
        live = [p for p in self.procs if not p.done]
        if live:
            self.say(f"stopping {', '.join(p.task.name for p in live)} ({reason})")
        t0 = time.monotonic()

        def limit(p):
            return self.opts.grace + (STOP_MARGIN_S if p.task.via_ssh else 0.0)

        for p in live:
            p.stopping = True
            p.request_stop()
        for p in live:
            p.child.done.wait(max(0.0, t0 + limit(p) - time.monotonic()))
        for p in live:
            if p.done:
                continue
            if p.task.via_ssh:
                self.say(f"{p.task.name} on {p.task.host}: ssh still running {limit(p):g} s "
                         "after its stdin was closed; killing the local ssh (check "
                         f"{p.task.host} for a leftover process)", err=True)
            else:
                self.say(f"{p.task.name} pid {p.pid} ignored SIGTERM for {self.opts.grace:g} s; "
                         "sending SIGKILL", err=True)
            p.child.signal_group(signal.SIGKILL)
        reap_all([(p.child, p.describe()) for p in self.procs], self.say)
        for p in self.procs:
            p.child.kill_group()  # any grandchild left in the group goes too
            p.child.close_stdin()
            p.child.join_output()

    def failure_summary(self, p, what):
        p.child.join_output()
        lines = [f"{p.describe()} {what}: {p.describe_exit()}"] + cause_report(p.stream)
        self.say("FAILED: " + "\n".join(lines), err=True)

    def rendezvous(self):
        """None (all servers up), "timeout", or the TaskProc that died meanwhile."""
        def pause(seconds):
            try:  # sleeps, but wakes at once if a process dies
                return self.events.get(timeout=seconds)[1]
            except queue.Empty:
                return None

        def say(msg):
            self.say(msg, err=msg.startswith("rendezvous timed out"))

        return wait_for_servers(self.cluster.ps, self.opts.rendezvous_timeout, say, pause)

    def _run(self):
        self.say(f"logs in {self.opts.log_dir}")
        for t in self.cluster.ps:
            self.start(t)
        failed = self.rendezvous()
        if failed == "timeout":
            self.stop_all("rendezvous timed out")
            return EXIT_FAILED
        if failed is not None:
            self.stop_all(f"{failed.task.name} died")
            self.failure_summary(failed, "exited during rendezvous")
            return EXIT_FAILED
        for t in self.cluster.workers:
            self.start(t)
        running = {p for p in self.procs if p.task.role == "worker"}
        while running:
            _, p = self.events.get()
            if p.task.role == "worker" and p.child.returncode == 0:
                running.discard(p)
                self.say(f"{p.task.name} finished (exit status 0)")
                continue
            what = "failed" if p.task.role == "worker" else "exited unexpectedly"
            self.stop_all(f"{p.task.name} {what}")
            self.failure_summary(p, what)
            return EXIT_FAILED
        self.stop_all("all workers finished")
        for p in self.procs:
            rc = p.child.returncode
            clean = (0, -signal.SIGTERM) + ((128 + signal.SIGTERM,) if p.task.via_ssh else ())
            if p.task.role == "ps" and rc not in clean:
                self.say(f"warning: {p.task.name} ended with {p.describe_exit()} on shutdown",
                         err=True)
        self.say(f"done: {len(self.cluster.workers)} workers finished, "
                 f"{len(self.cluster.ps)} servers stopped")
        return EXIT_OK
