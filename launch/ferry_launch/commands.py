"""Command lines: the one place that decides what each process is told."""

import collections
import math
import os
import shlex
import shutil
import subprocess

from .common import (
    LAUNCHER_OWNED_PS_FLAGS, LAUNCHER_OWNED_TRAINER_FLAGS, LaunchError, REMOTE_WRAPPER)
from .curve import folder_for_commands
from .hosts import bind_address, canonical_host


def find_binary(bin_dir, name, subdir):
    """Looks for BIN_DIR/<subdir>/<name> (the build tree) then BIN_DIR/<name> (a flat dir)."""
    candidates = [os.path.join(bin_dir, subdir, name), os.path.join(bin_dir, name)]
    for c in candidates:
        if os.path.exists(c):
            return c
    return candidates[0]


class Binaries:
    """Paths of ferry-ps and ferry-trainer here (--bin-dir) and on ssh hosts (--remote-bin-dir,
    default the same path; the layout, build tree or flat, is the one found here)."""

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

    def path(self, name, via_ssh):
        return (self.remote if via_ssh else self.local)[name]


def _check_passed_flags(args, owned, what):
    """Flags passed through to a binary may not be ones the launcher sets (owned: flag -> the
    launcher option to use instead, or None)."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in owned:
            instead = f" (use {owned[flag]})" if owned[flag] else ""
            raise LaunchError(f"{what} {arg} is set by the launcher; remove it{instead}")


def build_commands(cluster, binaries, opts, cards_for):
    """Sets argv, resume_argv and env of every task, from opts.ps_threads, opts.ps_args (extra
    ferry-ps flags), opts.trainer_args (extra ferry-trainer flags), the checkpoint options
    (opts.checkpoint_dir, opts.checkpoint_every, opts.resume; None = not given) and CURVE
    (opts.curve, opts.keys_dir: with either, every server and every worker, restarted ones
    included, gets --curve-keys FOLDER; see curve.folder_for_commands).

    resume_argv is the command that continues the job: a server with --restore (None without a
    checkpoint folder), a worker with --resume. Under --resume DIR, argv is resume_argv.

    cards_for(task) -> the GPUs (CUDA_VISIBLE_DEVICES entries) trainers on the task's host take
    in turn; empty: CUDA_VISIBLE_DEVICES is left alone. The k-th trainer on a host (in rank
    order) gets CUDA_VISIBLE_DEVICES = cards[k mod len(cards)], so each sees one card, as its
    device 0.
    """
    _check_passed_flags(opts.ps_args, LAUNCHER_OWNED_PS_FLAGS, "--ps-arg flag")
    _check_passed_flags(opts.trainer_args, LAUNCHER_OWNED_TRAINER_FLAGS, "trainer flag")
    servers = ",".join(f"tcp://{t.address}" for t in cluster.ps)
    folder, every, resume = opts.checkpoint_dir, opts.checkpoint_every, bool(opts.resume)
    # The job's worker count is the servers' configuration (a peer that says otherwise is
    # refused, and a restoring server needs it); with a checkpoint folder every server writes its
    # shards there.
    ckpt = ["--num-workers", str(len(cluster.workers))] + (["--checkpoint-dir", folder] if folder else [])
    keys = folder_for_commands(opts)
    curve = ["--curve-keys", keys] if keys else []
    for t in cluster.ps:
        base = [binaries.path("ferry-ps", t.via_ssh),
                "--bind", f"tcp://{bind_address(t.host)}:{t.port}", "--rank", str(t.rank),
                "--num-servers", str(len(cluster.ps)),
                "--compute-threads", str(opts.ps_threads)]
        # Metrics for Prometheus on a free port of the same address (the server prints its URL);
        # by default only where that address is loopback: the page is plain HTTP, unauthenticated
        # even under --curve, and names tables and hot ids.
        mode = getattr(opts, "metrics", "loopback")
        address = bind_address(t.host)
        if mode == "all" or (mode == "loopback" and address.startswith("127.")):
            base += ["--metrics", f"{address}:0"]
        base += ckpt + curve
        # Restarted after a server died (or the whole job under --resume): from the newest
        # checkpoint. Without a folder a server cannot be restarted.
        t.resume_argv = base + ["--restore"] + list(opts.ps_args) if folder else None
        t.argv = t.resume_argv if resume else base + list(opts.ps_args)
        t.env = {}
    on_host = collections.Counter()
    for t in cluster.workers:
        t.argv = [binaries.path("ferry-trainer", t.via_ssh), "--servers", servers,
                  "--rank", str(t.rank), "--num-workers", str(len(cluster.workers))] + curve
        if every:
            t.argv += ["--checkpoint-every", str(every)]
        # Restarted (alone, or after its servers restored a checkpoint): it continues the job
        # the servers hold.
        t.resume_argv = t.argv + ["--resume"] + list(opts.trainer_args)
        t.argv = (t.resume_argv if resume else t.argv + list(opts.trainer_args))
        t.env = {}
        cards = cards_for(t)
        key = canonical_host(t.host)
        if cards:
            t.env["CUDA_VISIBLE_DEVICES"] = cards[on_host[key] % len(cards)]
        on_host[key] += 1
    if (any("CUDA_VISIBLE_DEVICES" in t.env for t in cluster.workers)
            and any(a.split("=", 1)[0] == "--gpu" for a in opts.trainer_args)):
        raise LaunchError("trainer flag --gpu conflicts with --gpus-per-host (each trainer is "
                          "given one card, which it sees as device 0); pass --gpus-per-host 0 "
                          "to choose cards yourself")


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


def remote_argv(ssh, task, grace, argv=None):
    """The ssh command line that runs task (its argv, or the argv given) on its host under
    REMOTE_WRAPPER."""
    ticks = max(1, math.ceil(grace * 10))
    env = [f"{k}={v}" for k, v in sorted(task.env.items())]
    inner = (["env"] + env if env else []) + (argv or task.argv)
    try:
        cwd = os.getcwd()
    except OSError:  # deleted under us: the remote side then stays in its home directory
        cwd = "/nonexistent"
    return ssh + [task.host, shlex.join(["sh", "-c", REMOTE_WRAPPER, "ferry-launch-remote",
                                         str(ticks), cwd] + inner)]
