"""Preflight: binaries, free ports, ssh hosts, the checkpoint folder and the log directory,
checked before anything starts."""

import collections
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading

from . import common
from .checkpoints import find_checkpoint, prepare_new_folder
from .commands import launcher_cwd
from .common import LaunchError
from .curve import check_key_folder, files_for
from .hosts import bind_address
from .supervise import _die_with_launcher, _kill_group

# A Python interpreter's file name: python, python3, python3.11.
PYTHON_NAME = re.compile(r"python(3(\.\d+)?)?")


def check_binaries_here(paths):
    for b in paths:
        if not os.path.isfile(b):
            why = (" (--curve runs it to make the job's keys; or make them yourself and pass "
                   "--curve-keys DIR)" if os.path.basename(b) == "ferry-keys" else "")
            raise LaunchError(f"preflight: binary not found: {b} (build first, or pass "
                              f"--bin-dir){why}")
        if not os.access(b, os.X_OK):
            raise LaunchError(f"preflight: binary not executable: {b}")


def check_program_here(program):
    """A worker program (the first word after "--") resolves here as it will when started: a
    path (with a '/') to an executable file, or a name found on PATH."""
    if shutil.which(program):
        return
    where = ("no executable file there" if "/" in program else
             "no such command on PATH; or give its path, e.g. /usr/bin/python3")
    raise LaunchError(f"preflight: worker program not found: {program} ({where}); every worker "
                      "runs the command line after '--' when its first word is not a flag")


def program_warning(opts):
    """One line when the worker program is a Python interpreter other than Debian's /usr/bin
    (/usr/bin/python3 sees the python3-torch and python3-numpy packages; another, e.g. pyenv's
    or a virtual environment's, may not); else None. Judged by where it resolves here."""
    if not opts.worker_command:
        return None
    program = opts.worker_command[0]
    path = shutil.which(program) or program
    if not PYTHON_NAME.fullmatch(os.path.basename(path)):
        return None
    folder = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    if folder == "/usr/bin":
        return None
    return (f"warning: the worker program {program} is {os.path.abspath(path)}, not "
            "/usr/bin/python3: Debian's python3-torch and python3-numpy are seen by "
            "/usr/bin/python3 only (give it after '--' if `import torch` or `import numpy` "
            "fails)")


def check_port_here(t):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR like ZeroMQ: a port in TIME_WAIT is usable, a listening one is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_address(t.host), t.port))
        except OSError as e:
            raise LaunchError(f"preflight: port for {t.name} at {t.address} is not free "
                              f"({e.strerror})") from None


def check_port_there(t):
    """A port on another host is in use when something there accepts a connection already."""
    try:
        with socket.create_connection((t.host, t.port), timeout=1.0):
            pass
    except OSError:
        return  # refused, unreachable or filtered: nothing we could join by mistake
    raise LaunchError(f"preflight: port for {t.name} at {t.address} is in use (something "
                      "already accepts connections there)")


class ShortCommands:
    """Short commands run by preflight's checker threads (ssh HOST true, ...), each in its own
    session and killed with the launcher. kill_all() (main thread, on the way out of preflight,
    e.g. on SIGTERM) kills those still running and refuses new ones. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._running = set()  # guarded by _lock
        self._closed = False   # guarded by _lock

    def run(self, argv, timeout):
        """(exit status, or None on timeout or after kill_all; stdout; stderr)."""
        with self._lock:  # kill_all() waits for a fork under way, so no pid is missed
            if self._closed:
                return None, "", "stopped"
            try:
                p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True,
                                     preexec_fn=_die_with_launcher(signal.SIGKILL))
            except OSError as e:
                return 127, "", f"cannot run {argv[0]}: {e.strerror}"
            self._running.add(p)
        try:
            out, err = p.communicate(timeout=timeout)
            return p.returncode, out, err
        except subprocess.TimeoutExpired:
            _kill_group(p.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):  # a grandchild may hold a pipe
                p.communicate(timeout=common.REAP_TIMEOUT_S)
            return None, "", f"no answer within {timeout:g} s"
        finally:
            with self._lock:
                self._running.discard(p)

    def kill_all(self):
        with self._lock:
            self._closed = True
            for p in self._running:
                _kill_group(p.pid)


def _check_ssh_keys(ssh, host, tasks, folder, generated, timeout, commands):
    """CURVE: the key files the tasks on host read are there, readable, at folder's path.
    Returns an error text or None."""
    fields = ", ".join(t.where for t in tasks)
    paths = [os.path.join(folder, f) for f in files_for(tasks)]
    rc, out, err = commands.run(ssh + [host, shlex.join(
        ["sh", "-c", 'for f; do [ -f "$f" ] && [ -r "$f" ] || echo "$f"; done',
         "ferry-launch-check"] + paths)], timeout)
    missing = out.splitlines()
    if rc == 0 and not missing:
        return None
    what = ", ".join(missing) if missing else f"check failed: {err.strip() or rc}"
    how = ("--curve writes the job's keys to the log dir on this machine: with processes on "
           "other hosts give a --log-dir they see at the same path, or copy each host the files "
           "it needs and pass --curve-keys DIR" if generated else
           "copy them there, to the same path: a server needs server.key and workers.pub, "
           "worker R server.pub and worker-R.key")
    return (f"preflight: on host '{host}' ({fields}): CURVE key files missing or unreadable: "
            f"{what} ({how}; see launch/README.md)")


def ferry_binaries(tasks, binaries, via_ssh, program):
    """The Ferry binaries tasks run (here, or on ssh hosts): ferry-ps, and ferry-trainer unless
    the workers run a program (the first word after "--", or None)."""
    return sorted({binaries.path("ferry-ps" if t.role == "ps" else "ferry-trainer", via_ssh)
                   for t in tasks if t.role == "ps" or not program})


def _check_ssh_program(ssh, host, tasks, program, timeout, commands):
    """A worker program resolves on host as there its wrapper will start it (in the launcher's
    working directory if that exists there). Returns an error text or None."""
    rc, out, err = commands.run(ssh + [host, shlex.join(
        ["sh", "-c", 'cd "$1" 2>/dev/null || cd; case $2 in */*) [ -f "$2" ] && [ -x "$2" ] ;; '
         '*) command -v "$2" >/dev/null 2>&1 ;; esac || echo missing',
         "ferry-launch-check", launcher_cwd(), program])], timeout)
    if rc == 0 and not out.strip():
        return None
    fields = ", ".join(t.where for t in tasks if t.role == "worker")
    what = ("not found" if out.strip() else f"check failed: {err.strip() or rc}")
    return (f"preflight: on host '{host}' ({fields}): worker program {program}: {what} (a path "
            "to an executable file, or a name on the PATH of a shell there)")


def _check_ssh_host(ssh, host, tasks, binaries, timeout, commands, keys=None, program=None):
    """Reachable, binaries there (with program, the worker program instead of ferry-trainer),
    ps ports not in use, and with keys (--curve-keys DIR) the key files its tasks read. Returns
    an error text or None."""
    fields = ", ".join(t.where for t in tasks)
    rc, _, err = commands.run(ssh + [host, "true"], timeout)
    if rc != 0:
        detail = " | ".join(l.strip() for l in err.strip().splitlines()[-3:]) or "no output"
        status = "timed out" if rc is None else f"exit status {rc}"
        return (f"preflight: host '{host}' ({fields}) unreachable: `{shlex.join(ssh + [host])} "
                f"true` {status}: {detail}")
    needed = ferry_binaries(tasks, binaries, True, program)
    rc, out, err = (commands.run(ssh + [host, shlex.join(
        ["sh", "-c", 'for b; do [ -x "$b" ] || echo "$b"; done', "ferry-launch-check"] + needed)],
        timeout) if needed else (0, "", ""))
    missing = out.split()
    if rc != 0 or missing:
        what = ", ".join(missing) if missing else f"check failed: {err.strip() or rc}"
        return (f"preflight: on host '{host}' ({fields}): binary not found or not executable: "
                f"{what} (--remote-bin-dir sets the directory on other hosts)")
    if program and any(t.role == "worker" for t in tasks):
        why = _check_ssh_program(ssh, host, tasks, program, timeout, commands)
        if why:
            return why
    for t in tasks:
        if t.role == "ps":
            try:
                check_port_there(t)
            except LaunchError as e:
                return str(e)
    if keys:
        return _check_ssh_keys(ssh, host, tasks, keys, False, timeout, commands)
    return None


def _on_ssh_hosts(cluster, check):
    """Runs check(host, tasks on it, ShortCommands) -> error text or None for every ssh host,
    each from a thread of its own; raises LaunchError with every error. However it ends
    (StopRequested included), no command it started is left running."""
    by_host = collections.OrderedDict()
    for t in cluster.tasks:
        if t.via_ssh:
            by_host.setdefault(t.host, []).append(t)
    errors, commands = {}, ShortCommands()

    def run(host):
        errors[host] = check(host, by_host[host], commands)

    threads = [threading.Thread(target=run, args=(h,), daemon=True) for h in by_host]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        commands.kill_all()
    bad = [errors[h] for h in by_host if errors.get(h)]
    if bad:
        raise LaunchError("\n".join(bad))


def check_keys_on_ssh_hosts(cluster, ssh, opts):
    """--curve, once the keys are made (in the log dir here): each ssh host sees the files its
    processes read at that path (a log dir on a shared file system). Raises LaunchError."""
    _on_ssh_hosts(cluster, lambda host, tasks, commands: _check_ssh_keys(
        ssh, host, tasks, opts.keys_dir, True, opts.ssh_timeout, commands))


def make_log_dir(opts):
    """Creates opts.log_dir (or a new temp dir) and checks that files can be written there."""
    try:
        if opts.log_dir:
            os.makedirs(opts.log_dir, exist_ok=True)
        else:
            opts.log_dir = tempfile.mkdtemp(prefix="ferry-launch-")
        with tempfile.TemporaryFile(dir=opts.log_dir):
            pass
    except OSError as e:
        what = f"--log-dir {opts.log_dir}" if opts.log_dir else "a temp dir for the logs"
        raise LaunchError(f"preflight: {what}: cannot create or write there: "
                          f"{e.strerror or e}") from None


def check_checkpoint_folder(opts):
    """--resume DIR: DIR holds a checkpoint (sets opts.resume_from = (manifest, step, notes on
    manifests passed over)); --checkpoint-dir DIR: created if missing, writable, and without a
    checkpoint of another job. Checked on this machine: the folder must be visible here too."""
    if opts.resume:
        opts.resume_from = find_checkpoint(opts.resume)
    elif opts.checkpoint_dir:
        prepare_new_folder(opts.checkpoint_dir)


def preflight(cluster, binaries, ssh, opts):
    """Everything that can be checked before anything starts, then the log dir; raises
    LaunchError. The ssh checks run in parallel; whatever way preflight ends (StopRequested
    included), none is left running. Workers that run a program (the first word after "--")
    need it to resolve here (check_program_here) or on their ssh host, and no ferry-trainer.
    CURVE: --curve needs ferry-keys here (the keys are made after preflight, in the log dir);
    --curve-keys DIR must hold the key files of the processes on this machine here, and those
    of each ssh host's processes there."""
    local = [t for t in cluster.tasks if not t.via_ssh]
    program = opts.worker_command[0] if opts.worker_command else None
    check_binaries_here(ferry_binaries(local, binaries, False, program)
                        + ([binaries.keys_tool] if opts.curve else []))
    if program and any(t.role == "worker" for t in local):
        check_program_here(program)
    for t in local:
        if t.role == "ps":
            check_port_here(t)
    _on_ssh_hosts(cluster, lambda host, tasks, commands: _check_ssh_host(
        ssh, host, tasks, binaries, opts.ssh_timeout, commands, opts.curve_keys and opts.keys_dir,
        program))
    if opts.curve_keys and local:
        check_key_folder(opts.keys_dir, local, len(cluster.workers))
    check_checkpoint_folder(opts)
    make_log_dir(opts)  # last: a failed preflight leaves no empty temp dir behind
