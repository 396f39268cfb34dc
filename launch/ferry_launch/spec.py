"""The cluster description (Task, Cluster) from flags, a JSON spec or a Slurm allocation."""

import atexit
import contextlib
import json
import os
import random
import shlex
import socket
import stat
import tempfile
import time

from .common import DEFAULT_BASE_PORT, EPHEMERAL_DEFAULT, PICK_PORTS_FROM, LaunchError
from .hosts import _HOST_RE, canonical_host, is_local

# ferry/messages/placement.h's kSlots: a job of more servers would leave some without a slot.
MAX_SERVERS = 5040


class Prepend:
    """An environment value that goes in front of the variable's inherited value, as in a path
    list: "VALUE:INHERITED", or VALUE alone where the variable is unset or empty. Where the
    process is started decides what it inherits (commands.environ_for, commands.remote_argv)."""

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Prepend({self.value!r})"


class Task:
    """One process to run: role 'ps' or 'worker', its rank, where, and its command line.

    env (and resume_env) map a variable to its value in the process's environment: a str sets
    it, a Prepend puts a value in front of the inherited one, None removes it; every other
    variable is inherited."""

    def __init__(self, role, rank, host, port=None, where=None):
        self.role, self.rank, self.host, self.port = role, rank, host, port
        self.where = where or f"{role}[{rank}]"  # what an error names: a spec field or a flag
        self.via_ssh = False  # set by the backend: started over ssh
        self.argv = None      # set by build_commands
        self.resume_argv = None  # set by build_commands: argv to continue the job (restarts)
        # set by build_commands for a server of a --replication 2 job: argv of its replacement
        # after it died (--recover: it takes its state from its neighbours' replicas); else None
        self.recover_argv = None
        self.env = {}         # set by build_commands: changes to the inherited environment
        self.resume_env = {}  # set by build_commands: the same for resume_argv
        # set by build_commands for a worker: how a start tells the process which start of its
        # rank it is ("flag": --incarnation N; "env": FERRY_INCARNATION=N; None: not told)
        self.incarnation_via = None

    @property
    def name(self):
        return f"{self.role} {self.rank}"

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def command(self, resumed=False, incarnation=0, recover=False):
        """(argv, env) of a start of this task: the first start, with resumed the one that
        continues the job (a restart), or with recover a server's replacement (recover_argv). A
        worker's start number `incarnation` (0: the first) goes with it when not 0: the servers
        give its rank to the highest at once, even while an earlier start's connection looks
        alive, and refuse that one from then on."""
        if recover:
            argv, env = self.recover_argv, self.env
        else:
            argv, env = (self.resume_argv, self.resume_env) if resumed else (self.argv, self.env)
        if incarnation and self.incarnation_via == "flag":
            argv = argv + ["--incarnation", str(incarnation)]
        elif incarnation and self.incarnation_via == "env":
            env = dict(env, FERRY_INCARNATION=str(incarnation))
        return argv, env

    def command_text(self, argv=None, env=None):
        """A command (argv, env; default the first start's) as a shell line: VAR=value ...
        argv. Removed variables are not shown."""
        argv, env = argv or self.argv, self.env if env is None else env
        words = []
        for k, v in sorted(env.items()):
            if isinstance(v, Prepend):
                words.append(f"{k}={shlex.quote(v.value)}${{{k}:+:${k}}}")
            elif v is not None:
                words.append(f"{k}={shlex.quote(v)}")
        return " ".join(words + [shlex.join(argv)])


class Cluster:
    def __init__(self, ps, workers):
        self.ps = ps            # list of Task, role 'ps', with ports
        self.workers = workers  # list of Task, role 'worker'

    @property
    def tasks(self):
        """Servers then workers: also the Slurm task order (SLURM_PROCID)."""
        return self.ps + self.workers


def _parse_port(text, where):
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise LaunchError(f"spec: {where}: bad port '{text}' (want an integer 1..65535)")
    return int(text)


def _split_address(entry, where, need_port):
    if not isinstance(entry, str) or not entry:
        raise LaunchError(f"spec: {where}: want a string \"host:port\"" if need_port
                          else f"spec: {where}: want a string \"host\" or \"host:port\"")
    host, sep, port = entry.rpartition(":")
    if not sep:
        if need_port:
            raise LaunchError(f"spec: {where} '{entry}': missing port (want \"host:port\")")
        host, port = entry, None
    elif not host:
        raise LaunchError(f"spec: {where} '{entry}': missing host")
    else:
        port = _parse_port(port, f"{where} '{entry}'")
    if not _HOST_RE.match(host):
        raise LaunchError(f"spec: {where} '{entry}': bad host '{host}'")
    return host, port


def _reject_duplicate_keys(pairs):
    """json object_pairs_hook: a key given twice is an error (json would keep the last one)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise LaunchError(f"spec: duplicate field '{key}' (each field may appear once)")
        obj[key] = value
    return obj


def decode_spec(text, what):
    """JSON text of a spec -> Python data; what names the text in errors (a file, a flag)."""
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as e:
        raise LaunchError(f"spec: {what} is not valid JSON: {e}") from None
    except RecursionError:
        raise LaunchError(f"spec: {what} nests its JSON too deeply (a spec is two or three "
                          "levels: {\"ps\": [...], \"worker\": [...]})") from None


def _check_tf_task(task, cluster):
    """TF_CONFIG's "task" names one process of the cluster: {"type": ROLE, "index": I}. The
    launcher starts every process, so it is only checked, then ignored."""
    if not isinstance(task, dict):
        raise LaunchError("spec: field 'task' must be an object {\"type\": ROLE, \"index\": I}")
    unknown = sorted(set(task) - {"type", "index"})
    if unknown:
        raise LaunchError(f"spec: unknown field 'task.{unknown[0]}' (known: 'type', 'index')")
    role, index = task.get("type"), task.get("index")
    if role not in ("ps", "worker"):
        raise LaunchError(f"spec: field 'task.type' must be \"ps\" or \"worker\", got "
                          f"{json.dumps(role)}")
    size = len(cluster[role]) if isinstance(cluster.get(role), list) else 0
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
        raise LaunchError(f"spec: field 'task.index' must be an integer 0..{size - 1} (an entry "
                          f"of 'cluster.{role}'), got {json.dumps(index)}")


def parse_spec(data):
    """Validates a cluster spec (already JSON-decoded) and returns a Cluster.

    Accepted: {"ps": ["host:port", ...], "worker": ["host" | "host:port", ...]} or the
    TF_CONFIG shape {"cluster": {...same...}, "task": {"type": ROLE, "index": I}} ("task" is
    optional, checked, and otherwise ignored).
    """
    if not isinstance(data, dict):
        raise LaunchError("spec: top level must be a JSON object")
    if "cluster" in data:
        unknown = sorted(set(data) - {"cluster", "task"})
        if unknown:
            raise LaunchError(f"spec: unknown field '{unknown[0]}' (TF_CONFIG style allows "
                              "'cluster' and 'task')")
        task, data, prefix = data.get("task"), data["cluster"], "cluster."
        if not isinstance(data, dict):
            raise LaunchError("spec: field 'cluster' must be an object")
    else:
        task, prefix = None, ""
    unknown = sorted(set(data) - {"ps", "worker"})
    if unknown:
        raise LaunchError(f"spec: unknown field '{prefix}{unknown[0]}' (known: 'ps', 'worker')")
    for role in ("ps", "worker"):
        if role not in data:
            raise LaunchError(f"spec: missing field '{prefix}{role}'")
        if not isinstance(data[role], list) or not data[role]:
            raise LaunchError(f"spec: field '{prefix}{role}' must be a non-empty list")
    if len(data["ps"]) > MAX_SERVERS:
        raise LaunchError(f"spec: field '{prefix}ps' lists {len(data['ps'])} servers; at most {MAX_SERVERS} "
                          "(the placement's slots: each server needs one)")
    if task is not None:
        _check_tf_task(task, data)

    seen = {}

    def claim(host, port, entry, where):
        key = (canonical_host(host), port)
        if key in seen:
            raise LaunchError(f"spec: {where} '{entry}': duplicate address (same as {seen[key]})")
        seen[key] = where

    ps = []
    for i, entry in enumerate(data["ps"]):
        where = f"{prefix}ps[{i}]"
        host, port = _split_address(entry, where, need_port=True)
        claim(host, port, entry, where)
        ps.append(Task("ps", i, host, port, where))
    workers = []
    for i, entry in enumerate(data["worker"]):
        where = f"{prefix}worker[{i}]"
        host, port = _split_address(entry, where, need_port=False)
        if port is not None:  # Ferry's workers listen on no port: only TF_CONFIG shows it
            claim(host, port, entry, where)
        workers.append(Task("worker", i, host, port, where))
    return Cluster(ps, workers)


def ephemeral_ports():
    """The kernel's ephemeral port range (lo, hi): where the local ports of outgoing connections
    come from (Linux's default where /proc says nothing)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            lo, hi = (int(w) for w in f.read().split())
        if 1 <= lo <= hi <= 65535:
            return lo, hi
    except (OSError, ValueError):
        pass
    return EPHEMERAL_DEFAULT


# Ports picked for --base-port 0 are claimed for the launcher's life: a file per port in
# claims_dir() that names its pid. Its servers bind them only after the pick (and a server's
# replacement binds its port again after a death), so another launcher picking meanwhile could
# find the same port free and start a server on it: that one exits at its start ("Address already
# in use"). A launcher passes over the ports a live launcher claims, takes over those of one that
# died, and gives its own back as it exits. (Launchers of one user on one machine and in one pid
# namespace: of others, ports are told apart only by their being free.) A claim is made while the
# port's test socket is bound (free_ports), so no two launchers of one network namespace ever
# claim the same port at once: that makes taking over a dead launcher's claim safe.
_claimed = []
_CLAIM_WRITE_S = 5.0  # a claim with no pid in it yet (its launcher is writing it) is taken as live this long


def claims_dir():
    return os.path.join(tempfile.gettempdir(), f"ferry-launch-ports-{os.getuid()}")


def _claims_dir_usable():
    """claims_dir(), made if missing, where it is a real folder of this user's that no one else can
    write (not a link, nor one another user made to fill with claims or take ours); else None:
    then no claims, and only the bind test tells a port free."""
    d = claims_dir()
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def _claim_live(path):
    """Whether the claim at path is of a live process (this one's included)."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read().strip()
        age = time.time() - os.stat(path).st_mtime
    except (OSError, UnicodeDecodeError):
        return False  # gone, or unreadable: not a claim to keep
    if not text.isdigit():
        return age < _CLAIM_WRITE_S
    pid = int(text)
    if not 0 < pid < 2**22:  # (Linux's pid_max at most; 0 would ask about our own group)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def port_claimed(port):
    """Whether a live launcher (this one too) claims port: passed over before its test bind, which
    could otherwise meet that launcher's server binding it again."""
    d = _claims_dir_usable()
    return d is not None and _claim_live(os.path.join(d, str(port)))


def claim_port(port):
    """Claims port for this launcher (its test socket bound: free_ports): False where a live
    launcher (this one too) claims it."""
    d = _claims_dir_usable()
    if d is None:
        return True
    path = os.path.join(d, str(port))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            if _claim_live(path):
                return False
            with contextlib.suppress(OSError):
                os.unlink(path)  # a dead launcher's: taken over
            continue
        except OSError:
            return True
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(f"{os.getpid()}\n")
        _claimed.append(path)
        return True
    return False


@atexit.register
def release_claims():
    """Gives back this launcher's claims (at its exit)."""
    while _claimed:
        path = _claimed.pop()
        with contextlib.suppress(OSError, ValueError):
            with open(path, encoding="ascii") as f:
                mine = int(f.read().strip() or -1) == os.getpid()
            if mine:
                os.unlink(path)


def free_ports(n):
    """n distinct ports free on this machine now, outside the ephemeral range (common's
    PICK_PORTS_FROM): a port there is never the local port of an outgoing connection, so a client
    that keeps reconnecting to a dead server's port cannot take it (a TCP self-connect) and keep
    the server's replacement from binding it. The scan starts at a random port (launchers started
    together pick different ones) and tries each in turn; each socket stays bound until every
    port is picked; a port another live launcher here claims is passed over, and each one picked
    is claimed (claim_port). Only where no free port is left outside the range: ports the kernel
    picks."""
    lo, hi = ephemeral_ports()

    def outside(first):
        return [p for p in range(first, 65536) if not lo <= p <= hi]

    candidates = outside(PICK_PORTS_FROM)
    if len(candidates) < 2 * n:  # an unusual range: below PICK_PORTS_FROM too
        candidates = outside(1024)
    start = random.randrange(len(candidates)) if candidates else 0
    with contextlib.ExitStack() as held:
        ports = []
        for port in candidates[start:] + candidates[:start]:
            if len(ports) == n:
                break
            if port_claimed(port):
                continue
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                s.bind(("0.0.0.0", port))  # free on every address, so on each host's too
            except OSError:
                s.close()
                continue
            if not claim_port(port):
                s.close()
                continue
            ports.append(port)
        while len(ports) < n:
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("0.0.0.0", 0))
            ports.append(s.getsockname()[1])
            claim_port(ports[-1])
        return ports


def ps_ports(base_port, hosts, source):
    """The ports of ps 0..len(hosts)-1 (ps r runs on hosts[r]): base_port + r. With base_port 0,
    ports free on this machine now, outside the kernel's ephemeral range (free_ports; so every
    host must be this machine; source names where the hosts came from), all distinct."""
    if base_port == 0:
        remote = [h for h in hosts if not is_local(h)]
        if remote:
            raise LaunchError(f"--base-port 0 picks ports free on this machine, but {source} "
                              f"puts a server on {remote[0]}; give a port (e.g. --base-port "
                              f"{DEFAULT_BASE_PORT})")
        return free_ports(len(hosts))
    last = base_port + len(hosts) - 1
    if base_port < 1 or last > 65535:
        raise LaunchError(f"--base-port {base_port}: ps ports {base_port}..{last} are not all "
                          "in 1..65535")
    return [base_port + r for r in range(len(hosts))]


def cluster_from_flags(opts):
    if opts.num_ps < 1 or opts.num_workers < 1:
        raise LaunchError("--num-ps and --num-workers must be at least 1")
    if opts.num_ps > MAX_SERVERS:
        raise LaunchError(f"--num-ps {opts.num_ps}: at most {MAX_SERVERS} servers (the placement's slots: "
                          "each server needs one)")
    if not _HOST_RE.match(opts.host):
        raise LaunchError(f"--host '{opts.host}': not a host name or address")
    ports = ps_ports(opts.base_port, [opts.host] * opts.num_ps, "--host")
    ps = [Task("ps", r, opts.host, port, "--host") for r, port in enumerate(ports)]
    workers = [Task("worker", r, opts.host, None, "--host") for r in range(opts.num_workers)]
    return Cluster(ps, workers)


def cluster_from_nodes(nodes, num_ps, num_workers, base_port):
    """The placement rule of the Slurm backend: ps r on nodes[r mod K] and worker w on
    nodes[w mod K] (K nodes, both round-robin from the first node); ps r listens on
    base_port + r (unique in the job, so servers sharing a node never collide)."""
    if num_ps > MAX_SERVERS:
        raise LaunchError(f"--num-ps {num_ps}: at most {MAX_SERVERS} servers (the placement's slots: "
                          "each server needs one)")
    if num_ps < 1 or num_workers < 1:
        raise LaunchError("--num-ps and --num-workers must be at least 1")
    k = len(nodes)
    hosts = [nodes[r % k] for r in range(num_ps)]
    ports = ps_ports(base_port, hosts, "SLURM_JOB_NODELIST")
    ps = [Task("ps", r, host, port, "SLURM_JOB_NODELIST")
          for r, (host, port) in enumerate(zip(hosts, ports))]
    workers = [Task("worker", w, nodes[w % k], None, "SLURM_JOB_NODELIST")
               for w in range(num_workers)]
    return Cluster(ps, workers)
