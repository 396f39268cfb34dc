"""Command lines: the one place that decides what each process is told."""

import collections
import json
import math
import os
import shlex
import shutil
import subprocess

from .common import (
    INSTALLED_PYTHON_DIR, LAUNCHER_OWNED_PS_FLAGS, LAUNCHER_OWNED_TRAINER_FLAGS, LaunchError, REMOTE_WRAPPER)
from .curve import folder_for_commands
from .hosts import bind_address, canonical_host
from .spec import Prepend


# What a worker program (a command after "--" instead of ferry-trainer flags) is told, in its
# environment: every one of these is set, or removed from the environment it inherits.
# (PYTHONPATH and CUDA_VISIBLE_DEVICES are set too where there is something to set.)
PROGRAM_ENV = ("FERRY_SERVERS", "FERRY_RANK", "FERRY_NUM_WORKERS", "FERRY_RESUME",
               "FERRY_CHECKPOINT_EVERY", "FERRY_CURVE_KEYS", "FERRY_METRICS", "FERRY_INCARNATION",
               "TF_CONFIG")


def find_binary(bin_dir, name, subdir):
    """Looks for BIN_DIR/<subdir>/<name> (the build tree) then BIN_DIR/<name> (a flat dir)."""
    candidates = [os.path.join(bin_dir, subdir, name), os.path.join(bin_dir, name)]
    for c in candidates:
        if os.path.exists(c):
            return c
    return candidates[0]


class Binaries:
    """Paths of ferry-ps and ferry-trainer here (--bin-dir) and on ssh hosts (--remote-bin-dir,
    default the same path; the layout, build tree or flat, is the one found here), and of the
    build tree's Python package."""

    LAYOUT = {"ferry-ps": "bin", "ferry-trainer": "bin"}

    def __init__(self, bin_dir, remote_bin_dir=None):
        self.bin_dir = os.path.abspath(bin_dir)
        self.local, self.remote = {}, {}
        for name, subdir in self.LAYOUT.items():
            path = find_binary(self.bin_dir, name, subdir)
            self.local[name] = path
            self.remote[name] = (os.path.join(remote_bin_dir, os.path.relpath(path, self.bin_dir))
                                 if remote_bin_dir else path)
        # ferry-keys (--curve runs it, here only) sits beside ferry-ps.
        self.keys_tool = os.path.join(os.path.dirname(self.local["ferry-ps"]), "ferry-keys")
        # BIN_DIR/python holds the package `ferry` in a build tree: worker programs find it
        # there (PYTHONPATH) without an install. An installed launcher's own folder holds the
        # installed `ferry` (INSTALLED_PYTHON_DIR; the same path on ssh hosts). None when
        # neither is there (checked here).
        python = os.path.join(self.bin_dir, "python")
        there = os.path.join(remote_bin_dir, "python") if remote_bin_dir else python
        if not os.path.exists(os.path.join(python, "ferry")) and INSTALLED_PYTHON_DIR:
            python = there = INSTALLED_PYTHON_DIR
        found = os.path.exists(os.path.join(python, "ferry"))
        self.python = {False: python, True: there} if found else {False: None, True: None}

    def path(self, name, via_ssh):
        return (self.remote if via_ssh else self.local)[name]

    def python_dir(self, via_ssh):
        """The folder holding the build tree's package `ferry`, or None."""
        return self.python[via_ssh]


def passed_through(opts):
    """What followed "--": the worker program's command line, or the ferry-trainer flags."""
    return list(opts.worker_command or opts.trainer_args)


def resumed_with(opts):
    """How a restarted worker is told that it continues the job (for the launcher's lines)."""
    return "FERRY_RESUME=1" if opts.worker_command else "--resume"


def _check_passed_flags(args, owned, what):
    """Flags passed through to a binary may not be ones the launcher sets (owned: flag -> the
    launcher option to use instead, or None)."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in owned:
            instead = f" (use {owned[flag]})" if owned[flag] else ""
            raise LaunchError(f"{what} {arg} is set by the launcher; remove it{instead}")


def tf_config_cluster(cluster):
    """The "cluster" of the TF_CONFIG every worker program gets: {"ps": [HOST:PORT, ...],
    "worker": [HOST:PORT, ...]}, in rank order. Ferry's workers listen on no port, but
    TF_CONFIG's entries need one: a worker keeps the port its spec entry gave, others get
    placeholder ports counting up from the servers' highest port, distinct on each host from
    every other entry there (so the value also serves as a --spec)."""
    taken = {(canonical_host(t.host), t.port) for t in cluster.tasks if t.port}
    port = max(t.port for t in cluster.ps)
    workers = []
    for t in cluster.workers:
        if t.port:
            workers.append(t.address)
            continue
        key = canonical_host(t.host)
        while True:
            port = port + 1 if port < 65535 else 1024
            if (key, port) not in taken:
                break
        taken.add((key, port))
        workers.append(f"{t.host}:{port}")
    return {"ps": [t.address for t in cluster.ps], "worker": workers}


def _metrics_flag(t, opts):
    """["--metrics", "ADDRESS:0"] for a ferry-ps or ferry-trainer that serves its metrics for
    Prometheus on a free port of its host's address (it prints the URL), or []: by default only
    where that address is loopback, since the page is plain HTTP, unauthenticated even under
    --curve, and names tables and hot ids (opts.metrics: loopback, all, off)."""
    mode = getattr(opts, "metrics", "loopback")
    address = bind_address(t.host)
    if mode == "all" or (mode == "loopback" and address.startswith("127.")):
        return ["--metrics", f"{address}:0"]
    return []


def _server_commands(cluster, binaries, opts, curve):
    """argv, resume_argv and env of every ferry-ps (see build_commands)."""
    folder, resume = opts.checkpoint_dir, bool(opts.resume)
    # The job's worker count is the servers' configuration (a peer that says otherwise is
    # refused, and a restoring server needs it); with a checkpoint folder every server writes its
    # shards there.
    ckpt = ["--num-workers", str(len(cluster.workers))] + (["--checkpoint-dir", folder] if folder else [])
    for t in cluster.ps:
        base = [binaries.path("ferry-ps", t.via_ssh),
                "--bind", f"tcp://{bind_address(t.host)}:{t.port}", "--rank", str(t.rank),
                "--num-servers", str(len(cluster.ps)),
                "--compute-threads", str(opts.ps_threads)]
        base += _metrics_flag(t, opts) + ckpt + curve
        if getattr(opts, "replication", 1) == 2:  # a backup each: the next server
            if curve:
                raise LaunchError("--replication 2 does not work with CURVE yet: run the job with "
                                  "--no-curve on a network only its hosts reach, or without replication")
            base += ["--replication", "2", "--peers", ",".join(f"tcp://{p.address}" for p in cluster.ps)]
        if getattr(opts, "disk_tier_dir", None):  # each server a store of its own
            base += ["--disk-tier-dir", os.path.join(opts.disk_tier_dir, f"server-{t.rank}")]
        # Restarted after a server died (or the whole job under --resume): from the newest
        # checkpoint. Without a folder a server cannot be restarted.
        t.resume_argv = base + ["--restore"] + list(opts.ps_args) if folder else None
        t.argv = t.resume_argv if resume else base + list(opts.ps_args)
        # Its replacement after it died, with replicas: the same command without --restore, plus
        # --recover: it takes its state from its neighbours (its slots from server rank+1, its
        # replica from rank-1), then listens at the same endpoint, where workers and servers
        # connect again (the port stays the task's: with --base-port 0 the one picked at start).
        t.recover_argv = (base + ["--recover"] + list(opts.ps_args)
                          if getattr(opts, "replication", 1) == 2 else None)
        t.env, t.resume_env = {}, {}


def _trainer_command(t, binaries, opts, servers, num_workers, curve):
    """A ferry-trainer worker: the launcher's flags, then the flags after "--"."""
    t.argv = [binaries.path("ferry-trainer", t.via_ssh), "--servers", servers,
              "--rank", str(t.rank), "--num-workers", str(num_workers)] + _metrics_flag(t, opts) + curve
    if opts.checkpoint_every:
        t.argv += ["--checkpoint-every", str(opts.checkpoint_every)]
    # Restarted (alone, or after its servers restored a checkpoint): it continues the job
    # the servers hold.
    t.resume_argv = t.argv + ["--resume"] + list(opts.trainer_args)
    t.argv = (t.resume_argv if opts.resume else t.argv + list(opts.trainer_args))
    t.env, t.resume_env = {}, {}
    t.incarnation_via = "flag"


def _program_command(t, binaries, opts, servers, num_workers, tf_cluster, keys):
    """A worker program: its command line unchanged; what a trainer gets as flags, it gets in
    its environment (PROGRAM_ENV; FERRY_RESUME=1 where a trainer gets --resume)."""
    t.argv = t.resume_argv = list(opts.worker_command)
    env = dict.fromkeys(PROGRAM_ENV)  # each is set below, or removed
    env.update(FERRY_SERVERS=servers, FERRY_RANK=str(t.rank),
               FERRY_NUM_WORKERS=str(num_workers),
               TF_CONFIG=json.dumps({"cluster": tf_cluster,
                                     "task": {"type": "worker", "index": t.rank}},
                                    separators=(",", ":")))
    if opts.checkpoint_every:
        env["FERRY_CHECKPOINT_EVERY"] = str(opts.checkpoint_every)
    if keys:
        env["FERRY_CURVE_KEYS"] = keys
    metrics = _metrics_flag(t, opts)  # where a ferry-trainer would get --metrics ADDRESS:0
    if metrics:
        env["FERRY_METRICS"] = metrics[1]
    python = binaries.python_dir(t.via_ssh)
    if python:
        env["PYTHONPATH"] = Prepend(python)
    t.resume_env = dict(env, FERRY_RESUME="1")
    t.env = t.resume_env if opts.resume else env
    t.incarnation_via = "env"


def build_commands(cluster, binaries, opts, cards_for):
    """Sets argv, resume_argv, env and resume_env of every task, from opts.ps_threads,
    opts.ps_args (extra ferry-ps flags), what followed "--" (opts.trainer_args: extra
    ferry-trainer flags; or opts.worker_command: the worker program's command line), the
    checkpoint options (opts.checkpoint_dir, opts.checkpoint_every, opts.resume; None = not
    given) and CURVE (opts.curve, opts.keys_dir: with either, every server and every worker,
    restarted ones included, gets --curve-keys FOLDER; see curve.folder_for_commands).

    resume_argv is the command that continues the job: a server with --restore (None without a
    checkpoint folder), a worker with --resume. Under --resume DIR, argv is resume_argv. With
    --replication 2 every server also gets recover_argv, its replacement's command (--recover).

    A worker program runs its command line unchanged, every start the same, and learns its
    place from its environment instead (PROGRAM_ENV): FERRY_SERVERS (the --servers value),
    FERRY_RANK, FERRY_NUM_WORKERS, TF_CONFIG (the same cluster, task {"type": "worker",
    "index": RANK}), FERRY_CHECKPOINT_EVERY (with --checkpoint-every), FERRY_CURVE_KEYS (with
    CURVE), FERRY_METRICS (ADDRESS:0 where a ferry-trainer would get --metrics), FERRY_RESUME=1 in resume_env (and env under --resume DIR), FERRY_INCARNATION (a restart's number, where a ferry-trainer gets --incarnation N: Task.command); those not set are removed
    from what it inherits. PYTHONPATH gets BIN_DIR/python in front when the build tree's package
    is there (Binaries.python_dir).

    cards_for(task) -> the GPUs (CUDA_VISIBLE_DEVICES entries) workers on the task's host take
    in turn; empty: CUDA_VISIBLE_DEVICES is left alone. The k-th worker on a host (in rank
    order) gets CUDA_VISIBLE_DEVICES = cards[k mod len(cards)], so each sees one card, as its
    device 0.
    """
    _check_passed_flags(opts.ps_args, LAUNCHER_OWNED_PS_FLAGS, "--ps-arg flag")
    _check_passed_flags(opts.trainer_args, LAUNCHER_OWNED_TRAINER_FLAGS, "trainer flag")
    servers = ",".join(f"tcp://{t.address}" for t in cluster.ps)
    keys = folder_for_commands(opts)
    curve = ["--curve-keys", keys] if keys else []
    _server_commands(cluster, binaries, opts, curve)
    num_workers = len(cluster.workers)
    tf_cluster = tf_config_cluster(cluster) if opts.worker_command else None
    on_host = collections.Counter()
    for t in cluster.workers:
        if opts.worker_command:
            _program_command(t, binaries, opts, servers, num_workers, tf_cluster, keys)
        else:
            _trainer_command(t, binaries, opts, servers, num_workers, curve)
        cards = cards_for(t)
        key = canonical_host(t.host)
        if cards:
            for env in (t.env, t.resume_env):
                env["CUDA_VISIBLE_DEVICES"] = cards[on_host[key] % len(cards)]
        on_host[key] += 1
    if (any("CUDA_VISIBLE_DEVICES" in t.env for t in cluster.workers)
            and any(a.split("=", 1)[0] == "--gpu" for a in opts.trainer_args)):
        raise LaunchError("trainer flag --gpu conflicts with --gpus-per-host (each trainer is "
                          "given one card, which it sees as device 0); pass --gpus-per-host 0 "
                          "to choose cards yourself")


def environ_for(base, changes):
    """The environment of a process started here: base (the one it inherits) with changes (a
    Task's env: set, Prepend, or None to remove) applied."""
    env = dict(base)
    for k, v in changes.items():
        if v is None:
            env.pop(k, None)
        elif isinstance(v, Prepend):
            env[k] = f"{v.value}:{env[k]}" if env.get(k) else v.value
        else:
            env[k] = v
    return env


def visible_devices(value):
    """CUDA_VISIBLE_DEVICES of the launcher's environment as a list of entries (indexes or
    UUIDs); None when unset; [] when set and empty (no GPUs)."""
    if value is None:
        return None
    entries = [e.strip() for e in value.split(",")]
    if entries == [""]:
        return []
    if "" in entries:
        raise LaunchError(f"CUDA_VISIBLE_DEVICES '{value}': empty entry (want GPU indexes or "
                          "UUIDs separated by commas)")
    return entries


def cards_here(gpus_per_host, visible):
    """The GPUs trainers on this machine take in turn, and a line for the user (or None).

    gpus_per_host: N, or None for auto; visible: visible_devices() of this machine. N = 0 sets
    nothing. When CUDA_VISIBLE_DEVICES is set, its cards (the first N of them) are used: the
    trainers may only use those; an empty value means no GPUs. Otherwise cards 0..N-1, N from
    nvidia-smi -L under auto."""
    if gpus_per_host == 0:
        return [], None
    if visible is not None:
        if not visible:
            return [], "CUDA_VISIBLE_DEVICES is set and empty: trainers on this host get no GPU"
        shown = ",".join(visible)
        if gpus_per_host is not None and gpus_per_host > len(visible):
            raise LaunchError(f"--gpus-per-host {gpus_per_host}, but CUDA_VISIBLE_DEVICES={shown} "
                              f"makes only {len(visible)} GPUs visible")
        cards = visible[:gpus_per_host]
        return cards, (f"CUDA_VISIBLE_DEVICES={shown} is set: trainer k on this host gets "
                       f"entry k mod {len(cards)} of {','.join(cards)} as its "
                       "CUDA_VISIBLE_DEVICES")
    n = count_gpus() if gpus_per_host is None else gpus_per_host
    source = "nvidia-smi -L" if gpus_per_host is None else "--gpus-per-host"
    return [str(i) for i in range(n)], (f"{n} GPUs per host ({source}): trainer k on a host "
                                        f"gets CUDA_VISIBLE_DEVICES=k mod {n}" if n else None)


def count_gpus():
    """GPUs on this machine: the "GPU N: ..." lines of `nvidia-smi -L`; 0 without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _remote_env(env):
    """The argv prefix that applies env (a Task's env) on another host: `env -u NAME ...
    NAME=VALUE ...`, behind a POSIX sh that puts each Prepend in front of the value the remote
    process inherits there."""
    unset = [word for k, v in sorted(env.items()) if v is None for word in ("-u", k)]
    values = [f"{k}={v}" for k, v in sorted(env.items()) if isinstance(v, str)]
    argv = ["env"] + unset + values if unset or values else []
    prepend = [(k, v.value) for k, v in sorted(env.items()) if isinstance(v, Prepend)]
    if prepend:  # names are the launcher's own (PYTHONPATH): safe in the script
        script = "".join(f'{k}="$1${{{k}:+:${k}}}"; export {k}; shift; ' for k, _ in prepend)
        argv = ["sh", "-c", script + 'exec "$@"', "ferry-env"] + [v for _, v in prepend] + argv
    return argv


def remote_argv(ssh, task, grace, argv=None, env=None):
    """The ssh command line that runs task (its argv and env, or those given) on its host under
    REMOTE_WRAPPER."""
    ticks = max(1, math.ceil(grace * 10))
    inner = _remote_env(task.env if env is None else env) + (argv or task.argv)
    return ssh + [task.host, shlex.join(["sh", "-c", REMOTE_WRAPPER, "ferry-launch-remote",
                                         str(ticks), launcher_cwd()] + inner)]


def launcher_cwd():
    """The launcher's working directory, where processes on other hosts start too if it exists
    there."""
    try:
        return os.getcwd()
    except OSError:  # deleted under us: the remote side then stays in its home directory
        return "/nonexistent"
