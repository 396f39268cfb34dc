"""The local and ssh backends: start, supervise, restart and stop every process from here."""

import collections
import os
import queue
import re
import shlex
import signal
import time

from .commands import environ_for, remote_argv, resumed_with
from . import common
from .common import (
    EXIT_FAILED, EXIT_OK, FAILOVER_TIMEOUT_S, RECOVER_FAILED_EXIT, REPLACEMENT_MARGIN_S, REPLACEMENT_SETTLE_S, SETTLE_S,
    STOP_MARGIN_S, WATCH_EVERY_S, StartFailed)
from .recovery import JobWatch, Recovery, summary
from .supervise import (
    Child, Stream, Supervisor, cause_lines, cause_report, describe_status, reap_all, wait_for_servers)

# The trainer's exit status for bad flags (and Python argparse's, for a worker program): a restart
# would fail the same way.
USAGE_EXIT = 2


# Why two servers dead at once fall back to the checkpoint under --replication 2.
TWO_DEAD = ("with replication 2 a server's slots are on it and on the next server only, so two servers "
            "dead at once may have taken both copies of some")

# ferry-ps's line when it leaves the job (--exit-when-drained), just before it exits 0.
LEFT_LINE = re.compile(r"ferry-ps rank \d+: left the job \(it owns no slot\), stopping$")
# ferry-ps's line once it serves (stdout): a replacement (--recover) prints it after it took its
# state from its peers, while its endpoint, bound first, accepts TCP connections before that.
LISTENING_LINE = re.compile(r"ferry-ps rank \d+ of \d+ listening on ")


def failover_timeout_s(ps_args):
    """ferry-ps's --failover-timeout-s as the --ps-arg words give it (the last one, as ferry-ps
    takes it), else its default (FAILOVER_TIMEOUT_S). A value ferry-ps would refuse counts as
    the default: such a job never gets past its start."""
    value = FAILOVER_TIMEOUT_S
    for flag, word in zip(ps_args, ps_args[1:]):
        if flag == "--failover-timeout-s":
            try:
                value = int(word) if 1 <= int(word) <= 86400 else FAILOVER_TIMEOUT_S
            except ValueError:
                value = FAILOVER_TIMEOUT_S
    return value


def replacement_wait_s(opts):
    """How long a server's replacement may take to say it listens: it waits up to the failover
    timeout for each of its two peers, so max(--rendezvous-timeout, 2 x that + a margin)."""
    failover = failover_timeout_s(getattr(opts, "ps_args", []))
    return max(opts.rendezvous_timeout, 2 * failover + REPLACEMENT_MARGIN_S)


class TaskProc:
    """One task started here or over ssh: one run of it (a restart makes a new TaskProc)."""

    def __init__(self, task, child, stream, generation=0):
        self.task, self.child, self.stream = task, child, stream
        self.stopping = False  # set when the launcher asked it to stop
        self.generation = generation  # which start of the whole job (a server death: +1)
        self.last_step = None  # the highest step its output reported (JobWatch, under its lock)
        self.cleaned = False   # its process group was killed after it was reaped
        self.stopped_since = None  # when the launcher first found it stopped (state T), if it is
        self.killed_stopped = None  # seconds it had been stopped when the launcher killed it
        self.left_line = False  # a server said it left the job (ferry-ps --exit-when-drained)
        self.recover = False  # a server's replacement (ferry-ps --recover)
        self.listening_at = None  # when its "listening on" line was read (a server)

    @property
    def done(self):
        return self.child.done.is_set()

    @property
    def pid(self):
        return self.child.pid

    @property
    def killed_by_signal(self):
        rc = self.child.returncode
        return rc is not None and (rc < 0 or (self.task.via_ssh and 128 < rc < 128 + 65))

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
        how = describe_status(self.child.returncode, self.task.via_ssh)
        if self.killed_stopped is not None:
            how += f" from the launcher, after it had been stopped for {self.killed_stopped:.1f} s"
        return how


def process_state(pid):
    """The state letter of a local process (/proc/PID/stat: R, S, D, T, t, Z, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    end = stat.rfind(b")")  # the command name may hold spaces and parentheses
    fields = stat[end + 2:].split(b" ", 1) if end >= 0 else []
    return fields[0].decode("ascii", "replace") if fields else None


class Launcher(Supervisor):
    """Supervises a cluster started by the local and ssh backends, and restarts what dies
    (--max-restarts): a worker alone, with --resume (a worker program: FERRY_RESUME=1); after a
    server's death every process, the servers with --restore (the newest checkpoint) and the
    workers with --resume; with --replication 2 that server alone, with --recover, at its
    endpoint, while the workers wait for it (two servers dead at once: every process again).

    Every process is started from the main thread (a child's PR_SET_PDEATHSIG fires when the
    thread that forked it exits; the main thread lives as long as the launcher)."""

    def __init__(self, cluster, opts, console, signals):
        super().__init__(opts, console, signals)
        self.cluster = cluster
        self.ssh = shlex.split(opts.ssh)
        self.procs = []      # every TaskProc started, restarts included
        self.current = {}    # task name -> the TaskProc that runs it now
        self.backlog = collections.deque()  # events taken off the queue early: handled first
        self.watch = JobWatch(self.events)
        self.generation = 0  # +1 at every restart of the whole job
        self.recoveries = []  # Recovery, in order
        self.pending = []     # the recoveries still waiting for "resuming" lines
        self.unfinished = set()  # names of the workers that have not exited 0
        self.starts = collections.Counter()  # by task name: how often it was started

    # ---- starting and stopping ----

    def start(self, task, restart=None, recover=False):
        """Starts task; restart ("restart N") runs its resume_argv (with recover: a server's
        recover_argv) and continues its log. A worker's restart carries its start number
        (Task.command's incarnation)."""
        incarnation = self.starts[task.name]
        self.starts[task.name] += 1
        argv, changes = task.command(resumed=bool(restart), incarnation=incarnation, recover=recover)
        text = task.command_text(argv, changes)
        with self.signals.held():  # never lose track of a pid between fork and bookkeeping
            stream = Stream(task.name, os.path.join(self.opts.log_dir,
                                                    f"{task.role}-{task.rank}.log"),
                            self.console, append=bool(restart))
            if restart:
                stream.note(f"{restart}: {task.name} starts again: {text}")
            if task.via_ssh:
                run, env = remote_argv(self.ssh, task, self.opts.grace, argv, changes), None
            else:
                run = argv
                env = environ_for(os.environ, changes) if changes else None
            p = TaskProc(task, None, stream, self.generation)
            p.recover = recover

            def on_line(text):  # the child's reader thread
                # Seen before shown: whatever a line on the console says (a step reached), the
                # launcher already knows when it handles a death that follows.
                self.watch.see(p, text)
                if task.role == "ps" and LEFT_LINE.match(text):
                    p.left_line = True
                stream.line(text)
                # (Shown first: the replacement's line comes before the launcher's line saying it is up.)
                if task.role == "ps" and p.listening_at is None and LISTENING_LINE.match(text):
                    p.listening_at = time.monotonic()
                    if p.recover:  # wakes wait_for_replacement (the main loop passes it by)
                        self.events.put(("listening", p))

            try:
                p.child = Child(run, self.events, on_line, p, env=env, keep_stdin=task.via_ssh)
            except OSError as e:
                raise StartFailed(f"cannot start {task.name}: {run[0]}: {e.strerror}") from None
            self.procs.append(p)
            self.current[task.name] = p
            # Said before a pending signal is honoured: every started pid is in the output.
            verb = "restarted" if restart else "started"
            if task.via_ssh:
                self.say(f"{verb} {task.name} on {task.host} (ssh pid {p.pid}): {text}")
            else:
                self.say(f"{verb} {task.name} pid {p.pid}: {text}")
        return p

    def stop_all(self, reason):
        """Stops every process for good (see stop())."""
        self.signals.stopping = True
        self.stop(self.procs, reason)

    def stop(self, procs, reason):
        """Asks every live process of procs to stop (SIGTERM to a local process group, EOF to a
        remote wrapper), forces it after the grace period (+STOP_MARGIN_S over ssh); reaps them
        all."""
        live = [p for p in procs if not p.done]
        for p in procs:
            p.stopping = True  # its exit is no death to recover from
        if live:
            self.say(f"stopping {', '.join(p.task.name for p in live)} ({reason})")
        t0 = time.monotonic()

        def limit(p):
            return self.opts.grace + (STOP_MARGIN_S if p.task.via_ssh else 0.0)

        for p in live:
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
        reap_all([(p.child, p.describe()) for p in procs if not p.cleaned], self.say)
        for p in procs:
            if not p.cleaned:
                p.child.kill_group()  # any grandchild left in the group goes too
                p.child.close_stdin()
                p.child.join_output()
                p.cleaned = p.done

    def failure_summary(self, p, what):
        p.child.join_output()
        lines = [f"{p.describe()} {what}: {p.describe_exit()}"] + cause_report(p.stream)
        self.say("FAILED: " + "\n".join(lines), err=True)

    # ---- events ----

    def next_event(self, timeout=None):
        """The next event: ("exit", TaskProc), ("resumed", TaskProc, step, time seen, own) or
        ("listening", TaskProc: a server's replacement said it listens). Raises queue.Empty after
        timeout seconds."""
        if self.backlog:
            return self.backlog.popleft()
        return self.events.get(timeout=timeout)

    def is_current(self, p):
        """p runs its task now and the launcher did not ask it to stop: its exit matters."""
        return self.current.get(p.task.name) is p and not p.stopping

    def rendezvous(self):
        """None (all servers up), "timeout", or the TaskProc of a server that died meanwhile."""
        def pause(seconds):  # sleeps, but wakes at once if a server dies
            deadline = time.monotonic() + seconds
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    ev = self.events.get(timeout=left)
                except queue.Empty:
                    return None
                if ev[0] != "exit":
                    self.backlog.append(ev)
                elif self.is_current(ev[1]) and self.has_left(ev[1]):
                    self.say(f"{ev[1].task.name} left the job at its start (exit status 0: the "
                             "checkpoint's map gives it no slot)")
                    gone.add(ev[1].task.rank)
                elif self.is_current(ev[1]):
                    return ev[1]
                # else: a process of before a restart, or one the launcher stopped

        def say(msg):
            self.say(msg, err=msg.startswith("rendezvous timed out"))

        gone = set()  # the ranks of servers that left
        return wait_for_servers(self.cluster.ps, self.opts.rendezvous_timeout, say, pause, left=gone)

    @staticmethod
    def has_left(p):
        """p is a server that left the job: it exited 0 after its line saying so (ferry-ps
        --exit-when-drained, once it owns no slot and no worker needs it), not asked to by the
        launcher. (A ferry-ps stopped by anyone else's SIGTERM exits 0 too: a death.)"""
        if p.task.role != "ps" or p.child.returncode != 0 or p.stopping:
            return False
        p.child.join_output()  # (its last lines may come after its exit)
        return p.left_line

    def dead_servers(self, but=None):
        """The current servers found dead (not stopped by the launcher, not left the job), but
        `but`."""
        return [q for q in self.current.values() if q.task.role == "ps" and q is not but and q.done
                and not q.stopping and not self.has_left(q)]

    def dead_server(self, wait, but=None):
        """A running server (but `but`) found dead, waiting up to `wait` seconds for one (events
        that come meanwhile are kept for later); None when there is none."""
        deadline = time.monotonic() + wait
        while True:
            dead = self.dead_servers(but=but)
            if dead:
                return dead[0]
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                self.backlog.append(self.events.get(timeout=left))
            except queue.Empty:
                return None

    def on_resumed(self, p, step, when, own=False):
        if self.current.get(p.task.name) is not p:
            return
        for r in list(self.pending):
            if r.resumed(p.task.name, step, when, own):
                self.pending.remove(r)
                self.say(r.report(self.opts.max_restarts))

    def supersede(self, which, why, new):
        """Recoveries still pending that a new death makes moot: reported as not complete; the
        new recovery (restarting the same workers) counts their steps lost (Recovery.inherit).
        A worker that died again while a recovery of several still awaits the others leaves it
        pending for them, and only its own steps go to the new one."""
        for r in [r for r in self.pending if which(r)]:
            if new.kind == "worker" and len(r.waiting) > 1:
                name = next(iter(new.waiting))
                new.inherit(r, only=name)
                r.waiting.discard(name)
                r.before.pop(name, None)
                continue
            self.pending.remove(r)
            new.inherit(r)
            self.say(r.unfinished(why, counted_later=True), err=True)

    def kill_stopped(self):
        """Kills every current process of this machine that has been stopped (state T: SIGSTOP,
        a job-control stop; not a debugger's stop, t) for --kill-stopped-after seconds: the
        servers would soon give up on it and fail the others, who would then be restarted in
        its place. Its death then restarts it like any other."""
        if not self.opts.kill_stopped_after:
            return
        now = time.monotonic()
        for p in list(self.current.values()):
            if p.done or p.stopping or p.task.via_ssh:
                continue
            if process_state(p.pid) != "T":
                p.stopped_since = None
                continue
            if p.stopped_since is None:
                p.stopped_since = now
                continue
            stopped = now - p.stopped_since
            if stopped < self.opts.kill_stopped_after or p.killed_stopped is not None:
                continue
            p.killed_stopped = stopped
            self.say(f"{p.describe()} has been stopped (state T) for {stopped:.1f} s; killing it "
                     "with SIGKILL, so that it restarts like a process that died and the others "
                     "keep their place", err=True)
            p.child.kill_group(signal.SIGKILL)

    # ---- deaths ----

    def on_death(self, p):
        """A current process died (a worker: non-zero status or a signal; a server: any end).
        Restarts what is needed; returns None to go on, else the launcher's exit status. A dead
        server: with --replication 2 it alone is replaced (replace_server), else every process
        restarts from the checkpoint (restart_all)."""
        what = "failed" if p.task.role == "worker" else "exited unexpectedly"
        if not self.opts.max_restarts:  # no restarts: stop everything
            self.stop_all(f"{p.task.name} {what}")
            self.failure_summary(p, what)
            return EXIT_FAILED
        if p.task.role == "worker":
            if p.child.returncode == USAGE_EXIT:
                whose = ("a usage error (ferry-trainer and Python's argparse exit 2 for bad "
                         "arguments)" if self.opts.worker_command else
                         "the trainer's refusal of its settings (a bad flag, --table, a table "
                         "the servers refuse), the servers' refusal of its gradient (NaN or "
                         "Inf: the model diverged, and a restart would compute it again), or its "
                         "stop after --max-checkpoint-failures checkpoints in a row failed")
                return self.give_up(p, what, f"{p.task.name} is not restarted: exit status "
                                             f"{USAGE_EXIT} is {whose}; a restart would fail "
                                             "the same way")
            # A worker whose server died exits with an error of its own, at about the time the
            # server's death is noticed: look for that first (not after a signal: a signal
            # killed the worker, whatever its servers do).
            server = self.dead_server(0.0 if p.killed_by_signal else SETTLE_S)
            if server is None:
                return self.restart_worker(p)
            self.say(f"{p.describe()} {what} ({p.describe_exit()}) as {server.task.name} died")
            if not self.replicated():
                return self.restart_all(server)
            # The server is replaced first, then this worker restarts alone (unless a fall back to
            # the checkpoint restarted every process already).
            rc = self.replace_server(server)
            return rc if rc is not None or not self.is_current(p) else self.restart_worker(p)
        if self.replicated():
            return self.replace_server(p)
        return self.restart_all(p)

    def give_up(self, p, what, why):
        self.stop_all(f"{p.task.name} {what}")
        self.failure_summary(p, what)
        self.say(why, err=True)
        return EXIT_FAILED

    def restarts_left(self):
        return len(self.recoveries) < self.opts.max_restarts

    def restart_worker(self, p):
        if not self.restarts_left():
            return self.no_restarts_left(p, "failed")
        noticed = p.child.ended_at or time.monotonic()
        how = p.describe_exit()
        p.child.join_output()
        n = len(self.recoveries) + 1
        resumed = resumed_with(self.opts)
        r = Recovery(n, "worker", p.describe(), how, f"{p.task.name} with {resumed}", noticed,
                     self.watch.last_steps([p]), [p.task.name])
        self.supersede(lambda old: p.task.name in old.waiting, f"{p.task.name} died again", r)
        self.say(f"{p.describe()} died ({how}); restarting it with {resumed}: it rejoins the job "
                 f"at the servers' step (restart {n} of at most {self.opts.max_restarts})")
        self.recoveries.append(r)  # first: a signal during the start still reports it
        self.pending.append(r)
        new = self.start(p.task, restart=f"restart {n}")
        r.restarted += f" (pid {new.pid})"
        return None

    def no_restarts_left(self, p, what):
        return self.give_up(p, what, f"{p.task.name} is not restarted: --max-restarts "
                            f"{self.opts.max_restarts} allows no more restarts")

    def replicated(self):
        return getattr(self.opts, "replication", 1) == 2

    def replace_server(self, p):
        """Server p of a --replication 2 job died: p alone restarts, with --recover, at its own
        endpoint (Task.recover_argv: the same --bind, so the workers and the other servers find
        it where they connect; with --base-port 0, the port picked at the start). The replacement
        binds that endpoint, takes its slots from its backup (server rank+1) and its replica from
        its primary (rank-1), and then says it listens ("ferry-ps rank R of N listening on ..."):
        it is up at that line, not when its port first accepts TCP (wait_for_replacement). The
        workers keep running, wait for it and send again what the dead one had not answered. No
        checkpoint is needed and no step is lost; one restart is counted, complete at that line
        (Recovery kind "replaced").

        When the replicas cannot bring p's state back, every process restarts from the newest
        checkpoint instead (fall_back: restart_all, which stops the job where there is none): two
        servers dead at once (another found dead now, one dying before the replacement is up, or
        one found dead within REPLACEMENT_SETTLE_S of the replacement's end: its death may be why the
        replacement ended; counted once, by the fall back) may have taken both copies of some
        slots; the replacement exits 3 (ferry-ps could not take its state from its peers) or 2
        (it refused its flags: a ferry-ps without --recover?); it is not up within
        replacement_wait_s() (replacement_not_up). A replacement that ends otherwise before it is
        up is replaced again (counted again)."""
        what = "exited unexpectedly"
        others = self.dead_servers(but=p)
        if others:
            q = others[0]
            return self.fall_back(p, f"{p.task.name} and {q.task.name} are both dead ({p.describe()}: "
                                     f"{p.describe_exit()}; {q.describe()}: {q.describe_exit()}); "
                                     f"{TWO_DEAD}")
        if not self.restarts_left():
            return self.no_restarts_left(p, what)
        noticed = p.child.ended_at or time.monotonic()
        how = p.describe_exit()
        p.child.join_output()
        t, servers = p.task, len(self.cluster.ps)
        backup, primary = (t.rank + 1) % servers, (t.rank - 1) % servers
        sources = f"server {backup}" if backup == primary else f"servers {backup} and {primary}"
        n = len(self.recoveries) + 1
        workers = [q for q in self.current.values() if q.task.role == "worker"]
        r = Recovery(n, "replaced", p.describe(), how, f"{t.name} alone with --recover", noticed,
                     self.watch.last_steps(workers), [])
        self.say(f"{p.describe()} died ({how}); replication 2: restarting it alone with --recover "
                 f"(it takes its state from {sources}); the workers wait for it (restart {n} of at "
                 f"most {self.opts.max_restarts})")
        self.recoveries.append(r)  # first: a signal during the start still reports it
        self.pending.append(r)
        new = self.start(t, restart=f"restart {n}", recover=True)
        r.restarted += f" (pid {new.pid})"
        limit = replacement_wait_s(self.opts)
        failed = self.wait_for_replacement(new, sources, limit)
        self.pending.remove(r)
        if failed is None:
            r.up(new.listening_at)
            self.say(r.report(self.opts.max_restarts))
            return None
        if failed == "timeout":
            return self.replacement_not_up(p, new, r, limit)
        if failed is not new:
            self.say(r.unfinished(f"{failed.task.name} died first"), err=True)
            return self.fall_back(failed, f"{failed.describe()} died ({failed.describe_exit()}) "
                                          f"before {t.name}'s replacement was up; {TWO_DEAD}")
        self.say(r.unfinished(f"the replacement ended first: {new.describe_exit()}"), err=True)
        status = new.child.returncode
        if status == USAGE_EXIT:
            return self.fall_back(new, f"{new.describe()}, the replacement of {t.name}, exited with "
                                       f"status {USAGE_EXIT}: ferry-ps refused its flags (one without "
                                       "--recover?), and a restart would fail the same way")
        # A replacement that lost a peer ends at about the time that peer's death is noticed:
        # look for it first (not after a signal: a signal killed the replacement, whatever its
        # peers do), so that the peer's death is not counted twice (a replacement again, then the
        # fall back once the peer is found dead).
        q = self.dead_server(0.0 if new.killed_by_signal else REPLACEMENT_SETTLE_S, but=new)
        if q is not None:
            return self.fall_back(new, f"{t.name}'s replacement and {q.task.name} are both dead "
                                       f"({new.describe()}: {new.describe_exit()}; {q.describe()}: "
                                       f"{q.describe_exit()}); {TWO_DEAD}")
        if status == RECOVER_FAILED_EXIT:
            return self.fall_back(new, f"{new.describe()}, the replacement of {t.name}, exited with "
                                       f"status {RECOVER_FAILED_EXIT}: ferry-ps could not take "
                                       f"{t.name}'s state from {sources} ({self.last_cause(new)})")
        return self.replace_server(new)

    @staticmethod
    def last_cause(p):
        """What ended process p, in a few words: the last line of its output that says why."""
        p.child.join_output()
        chosen, _ = cause_lines(list(p.stream.tail), limit=1)
        return f"it says: {chosen[-1].strip()}" if chosen else "it printed no reason"

    def wait_for_replacement(self, new, sources, limit):
        """Waits for a server's replacement `new` to say it listens (its "listening on" line,
        read after its start; its endpoint accepts TCP before that, while it takes its state
        from sources): None once it did, "timeout" after `limit` seconds, or the TaskProc of a
        server found dead meanwhile (new itself, or another). Says every
        REPLACEMENT_REPORT_EVERY_S what it waits for. The events that come meanwhile are kept for
        later: the workers go on (they may finish, or die)."""
        start = time.monotonic()
        deadline = start + limit
        every = common.REPLACEMENT_REPORT_EVERY_S
        next_report = start + every
        while True:
            if new.listening_at is not None:
                return None
            if new.done:
                return new
            dead = self.dead_servers(but=new)
            if dead:
                return dead[0]
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if now >= next_report:
                self.say(f"waiting for {new.describe()}, the replacement of {new.task.name}, to take its "
                         f"state from {sources} and say it listens, {now - start:.0f} s (at most "
                         f"{limit:g} s)")
                next_report += every
            try:
                ev = self.events.get(timeout=max(0.0, min(deadline, next_report) - now))
            except queue.Empty:
                continue
            if ev[0] != "listening":
                self.backlog.append(ev)

    def replacement_not_up(self, p, new, r, limit):
        """Server p's replacement `new` (recovery r) did not say it listens within `limit`
        seconds: it is stopped and every process restarts from the newest checkpoint, or, without
        a checkpoint or a restart left, the job stops."""
        t = new.task
        self.say(r.unfinished(f"not up within {limit:g} s"), err=True)
        waited = (f"{new.describe()}, the replacement of {p.describe()}, did not say it listens "
                  f"('ferry-ps rank {t.rank} of {len(self.cluster.ps)} listening on ...') within "
                  f"{limit:g} s")
        if self.watch.checkpoint_step() is not None and self.restarts_left():
            self.stop([new], f"{t.name}'s replacement is not up after {limit:g} s")
            return self.fall_back(new, waited, how=f"not up within {limit:g} s: stopped by the launcher")
        self.stop_all(f"{t.name}'s replacement did not come up")
        why = ("there is no checkpoint to restart every process from" if self.watch.checkpoint_step() is None
               else f"--max-restarts {self.opts.max_restarts} allows no more restarts")
        new.child.join_output()
        self.say("\n".join([f"FAILED: {waited}; {why}"] + cause_report(new.stream)), err=True)
        return EXIT_FAILED

    def fall_back(self, p, why, how=None):
        """Replicas cannot bring server p's state back (why): every process restarts from the
        newest checkpoint (restart_all; how: how p ended, if not its exit status), or the job
        stops where there is none (or no restart is left)."""
        if self.watch.checkpoint_step() is None:
            then = "only a checkpoint could bring its state back now"
        elif not self.restarts_left():
            then = "only a restart of every process from the newest checkpoint could go on"
        else:
            then = "every process restarts from the newest checkpoint instead"
        self.say(f"{why}: {then}", err=True)
        return self.restart_all(p, how)

    def restart_all(self, p, how=None):
        """Server p died (how: how it ended, if not its exit status): every process restarts,
        from the newest checkpoint."""
        what = "exited unexpectedly"
        checkpoint = self.watch.checkpoint_step()
        if checkpoint is None:
            if not self.opts.checkpoint_dir:
                why = "there is no checkpoint folder (--checkpoint-dir DIR)"
            else:
                why = "this job has saved no checkpoint yet" + (
                    "" if self.opts.checkpoint_every else
                    " (--checkpoint-every N asks for one every N steps)")
            return self.give_up(p, what, f"cannot recover from the death of {p.task.name}: a "
                                f"server's state comes back only from a checkpoint, and {why}")
        if not self.restarts_left():
            return self.no_restarts_left(p, what)
        noticed = p.child.ended_at or time.monotonic()
        how = how or p.describe_exit()
        workers = [q for q in self.procs if q.task.role == "worker" and q.generation == self.generation]
        before = dict.fromkeys((t.name for t in self.cluster.workers), None)
        before.update(self.watch.last_steps(workers))
        n = len(self.recoveries) + 1
        resumed = resumed_with(self.opts)
        restarted = (f"{', '.join(t.name for t in self.cluster.ps)} with --restore and "
                     f"{', '.join(t.name for t in self.cluster.workers)} with {resumed}")
        r = Recovery(n, "server", p.describe(), how, restarted, noticed, before,
                     [t.name for t in self.cluster.workers])
        self.supersede(lambda old: True, f"{p.task.name} died", r)
        self.say(f"{p.describe()} died ({how}); restarting every process from the newest "
                 f"checkpoint (step {checkpoint} or later): servers with --restore, workers "
                 f"with {resumed} (restart {n} of at most {self.opts.max_restarts})")
        self.recoveries.append(r)  # first: a signal during the restart still reports it
        self.pending.append(r)
        self.stop(list(self.current.values()), f"{p.task.name} died; all restart from the "
                                                "checkpoint")
        self.generation += 1
        label = f"restart {n}"
        for t in self.cluster.ps:
            self.start(t, restart=label)
        failed = self.rendezvous()
        if failed is not None:
            self.stop_all("the restart from the checkpoint failed")
            if failed == "timeout":
                self.say("FAILED: the servers restarted from the checkpoint did not all come up "
                         f"within {self.opts.rendezvous_timeout:g} s", err=True)
            else:
                self.failure_summary(failed, "exited while restarting from the checkpoint")
            return EXIT_FAILED
        for t in self.cluster.workers:
            self.start(t, restart=label)
        self.unfinished = {t.name for t in self.cluster.workers}
        return None

    # ---- the run ----

    def run(self):
        rc = super().run()
        for r in self.pending:
            self.say(r.unfinished("the job stopped first"), err=True)
        self.pending = []
        if self.recoveries:
            self.say(summary(self.recoveries, self.opts.max_restarts), err=rc != EXIT_OK)
        return rc

    def _run(self):
        self.say(f"logs in {self.opts.log_dir}")
        if self.opts.resume_from:
            manifest, step, skipped = self.opts.resume_from
            for why in skipped:
                self.say(f"--resume: passed over: {why}")
            self.say(f"--resume: the job goes on from {self.opts.resume}: its newest "
                     f"checkpoint is {manifest} (step {step}; the servers verify it, and take "
                     "the next newest if it is damaged)")
            with self.watch.lock:
                self.watch.checkpoint = step
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
        self.unfinished = {t.name for t in self.cluster.workers}
        while self.unfinished:
            self.kill_stopped()  # a look at each process's state, between events or every WATCH_EVERY_S
            try:
                ev = self.next_event(timeout=WATCH_EVERY_S)
            except queue.Empty:
                continue
            if ev[0] == "resumed":
                self.on_resumed(*ev[1:])
                continue
            if ev[0] == "listening":  # a replacement's line, after wait_for_replacement ended
                continue
            p = ev[1]
            if not self.is_current(p):
                continue  # a process of before a restart, or one the launcher stopped
            if p.task.role == "worker" and p.child.returncode == 0:
                self.unfinished.discard(p.task.name)
                self.say(f"{p.task.name} finished (exit status 0)")
                continue
            if self.has_left(p):
                self.say(f"{p.task.name} left the job (exit status 0: it owns no slot, and every "
                         "worker holds the map that says so)")
                continue
            rc = self.on_death(p)
            if rc is not None:
                return rc
        # A restarted worker's "resuming" line may come after its exit: read what is left.
        for p in self.current.values():
            if p.task.role == "worker":  # all ended: their output ends too
                p.child.join_output()
        while True:
            try:
                ev = self.next_event(timeout=0)
            except queue.Empty:
                break
            if ev[0] == "resumed":
                self.on_resumed(*ev[1:])
        self.stop_all("all workers finished")
        for p in self.current.values():
            rc = p.child.returncode
            clean = (0, -signal.SIGTERM) + ((128 + signal.SIGTERM,) if p.task.via_ssh else ())
            if p.task.role == "ps" and rc not in clean:
                self.say(f"warning: {p.task.name} ended with {p.describe_exit()} on shutdown",
                         err=True)
        self.say(f"done: {len(self.cluster.workers)} workers finished, "
                 f"{len(self.cluster.ps)} servers stopped")
        return EXIT_OK
