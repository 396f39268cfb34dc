"""Options, parsed in one place, and main()."""

import argparse
import math
import os
import shlex
import sys

from .backend_local import Launcher
from .backend_slurm import run_slurm
from .commands import Binaries, build_commands, cards_here, resumed_with, visible_devices
from .curve import curve_by_default, exposure_warning, folder_for_commands, make_job_keys
from .common import (
    DEFAULT_BASE_PORT, DEFAULT_BIN_DIR, DEFAULT_KILL_STOPPED_AFTER_S, DEFAULT_MAX_RESTARTS,
    DEFAULT_RENDEZVOUS_TIMEOUT_S, DEFAULT_SRUN, DEFAULT_SSH, EXIT_OK, EXIT_USAGE, LaunchError,
    MAX_SECONDS, StopRequested)
from .hosts import is_local
from .preflight import check_keys_on_ssh_hosts, preflight, program_warning
from .progress import JobProgress
from .slurm_task import slurm_task_main
from .spec import cluster_from_flags, decode_spec, parse_spec
from .supervise import Console, StopSignals


def _gpus_arg(text):
    if text == "auto":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"want 'auto' or a count >= 0, got '{text}'")
    return int(text)


def _count_arg(low):
    """An argparse type: an integer >= low."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"want an integer >= {low}, got '{text}'")
        return value
    return parse


def _seconds_arg(allow_zero):
    """An argparse type: a finite number of seconds, > 0 (>= 0 with allow_zero), at most
    MAX_SECONDS. argparse names the flag in its error."""
    low = ">= 0" if allow_zero else "> 0"

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if (not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)
                or value > MAX_SECONDS):
            raise argparse.ArgumentTypeError(f"want a finite number of seconds {low} and <= "
                                             f"{MAX_SECONDS:g}, got '{text}'")
        return value
    return parse


def parse_args(argv):
    if "--" in argv:
        i = argv.index("--")
        own, trainer_args = argv[:i], argv[i + 1:]
    else:
        own, trainer_args = argv, []
    ap = argparse.ArgumentParser(
        prog="ferry-launch",
        description="Start and supervise a Ferry cluster (ferry-ps + ferry-trainer): on this "
                    "machine, on other hosts over ssh, or as one srun step in a Slurm allocation.",
        epilog="Everything after '--' is passed to every ferry-trainer; the launcher itself "
               "sets --servers, --rank and --num-workers. When the first word after '--' is "
               "not a flag, it is a program that every worker runs instead, its command line "
               "unchanged (e.g. -- /usr/bin/python3 train.py): it finds the servers, its rank "
               "and the worker count in FERRY_SERVERS, FERRY_RANK, FERRY_NUM_WORKERS and "
               "TF_CONFIG. See launch/README.md.")
    ap.add_argument("--num-ps", type=int, help="number of ferry-ps servers")
    ap.add_argument("--num-workers", type=int, help="number of ferry-trainer workers")
    ap.add_argument("--spec", help="JSON cluster spec file (instead of --num-ps/--num-workers)")
    ap.add_argument("--host", default="127.0.0.1",
                    help="host for --num-ps/--num-workers (default %(default)s)")
    ap.add_argument("--base-port", type=int, default=DEFAULT_BASE_PORT,
                    help="ps R listens on BASE+R; 0 picks ports free on this machine, outside "
                         "the kernel's ephemeral range (default %(default)s)")
    ap.add_argument("--bin-dir", default=DEFAULT_BIN_DIR,
                    help="build dir (bin/ferry-ps, bin/ferry-trainer) or a flat dir "
                         "holding both (default %(default)s)")
    ap.add_argument("--remote-bin-dir", metavar="DIR",
                    help="the same directory on ssh hosts (default: the --bin-dir path)")
    ap.add_argument("--log-dir", help="per-process logs (default: a new temp dir)")
    ap.add_argument("--ps-threads", type=int, default=1, help="ferry-ps --compute-threads")
    ap.add_argument("--progress", choices=("worker", "job"), default="worker",
                    help="worker (default): every worker's progress lines on the console; job: one "
                         "line for the job each time its slowest worker moves on (step, the workers' "
                         "spread, examples/s in all, mean loss, ETA; local and ssh backends); the "
                         "logs keep every line")
    ap.add_argument("--metrics", choices=("loopback", "all", "off"), default="loopback",
                    help="which servers and trainers serve their metrics for Prometheus (plain "
                         "HTTP, no authentication), each on a free port of its host's address, "
                         "printing the URL ('[ps 0] ferry-ps rank 0: metrics at ...', '[worker 0] "
                         "ferry-trainer rank 0: metrics at ...'): loopback (default: only those on "
                         "127.0.0.1), all, or off")
    ap.add_argument("--ps-arg", action="append", default=[], metavar="ARGS",
                    help="more ferry-ps flags, split like a shell line and added to every "
                         "server's command; repeatable: --ps-arg '--max-wait-s 30' "
                         "--ps-arg=--max-message-mb --ps-arg=256")
    ap.add_argument("--gpus-per-host", type=_gpus_arg, default=None, metavar="N|auto",
                    help="trainer k on a host gets CUDA_VISIBLE_DEVICES=k mod N; 0 sets nothing; "
                         "auto (default) = nvidia-smi -L count here, 0 on ssh hosts, that "
                         "node's count under Slurm. Where CUDA_VISIBLE_DEVICES is set (here; "
                         "on a Slurm node), trainers take its entries (the first N) in turn")
    ap.add_argument("--rendezvous-timeout", type=_seconds_arg(False),
                    default=DEFAULT_RENDEZVOUS_TIMEOUT_S, metavar="S",
                    help="seconds to wait for all servers (Slurm: for every task of the step "
                         "to run; a server's replacement under --replication 2: at least this) "
                         "(default %(default)s)")
    ap.add_argument("--grace", type=_seconds_arg(True), default=5.0, metavar="S",
                    help="seconds between SIGTERM and SIGKILL on shutdown (default %(default)s)")
    ap.add_argument("--ssh", default=DEFAULT_SSH, metavar="CMD",
                    help="command for other hosts; HOST and the remote command are appended "
                         "(default '%(default)s')")
    ap.add_argument("--ssh-timeout", type=_seconds_arg(False), default=15.0, metavar="S",
                    help="preflight: seconds for each ssh check (default %(default)s)")
    ap.add_argument("--slurm", action="store_true",
                    help="one srun step over SLURM_JOB_NODELIST (default when SLURM_JOB_ID is "
                         "set and no --spec is given)")
    ap.add_argument("--no-slurm", action="store_true",
                    help="inside an allocation, start local processes anyway")
    ap.add_argument("--srun", default=DEFAULT_SRUN, metavar="CMD",
                    help="srun command; the launcher appends its options (default '%(default)s')")
    ap.add_argument("--checkpoint-dir", metavar="DIR",
                    help="folder for the job's checkpoints: every ferry-ps gets --checkpoint-dir "
                         "DIR --num-workers M; new or without checkpoints (--resume DIR continues "
                         "a job); with servers on other hosts, a folder they all share at this "
                         "path (and this machine too)")
    ap.add_argument("--checkpoint-every", type=_count_arg(1), metavar="N",
                    help="passed to every trainer: worker 0 asks for a checkpoint every N steps "
                         "and at the end (needs --checkpoint-dir or --resume)")
    ap.add_argument("--replication", type=int, choices=(1, 2), default=1, metavar="R",
                    help="2: every ferry-ps keeps a replica of the previous server's slots and "
                         "answers a push once the next server (its backup) has applied it too "
                         "(--replication 2 --peers ...; no row lifecycle, disk tier, top-k or CURVE yet; README, "
                         "\"Replicas\"). A server that dies is then restarted alone, with "
                         "--recover, at its own endpoint: it takes its state from its neighbours "
                         "(its slots from the next server, its replica from the previous one) while "
                         "the workers wait for it, and is up once it prints its 'ferry-ps rank R of "
                         "N listening on' line (waited for up to max(--rendezvous-timeout, 2 x "
                         "ferry-ps --failover-timeout-s + 30 s)); no checkpoint, no step lost. Two "
                         "servers dead at once, or a replacement that exits 3 (ferry-ps could not "
                         "take the state from its peers: a peer refused or timed out, a bad image, "
                         "no memory; its output says why) or 2 (flags refused): all restart from the "
                         "newest checkpoint. Local and ssh backends (Slurm restarts nothing); "
                         "default 1: none")
    ap.add_argument("--disk-tier-dir", metavar="DIR",
                    help="the disk tier's folder (tables declared with disk_tier, e.g. --table "
                         "'ctr/emb*:max_rows=N,disk_tier=1'): ferry-ps rank R gets --disk-tier-dir "
                         "DIR/server-R, on its own host's local disk (an SSD; emptied when the "
                         "server starts: checkpoints keep the rows, not this folder)")
    ap.add_argument("--resume", metavar="DIR",
                    help="restart a job from its newest checkpoint in DIR: as --checkpoint-dir "
                         "DIR, plus --restore to every ferry-ps and --resume to every trainer")
    ap.add_argument("--max-restarts", type=_count_arg(0), default=DEFAULT_MAX_RESTARTS,
                    metavar="K",
                    help="restarts allowed while the job runs: a worker that dies is restarted "
                         "alone; when a server dies, all restart from the last checkpoint, or with "
                         "--replication 2 that server alone, with --recover (the workers wait for "
                         "it); each counts one; 0 stops everything at the first death (default "
                         "%(default)s)")
    ap.add_argument("--kill-stopped-after", type=_seconds_arg(True),
                    default=DEFAULT_KILL_STOPPED_AFTER_S, metavar="S",
                    help="a process on this machine found stopped (state T: SIGSTOP, a job-control "
                         "stop) for S seconds is killed with SIGKILL and restarted like one that "
                         "died, so that the others keep their place; 0: never (default "
                         "%(default)s; keep it below ferry-ps's --worker-timeout-s, 10)")
    ap.add_argument("--curve", action="store_true",
                    help="CURVE (ZeroMQ authentication and encryption): ferry-keys makes the "
                         "job's keys in LOG_DIR/keys, and every ferry-ps and ferry-trainer gets "
                         "--curve-keys with that folder (with processes on other hosts: a "
                         "--log-dir they see at the same path, else use --curve-keys)")
    ap.add_argument("--readers", type=int, default=0, metavar="M",
                    help="with --curve: also make M reader keys (LOG_DIR/keys/reader-R.key): keys "
                         "the servers let follow the change feed (ferry-follow --curve-keys DIR "
                         "--reader R, ferry.ChangeFeed) and nothing else (default 0)")
    ap.add_argument("--no-curve", action="store_true",
                    help="no CURVE, even where servers listen on addresses other machines can "
                         "reach (a host name, an address other than loopback), where the "
                         "launcher otherwise turns --curve on; it then warns that anyone who "
                         "reaches the servers can read and change the model")
    ap.add_argument("--curve-keys", metavar="DIR",
                    help="CURVE with the keys in DIR (from ferry-keys DIR --workers N): every "
                         "ferry-ps and ferry-trainer gets --curve-keys DIR; each host needs the "
                         "files its processes read, at this path")
    ap.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    # Internal: what each task of the srun step runs.
    ap.add_argument("--slurm-task", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--spec-json", help=argparse.SUPPRESS)
    opts = ap.parse_args(own)
    # After "--": ferry-trainer flags, or (its first word not a flag) the command line of a
    # program every worker runs instead (commands.build_commands: what it is told).
    opts.trainer_args, opts.worker_command = trainer_args, None
    if trainer_args and not trainer_args[0].startswith("-"):
        if not trainer_args[0]:
            ap.error("the worker program after '--' is an empty word")
        opts.trainer_args, opts.worker_command = [], trainer_args
    try:
        opts.ps_args = [word for text in opts.ps_arg for word in shlex.split(text)]
    except ValueError as e:
        ap.error(f"argument --ps-arg: {e}")
    for flag in ("checkpoint_dir", "resume", "curve_keys", "disk_tier_dir"):
        if getattr(opts, flag) == "":
            ap.error(f"argument --{flag.replace('_', '-')}: empty folder name")
    if opts.resume and opts.checkpoint_dir:
        ap.error("--resume DIR and --checkpoint-dir are exclusive (the resumed job goes on "
                 "writing its checkpoints in DIR)")
    if opts.disk_tier_dir:
        opts.disk_tier_dir = os.path.abspath(opts.disk_tier_dir)
    if opts.resume:  # from here on, the job's checkpoint folder
        opts.resume = opts.checkpoint_dir = os.path.abspath(opts.resume)
    elif opts.checkpoint_dir:
        opts.checkpoint_dir = os.path.abspath(opts.checkpoint_dir)
    if opts.checkpoint_every is not None and not opts.checkpoint_dir:
        ap.error("argument --checkpoint-every: needs a checkpoint folder: give --checkpoint-dir "
                 "DIR (or --resume DIR)")
    opts.resume_from = None  # (manifest, step) that --resume starts from: set by preflight
    if opts.curve and opts.curve_keys:
        ap.error("--curve and --curve-keys DIR are exclusive (--curve makes new keys for the "
                 "job; --curve-keys DIR uses the keys in DIR)")
    if opts.readers < 0 or opts.readers > 65536:
        ap.error(f"argument --readers: expects an integer in [0, 65536], got {opts.readers}")
    if opts.readers and (opts.no_curve or opts.curve_keys):
        ap.error("--readers makes reader keys with the job's keys: it goes with --curve (or the "
                 "CURVE the launcher turns on by itself), not with " +
                 ("--no-curve" if opts.no_curve else "--curve-keys DIR (make them with ferry-keys "
                                                    "DIR --workers N --readers M)"))
    if opts.no_curve and (opts.curve or opts.curve_keys):
        ap.error("--no-curve and " + ("--curve" if opts.curve else "--curve-keys DIR")
                 + " are exclusive")
    # The key folder every process gets (None: no CURVE). --curve: LOG_DIR/keys, set once the
    # log dir exists (curve.make_job_keys).
    opts.keys_dir = os.path.abspath(opts.curve_keys) if opts.curve_keys else None
    return ap, opts


def load_cluster(ap, opts):
    if opts.spec:
        if opts.num_ps is not None or opts.num_workers is not None:
            raise LaunchError("--spec and --num-ps/--num-workers are exclusive")
        try:
            with open(opts.spec, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise LaunchError(f"spec: cannot read {opts.spec}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise LaunchError(f"spec: {opts.spec} is not UTF-8 text (byte {e.start}: "
                              f"{e.object[e.start:e.start + 1]!r})") from None
        return parse_spec(decode_spec(text, opts.spec))
    if opts.num_ps is None or opts.num_workers is None:
        ap.error("give --num-ps and --num-workers, or --spec FILE")
    return cluster_from_flags(opts)


def slurm_reason(opts):
    """Why the Slurm backend is used (a line for the user), or None."""
    if opts.slurm:
        return "--slurm"
    job = os.environ.get("SLURM_JOB_ID")
    if job and not opts.spec and not opts.no_slurm:
        return f"SLURM_JOB_ID={job} is set and no --spec was given; --no-slurm runs locally"
    return None


def restarts_plan(opts):
    """One line: what the launcher does when a process dies (--dry-run says it)."""
    if not opts.max_restarts:
        return "--max-restarts 0: the first process that dies stops everything"
    resumed = resumed_with(opts)
    servers = ("all processes restart, servers with --restore (from the newest checkpoint), "
               f"workers with {resumed}" if opts.checkpoint_dir else
               "everything stops (servers restart only from a checkpoint: --checkpoint-dir)")
    if opts.replication == 2:
        servers = ("it alone restarts with --recover, taking its state from its neighbours' "
                   f"replicas, while the workers wait for it; two dead at once: {servers}")
    return (f"up to {opts.max_restarts} restarts (--max-restarts): a dead worker restarts alone "
            f"with {resumed}; a dead server: {servers}")


def launch(ap, opts, console, signals):
    """Plans, prints (--dry-run) or preflights, then runs the cluster; LaunchError before
    anything has started."""
    if opts.slurm and opts.no_slurm:
        raise LaunchError("--slurm and --no-slurm are exclusive")
    why = slurm_reason(opts)
    if why and "--exit-when-drained" in getattr(opts, "ps_args", []):
        raise LaunchError("--ps-arg --exit-when-drained: a server that leaves the job is not followed "
                          "under Slurm yet (its end would end the job step); run without Slurm, or "
                          "without it")
    if why:
        return run_slurm(opts, console, signals, why)
    cluster = load_cluster(ap, opts)
    for t in cluster.tasks:
        t.via_ssh = not is_local(t.host)
    binaries = Binaries(opts.bin_dir, opts.remote_bin_dir)
    # This machine: its CUDA_VISIBLE_DEVICES or nvidia-smi; ssh hosts: --gpus-per-host only.
    here, gpu_note = cards_here(opts.gpus_per_host,
                                visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")))
    there = [str(i) for i in range(opts.gpus_per_host or 0)]

    def cards_for(t):
        return there if t.via_ssh else here

    curve_note = curve_by_default(cluster, opts)
    build_commands(cluster, binaries, opts, cards_for)
    warning = exposure_warning(cluster, opts)
    if curve_note:
        console.say(curve_note)
    ssh = shlex.split(opts.ssh)
    remote = [t for t in cluster.tasks if t.via_ssh]
    if remote and not ssh:
        raise LaunchError("--ssh: empty command")
    if gpu_note and any(not t.via_ssh for t in cluster.workers):
        console.say(gpu_note)
    python_note = program_warning(opts)
    if python_note:
        console.say(python_note, err=True)
    if opts.dry_run:
        for t in cluster.tasks:
            where = f" (on {t.host} over ssh)" if t.via_ssh else ""
            print(f"[{t.name}]{where} {t.command_text()}")
        if opts.checkpoint_dir or opts.replication == 2:
            console.say(restarts_plan(opts))
        if remote:
            console.say(f"commands for other hosts run as: {shlex.join(ssh)} HOST 'sh -c "
                        "WRAPPER ferry-launch-remote GRACE_TENTHS DIR COMMAND' (WRAPPER stops "
                        "COMMAND when ssh's stdin closes; see launch/README.md)")
        if opts.curve:
            console.say(f"--curve: {binaries.keys_tool} would make the job's keys in "
                        f"{folder_for_commands(opts)}")
        if warning:
            console.say(warning, err=True)
        return EXIT_OK
    preflight(cluster, binaries, ssh, opts)
    if opts.curve:  # the log dir exists now: the job's keys go there
        make_job_keys(binaries.keys_tool, opts, len(cluster.workers), console.say)
        check_keys_on_ssh_hosts(cluster, ssh, opts)
        build_commands(cluster, binaries, opts, cards_for)  # again, with the keys' folder
        console.say(f"--curve: the job's keys are in {opts.keys_dir} (owner-only; --curve-keys "
                    f"{opts.keys_dir} uses them again)")
    if warning:
        console.say(warning, err=True)
    if opts.progress == "job":
        console = JobProgress(console, len(cluster.workers))
    return Launcher(cluster, opts, console, signals).run()


def main(argv):
    ap, opts = parse_args(argv)
    if opts.slurm_task:
        return slurm_task_main(opts)
    console = Console()
    signals = StopSignals()
    with signals.installed():  # before preflight: a signal there ends it cleanly too
        try:
            return launch(ap, opts, console, signals)
        except LaunchError as e:
            print(f"ferry-launch: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except StopRequested as s:  # before anything was started (run() handles it after)
            console.say(f"stopped by {s} before the cluster started; nothing is left running",
                        err=True)
            return 128 + s.signum
