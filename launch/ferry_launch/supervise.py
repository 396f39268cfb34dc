"""Running processes: children, their output, signals, reaping, the rendezvous with the servers."""

import collections
import contextlib
import ctypes
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from . import common
from .common import (
    EXIT_FAILED, HISTORY_LINES, PROBE_INTERVAL_S, PROBE_TIMEOUT_S, StartFailed, StopRequested,
    TAIL_LINES)


_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_launcher(sig):
    """Returns a preexec_fn: in the child, before exec, ask for signal sig when the launcher dies
    (even by SIGKILL). Linux delivers it when the thread that forked exits; children are started
    from the main thread, which lives as long as the launcher (preflight's short commands: from
    a thread that lives until they are reaped). If the launcher died before the prctl, no signal
    will come: the child then sees another parent and exits without running anything."""
    launcher = os.getpid()

    def preexec():
        if _prctl is not None:
            _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != launcher:
            os.write(2, b"ferry-launch: the launcher died before this process started\n")
            os._exit(1)
    return preexec


def _kill_group(pid, sig=signal.SIGKILL):
    """Signals process group pid (a child started in its own session); gone already is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def describe_status(rc, via_ssh=False):
    """Popen.returncode in words; over ssh, 128+N is the remote process killed by signal N."""
    def signame(n):
        try:
            return signal.Signals(n).name
        except ValueError:
            return f"signal {n}"
    if rc is None:
        return "still running"
    if rc < 0:
        return f"killed by {signame(-rc)}"
    if via_ssh and rc == 255:
        return "exit status 255 (ssh failed, or the process exited 255)"
    if via_ssh and 128 < rc < 128 + 65:
        return f"exit status {rc} (killed by {signame(rc - 128)} on the remote host)"
    return f"exit status {rc}"


class Console:
    """The launcher's stdout/stderr, shared by all threads: whole lines only."""

    def __init__(self):
        self.lock = threading.Lock()

    def line(self, text, err=False):
        with self.lock:
            stream = sys.stderr if err else sys.stdout
            stream.write(text + "\n")
            stream.flush()

    def say(self, msg, err=False):
        self.line(f"ferry-launch: {msg}", err)


# A line that states a failure: Ferry's programs print theirs as "ferry-ps: ..." (normal output
# names a rank: "ferry-ps rank 0 ..."; "ferry-launch: " lines in a task's log are the launcher's
# own notes), with a Status code; then C++, Python and libc crash text.
ERROR_LINE = re.compile(
    r"^ferry(?:-(?!launch:)[\w-]+)?: "
    r"|\b(?:CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS"
    r"|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE"
    r"|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|DATA_LOSS|UNAUTHENTICATED): "
    r"|(?i:\b(?:error|fatal|panic)\b\s*:|\w(?:Error|Exception):)"
    r"|terminate called|what\(\):|Assertion .* failed|Traceback \(most recent call last\)"
    r"|Segmentation fault|core dumped|(?i:out of memory)")
# The first line of a program's usage text; the lines after it that list flags (they hold "--"
# or are indented) belong to it.
USAGE_LINE = re.compile(r"^\s*usage:", re.IGNORECASE)


def cause_lines(lines, limit=TAIL_LINES):
    """What a failed process's output says about why it failed: (lines, usage_left_out).
    Usage text is left out (a program that rejects a flag prints its error, then its usage, so a
    plain tail shows only the usage); of the rest, the last `limit` error lines (ERROR_LINE), or
    the last `limit` lines when none looks like an error."""
    body, in_usage, usage_left_out = [], False, False
    for line in lines:
        if USAGE_LINE.match(line):
            in_usage = usage_left_out = True
            continue
        if in_usage and not ERROR_LINE.search(line) and ("--" in line or line[:1].isspace()):
            continue
        in_usage = False
        body.append(line)
    errors = [l for l in body if ERROR_LINE.search(l)]
    return (errors or body)[-limit:], usage_left_out


def cause_report(stream):
    """The summary's lines under "X failed: exit status N": the lines of stream that say why."""
    chosen, usage_left_out = cause_lines(list(stream.tail))
    note = " (usage text left out)" if usage_left_out else ""
    if not chosen:
        return [f"  {stream.log_path}: " + ("only its usage text" if usage_left_out else "(no output)")]
    return [f"  last lines of {stream.log_path} that say why{note}:"] + [f"    {l}" for l in chosen]


class Stream:
    """Where one task's output goes: the console as "[name] line", its log file, the last lines.
    Thread-safety: line() is called by one reader thread; tail is read after that thread ends."""

    def __init__(self, name, log_path, console, append=False):
        self.name, self.log_path, self.console = name, log_path, console
        self.tail = collections.deque(maxlen=HISTORY_LINES)
        # append: a restarted process goes on in its predecessor's log.
        self._log = open(log_path, "a" if append else "w", encoding="utf-8", errors="replace")
        self._prefix = f"[{name}] "

    def note(self, text):
        """A line of the launcher's own in the log only (e.g. where a restart begins)."""
        self._log.write(f"ferry-launch: {text}\n")
        self._log.flush()

    def line(self, text):
        self._log.write(text + "\n")
        self._log.flush()
        self.tail.append(text)
        self.console.line(text if text.startswith(self._prefix) else self._prefix + text)

    def close(self):
        self._log.close()


class Child:
    """A started process in its own session. A reader thread hands each line of its merged
    stdout/stderr to on_line; a waiter thread reaps it, then posts ("exit", tag) on events.
    With keep_stdin its stdin is a pipe that stays open until close_stdin()."""

    def __init__(self, argv, events, on_line, tag, env=None, keep_stdin=False,
                 death_signal=signal.SIGKILL):
        self.done = threading.Event()
        self.ended_at = None
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.PIPE if keep_stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            preexec_fn=_die_with_launcher(death_signal))
        self.pid = self.popen.pid
        self._on_line, self._events, self._tag = on_line, events, tag
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _read(self):
        for raw in self.popen.stdout:
            self._on_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def _wait(self):
        self.popen.wait()
        self.ended_at = time.monotonic()  # when the launcher noticed the end
        self.done.set()
        self._events.put(("exit", self._tag))

    @property
    def returncode(self):
        return self.popen.returncode

    def join_output(self, timeout=2.0):
        self._reader.join(timeout)

    def close_stdin(self):
        if self.popen.stdin and not self.popen.stdin.closed:
            try:
                self.popen.stdin.close()
            except OSError:
                pass

    def signal_group(self, sig):
        """Signals the process group while the process is alive."""
        if not self.done.is_set():
            self.kill_group(sig)

    def kill_group(self, sig=signal.SIGKILL):
        _kill_group(self.pid, sig)


def reap_all(children, say):
    """Waits, REAP_TIMEOUT_S in all, for every (Child, description) to be reaped (after SIGKILL
    that takes moments, unless a process hangs in the kernel); names each one that is not."""
    deadline = time.monotonic() + common.REAP_TIMEOUT_S
    for child, what in children:
        if not child.done.wait(max(0.0, deadline - time.monotonic())):
            say(f"{what} could not be reaped {common.REAP_TIMEOUT_S:g} s after SIGKILL (stuck in the "
                "kernel?); leaving it", err=True)


class StopSignals:
    """SIGINT/SIGTERM raise StopRequested in the main thread, from before preflight to the end:
    main() installs this first. Inside held() (between fork and bookkeeping) a signal waits until
    the section ends; once stopping is set (a stop is under way), further signals are ignored.
    Thread-safety: main thread only (Python runs signal handlers there)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.stopping = False
        self._held = False
        self._pending = None

    @contextlib.contextmanager
    def installed(self):
        old = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in old.items():
                if handler is not None:
                    signal.signal(sig, handler)

    def _on_signal(self, signum, _frame):
        if self.stopping:
            return  # already shutting down; finish that
        if self._held:
            self._pending = signum
            return
        self.stopping = True
        raise StopRequested(signum)

    @contextlib.contextmanager
    def held(self):
        self._held = True
        try:
            yield
        finally:
            self._held = False
            if self._pending is not None and not self.stopping:
                self.stopping = True
                raise StopRequested(self._pending)


class Supervisor:
    """What both supervisors share: the event queue, and run(), which turns StartFailed and
    StopRequested (signals, see StopSignals) into stopping everything."""

    def __init__(self, opts, console, signals):
        self.opts, self.console, self.signals = opts, console, signals
        self.events = queue.Queue()

    def say(self, msg, err=False):
        self.console.say(msg, err)

    def run(self):
        try:
            return self._run()
        except StartFailed as e:
            self.stop_all(str(e))
            self.say(f"FAILED: {e}", err=True)
            return EXIT_FAILED
        except StopRequested as s:
            self.stop_all(f"launcher got {s}")
            self.say(f"stopped by {s}; all processes stopped", err=True)
            return 128 + s.signum


def wait_for_servers(ps, timeout_s, say, pause, progress=True, left=frozenset()):
    """Blocks until every server in ps accepts a TCP connection from here, or the deadline.
    Every server has a prober thread of its own (a name lookup or connect that hangs delays no
    other server, and no report); each connect is bounded by PROBE_TIMEOUT_S and the time left.
    With progress, says who is missing every WAIT_REPORT_EVERY_S and when all are up.
    pause(seconds) waits between looks at the probers' results; a non-None result gives up and
    is returned. left: the ranks of servers that left the job (ferry-ps --exit-when-drained exits
    0 when it restores a map that gives it no slot), waited for no more; the set may grow while
    this waits. Returns None when all are up, "timeout" at the deadline (after saying who never
    came up)."""
    start = time.monotonic()
    deadline = start + timeout_s
    next_report = start + common.WAIT_REPORT_EVERY_S
    lock, up, finished = threading.Lock(), set(), threading.Event()

    def probe(t):
        while not finished.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            try:
                with socket.create_connection((t.host, t.port),
                                              timeout=min(PROBE_TIMEOUT_S, left)):
                    pass
            except OSError:
                finished.wait(PROBE_INTERVAL_S)
                continue
            with lock:
                up.add(t.rank)
            return

    for t in ps:  # daemons: one stuck in a name lookup is abandoned, never waited for
        threading.Thread(target=probe, args=(t,), daemon=True).start()
    try:
        while True:
            with lock:
                missing = [t for t in ps if t.rank not in up and t.rank not in left]
            if not missing:
                break
            now = time.monotonic()
            if now >= deadline:
                for t in missing:
                    say(f"rendezvous timed out after {timeout_s:g} s: {t.name} at {t.address} "
                        "never accepted connections")
                return "timeout"
            if progress and now >= next_report:
                for t in missing:
                    say(f"waiting for {t.name} at {t.address}, {now - start:.0f} s")
                next_report = now + common.WAIT_REPORT_EVERY_S
            stop = pause(min(PROBE_INTERVAL_S, deadline - now))
            if stop is not None:
                return stop
    finally:
        finished.set()
    if progress:
        n = len([t for t in ps if t.rank not in left])
        gone = f", {len(ps) - n} left the job" if n < len(ps) else ""
        say(f"rendezvous: all {n} servers up{gone} ({time.monotonic() - start:.1f} s)")
    return None
