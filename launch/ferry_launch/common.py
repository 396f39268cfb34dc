"""Constants, the exit statuses, the ssh wrapper and the launcher's exceptions."""

import os
import re
import signal

DEFAULT_BASE_PORT = 7470
DEFAULT_RENDEZVOUS_TIMEOUT_S = 60.0
DEFAULT_SSH = "ssh -o BatchMode=yes"
DEFAULT_SRUN = "srun"
WAIT_REPORT_EVERY_S = 3.0
TAIL_LINES = 15          # lines of a failed process shown in the summary, at most
HISTORY_LINES = 400      # lines of each process kept in memory to find them in
# After --grace, how much longer a stopped ssh or srun may take to exit before it is killed.
STOP_MARGIN_S = 5.0
# After SIGKILL, how long to wait for a process to be reaped before naming it and going on.
REAP_TIMEOUT_S = 5.0
# Rendezvous: one TCP connect to a server may take this long; a refused one is retried after
# PROBE_INTERVAL_S. Every server has its own prober, so a slow one delays no other.
PROBE_TIMEOUT_S = 0.5
PROBE_INTERVAL_S = 0.1
# Restarts: how many a job may use by default (--max-restarts), and how long the launcher waits,
# after a worker exited with an error status, for news that a server died (which would explain
# it: a worker whose server is gone exits with an error): then all roll back together.
DEFAULT_MAX_RESTARTS = 3
SETTLE_S = 0.5
# After a server's replacement ended (not by a signal): how long the launcher waits for news that
# one of its peers died (the replacement ends as soon as it loses one; the peer's own end may be
# noticed later, on a loaded machine by more than SETTLE_S), before it replaces the server again.
# Both dead fall back to the checkpoint, counted once; a replacement that ended for another
# reason is replaced this much later.
REPLACEMENT_SETTLE_S = 2.0
# A process found stopped (state T: SIGSTOP, a job-control stop) for this long is killed and so
# restarted like one that died (--kill-stopped-after): well inside ferry-ps's --worker-timeout-s
# (10 s), after which a sync step's other workers would fail, and the trainers' heartbeat timeout
# for a server (5 s). The launcher looks every WATCH_EVERY_S.
DEFAULT_KILL_STOPPED_AFTER_S = 2.0
WATCH_EVERY_S = 0.25
# A server's replacement (--replication 2, ferry-ps --recover) binds its endpoint, takes its state
# from its two neighbours, each within ferry-ps's --failover-timeout-s (FAILOVER_TIMEOUT_S unless a
# --ps-arg gives one), then says it listens: the launcher waits for that line up to
# max(--rendezvous-timeout, 2 x the failover timeout + REPLACEMENT_MARGIN_S), saying every
# REPLACEMENT_REPORT_EVERY_S what it waits for. ferry-ps exits RECOVER_FAILED_EXIT when --recover
# could not take its state from its peers (then only a checkpoint can bring it back).
FAILOVER_TIMEOUT_S = 60
REPLACEMENT_MARGIN_S = 30.0
REPLACEMENT_REPORT_EVERY_S = 10.0
RECOVER_FAILED_EXIT = 3
# --base-port 0 picks ports from here up to 65535, outside the kernel's ephemeral range (the
# local ports of outgoing connections, /proc/sys/net/ipv4/ip_local_port_range; Linux's default
# EPHEMERAL_DEFAULT when it cannot be read): a client that reconnects to a dead server's port
# cannot take that port as its own (a TCP self-connect), which would keep the replacement from
# binding it.
PICK_PORTS_FROM = 10000
EPHEMERAL_DEFAULT = (32768, 60999)
# The largest value any seconds flag (--rendezvous-timeout, --grace, --ssh-timeout) accepts.
MAX_SECONDS = 86400.0
# Where the launcher script (Slurm tasks run it with --slurm-task) and the programs are, and the
# folder whose `ferry` package worker programs import (None: BIN_DIR/python of a build tree, if
# there; commands.Binaries). In the source tree: the ferry-launch script beside this package and
# the build tree build/ beside it. Installed (cmake --install writes _installed.py): the prefix's
# bin/ferry-launch and bin/, and the folder this package was installed in, beside `ferry`.
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
try:
    from . import _installed
except ImportError:
    _installed = None
if _installed:
    LAUNCHER_PATH = os.path.normpath(os.path.join(_PACKAGE_DIR, _installed.LAUNCHER))
    DEFAULT_BIN_DIR = os.path.normpath(os.path.join(_PACKAGE_DIR, _installed.BIN_DIR))
    INSTALLED_PYTHON_DIR = os.path.dirname(_PACKAGE_DIR)
else:
    LAUNCHER_PATH = os.path.join(os.path.dirname(_PACKAGE_DIR), "ferry-launch")
    DEFAULT_BIN_DIR = os.path.join(os.path.dirname(os.path.dirname(_PACKAGE_DIR)), "build")
    INSTALLED_PYTHON_DIR = None

# Flags the launcher owns: a user may not pass them to the trainer after "--", nor to ferry-ps
# with --ps-arg (flag -> what to use instead).
LAUNCHER_OWNED_TRAINER_FLAGS = {"--servers": None, "--rank": None, "--num-workers": None,
                                "--incarnation": None,
                                "--local": None, "--checkpoint-every": "--checkpoint-every",
                                "--resume": "--resume DIR",
                                "--curve-keys": "--curve or --curve-keys DIR",
                                "--metrics": "--metrics loopback|all|off"}
LAUNCHER_OWNED_PS_FLAGS = {"--bind": None, "--rank": None, "--num-servers": None,
                           "--num-workers": None, "--compute-threads": "--ps-threads",
                           "--checkpoint-dir": "--checkpoint-dir", "--restore": "--resume DIR",
                           "--curve-keys": "--curve or --curve-keys DIR",
                           "--metrics": "--metrics loopback|all|off",
                           "--disk-tier-dir": "--disk-tier-dir",
                           "--replication": "--replication", "--peers": "--replication",
                           "--recover": None}

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# The remote side of the ssh backend, run as `sh -c REMOTE_WRAPPER ferry-launch-remote TICKS DIR
# COMMAND...`: cd DIR (the launcher's working directory) when it exists there; start COMMAND with
# stdin from /dev/null, in a session of its own when the host has setsid (then signals go to its
# whole process group); a watcher reads the real stdin (the launcher's pipe, through ssh) until
# EOF, then sends SIGTERM and, if COMMAND is still there after TICKS tenths of a second, SIGKILL.
# The wrapper exits with COMMAND's status (128+N for signal N) and leaves no process of COMMAND's
# group behind. It kills before it reports: once the launcher is gone, writing to stderr raises
# SIGPIPE. POSIX sh (tested with dash and bash); one line and no '!' so that a csh login shell
# passes it through unchanged.
REMOTE_WRAPPER = (
    't=$1; d=$2; shift 2; cd "$d" 2>/dev/null || cd; exec 3<&0 </dev/null; trap "e=1" USR1; '
    's=; command -v setsid >/dev/null 2>&1 && s=setsid; $s "$@" 3<&- & c=$!; '
    '(while read -r _; do :; done <&3; '
    'kill -s TERM -- -$c 2>/dev/null || kill -s TERM $c 2>/dev/null; kill -s USR1 $$ 2>/dev/null; '
    'n=0; while [ $n -lt $t ] && kill -0 $c 2>/dev/null; do sleep 0.1; n=$((n+1)); done; '
    'if kill -0 -- -$c 2>/dev/null || kill -0 $c 2>/dev/null; then '
    'kill -s KILL -- -$c 2>/dev/null || kill -s KILL $c 2>/dev/null; '
    'echo "ferry-launch: $1 on $(hostname) ignored SIGTERM; sent SIGKILL" >&2; fi) >/dev/null & '
    'w=$!; exec 3<&-; '
    'while :; do wait $c; r=$?; if [ $r -gt 128 ] && kill -0 $c 2>/dev/null; then continue; fi; '
    'break; done; kill -s KILL -- -$c 2>/dev/null; '
    'if [ -n "$e" ]; then wait $w; else kill $w 2>/dev/null; wait $w 2>/dev/null; fi; exit $r')

# A Slurm task says "ferry-launch: started NAME pid N: COMMAND" when its process runs (a worker
# after its servers are up) and ends by printing "... [task-exit STATUS]" (STATUS as
# Popen.returncode: negative for a signal); srun --label prefixes every task line with "TASKID: ".
TASK_STARTED_RE = re.compile(r"^ferry-launch: started \w+ \d+ pid \d+: ")
TASK_EXIT_RE = re.compile(r"\[task-exit (-?\d+)\]$")
SRUN_LABEL_RE = re.compile(r"^\s*(\d+): ?(.*)$")
SRUN_TASK_ERROR_RE = re.compile(r"^srun: error: \S+: tasks? ([0-9,\-]+): (.*)$")


class LaunchError(Exception):
    """A configuration / spec / preflight problem: printed as one line, exit 2."""


class StartFailed(Exception):
    """A process could not be started at all (exec failed): stop the others, exit 1."""


class StopRequested(Exception):
    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
