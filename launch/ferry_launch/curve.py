"""CURVE (ZeroMQ authentication and encryption) as the launcher sees it: the job's key folder
(--curve: made with ferry-keys in the log dir; --curve-keys DIR: given), which of its files each
process reads, and the warning for servers that listen beyond this machine without it.

A key folder (ferry-keys DIR --workers N; every file owner-only, the folder too):
  server.key    the servers' keypair          read by every server
  workers.pub   the worker keys servers accept read by every server
  server.pub    the servers' public key       read by every worker
  worker-R.key  worker R's keypair            read by worker R
  readers.pub   (--readers M) the reader keys servers accept for the change feed alone
  reader-R.key  reader R's keypair            for a reader (ferry-follow, ferry.ChangeFeed)
ferry-ps and ferry-trainer refuse a secret key (*.key) with any permission for group or others;
the launcher checks the same before anything starts, to say so once and early.
"""

import ipaddress
import os
import re
import shlex
import signal
import subprocess

from .common import LaunchError
from .hosts import bind_address
from .supervise import _die_with_launcher, describe_status

KEYS_SUBDIR = "keys"           # --curve: the job's keys go to LOG_DIR/keys
KEYS_TIMEOUT_S = 60.0          # ferry-keys makes N+1 keypairs: well under a second for any N
SHOWN_SERVERS = 4              # servers named in the exposure warning, at most
_KEY_FILE_RE = re.compile(r"^(?:server\.key|server\.pub|workers\.pub|worker-\d+\.key|readers\.pub|reader-\d+\.key)$")
_WHAT = {"server.key": "the servers' keypair, read by every server",
         "workers.pub": "the worker keys the servers accept, read by every server",
         "server.pub": "the servers' public key, read by every worker"}


def needed_files(task):
    """The key files task reads: a server server.key and workers.pub, worker R server.pub and
    worker-R.key."""
    if task.role == "ps":
        return ["server.key", "workers.pub"]
    return ["server.pub", f"worker-{task.rank}.key"]


def files_for(tasks):
    """The key files any of tasks reads, each once: server.key, workers.pub, server.pub, then
    the workers' keys in rank order."""
    return list(dict.fromkeys(f for t in sorted(tasks, key=lambda t: (t.role != "ps", t.rank))
                              for f in needed_files(t)))


def describe_file(name):
    """What a key file is for, for an error: "worker-3.key (worker 3's keypair)"."""
    m = re.fullmatch(r"worker-(\d+)\.key", name)
    return f"{name} ({_WHAT[name]})" if name in _WHAT else (
        f"{name} (worker {m.group(1)}'s keypair)" if m else name)


def folder_for_commands(opts):
    """The folder every process gets with --curve-keys, or None without CURVE. Under --curve,
    before make_job_keys has set opts.keys_dir: --log-dir's keys/ (made absolute), or without
    one (the log dir is a temp dir made by preflight) the placeholder LOG_DIR/keys; a run
    builds the commands again once the keys are made."""
    if opts.keys_dir or not opts.curve:
        return opts.keys_dir
    return os.path.join(os.path.abspath(opts.log_dir) if opts.log_dir else "LOG_DIR", KEYS_SUBDIR)


def check_key_folder(folder, tasks, num_workers, flag="--curve-keys"):
    """Raises LaunchError unless folder holds, readable, every key file tasks read (on this
    machine), with the secret keys (*.key) open to their owner only. The error names every
    missing file and what it is for."""
    if not os.path.exists(folder):
        raise LaunchError(f"{flag} {folder}: no such folder (ferry-keys DIR --workers "
                          f"{num_workers} makes a job's key folder)")
    if not os.path.isdir(folder):
        raise LaunchError(f"{flag} {folder}: not a folder")
    missing, unreadable, too_open = [], [], []
    for name in files_for(tasks):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            missing.append(name)
        elif not os.access(path, os.R_OK):
            unreadable.append(name)
        elif name.endswith(".key") and os.stat(path).st_mode & 0o077:
            too_open.append(f"{name} (mode {os.stat(path).st_mode & 0o777:04o})")
    if missing:
        raise LaunchError(f"{flag} {folder}: missing key file"
                          f"{'s' if len(missing) > 1 else ''} "
                          f"{', '.join(describe_file(n) for n in missing)}; a job of "
                          f"{num_workers} worker{'s' if num_workers > 1 else ''} needs "
                          "server.key, server.pub, workers.pub and worker-R.key for every "
                          f"worker R (`ferry-keys DIR --workers {num_workers}` makes them)")
    if unreadable:
        raise LaunchError(f"{flag} {folder}: cannot read {', '.join(unreadable)} (permission "
                          "denied)")
    if too_open:
        raise LaunchError(f"{flag} {folder}: secret key{'s' if len(too_open) > 1 else ''} "
                          f"{', '.join(too_open)} open to group or others: chmod 600 (ferry-ps "
                          "and ferry-trainer refuse such a key)")


def make_job_keys(keys_tool, opts, num_workers, say):
    """--curve: writes a new key folder for the job, LOG_DIR/keys (opts.log_dir exists), with
    `ferry-keys DIR --workers N`, and sets opts.keys_dir. The key files an earlier run with the
    same --log-dir left there are removed first (ferry-keys never overwrites a key; like the
    logs, the folder belongs to the run). Raises LaunchError."""
    folder = os.path.join(os.path.abspath(opts.log_dir), KEYS_SUBDIR)
    if os.path.isdir(folder) and not os.path.islink(folder):
        try:
            stale = sorted(n for n in os.listdir(folder) if _KEY_FILE_RE.match(n))
            for name in stale:
                os.remove(os.path.join(folder, name))
        except OSError as e:
            raise LaunchError(f"--curve: cannot remove the keys an earlier run left in {folder}: "
                              f"{e.strerror}") from None
        if stale:
            say(f"--curve: removed the keys an earlier run left in {folder}")
    argv = [keys_tool, folder, "--workers", str(num_workers)]
    if getattr(opts, "readers", 0):
        argv += ["--readers", str(opts.readers)]  # read-only keys for the change feed
    try:
        r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=KEYS_TIMEOUT_S, preexec_fn=_die_with_launcher(signal.SIGKILL))
    except OSError as e:
        raise LaunchError(f"--curve: cannot run {keys_tool}: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"--curve: `{shlex.join(argv)}` did not finish within "
                          f"{KEYS_TIMEOUT_S:g} s") from None
    if r.returncode != 0:
        detail = " | ".join(l.strip() for l in r.stderr.strip().splitlines()[-3:]) or "no output"
        raise LaunchError(f"--curve: `{shlex.join(argv)}` failed ({describe_status(r.returncode)})"
                          f": {detail}")
    try:
        os.chmod(folder, 0o700)  # owner-only, even if a folder of that name was there before
    except OSError as e:
        raise LaunchError(f"--curve: cannot make {folder} owner-only: {e.strerror}") from None
    opts.keys_dir = folder
    return folder


def exposed_servers(cluster):
    """The servers that listen on an address other than loopback (a server at a host name binds
    0.0.0.0: every interface), as "ps 0 at 10.0.0.1:7000", in rank order."""
    exposed = []
    for t in cluster.ps:
        address = bind_address(t.host)
        if not ipaddress.ip_address(address).is_loopback:
            every = " (every interface)" if address == "0.0.0.0" else ""
            exposed.append(f"{t.name} at {address}:{t.port}{every}")
    return exposed


def _shown(exposed):
    return ", ".join(exposed[:SHOWN_SERVERS]) + (
        f" and {len(exposed) - SHOWN_SERVERS} more" if len(exposed) > SHOWN_SERVERS else "")


def curve_by_default(cluster, opts):
    """CURVE is the default for a job whose servers other machines can reach: turns --curve on
    (the launcher makes the job's keys) unless the job has keys already (--curve, --curve-keys)
    or --no-curve says to run without. Returns the line that says so, or None. Call it before
    the commands are built: they carry the key folder."""
    if opts.curve or opts.keys_dir or opts.no_curve:
        return None
    exposed = exposed_servers(cluster)
    if not exposed:
        return None
    opts.curve = True
    return (f"servers listen on addresses other machines can reach ({_shown(exposed)}): CURVE is "
            "on, with keys the launcher makes for the job (as --curve; --curve-keys DIR gives "
            "them, --no-curve runs without)")


def exposure_warning(cluster, opts):
    """The warning for a job whose servers listen on an address other than loopback without
    CURVE (--no-curve), or None."""
    if opts.keys_dir or opts.curve:
        return None
    exposed = exposed_servers(cluster)
    if not exposed:
        return None
    ports = "that port" if len(exposed) == 1 else "those ports"
    return (f"warning: --no-curve: servers listen without CURVE on addresses other machines can "
            f"reach: {_shown(exposed)}. Anyone who can reach {ports} can read and change the model "
            "and stop the job: leave CURVE on (without --no-curve the launcher makes the job's "
            "keys), or restrict the network so that only the job's hosts reach them (see "
            "launch/README.md)")
