"""The Slurm backend, one task: ferry-launch --slurm-task, started by srun."""

import os
import signal
import subprocess
import sys
import threading

from . import common
from .commands import Binaries, build_commands, cards_here, environ_for, visible_devices
from .common import LaunchError
from .curve import check_key_folder
from .spec import decode_spec, parse_spec
from .supervise import _die_with_launcher, describe_status, wait_for_servers


def _say(msg):
    """Writes `ferry-launch: msg` and its newline in one write(2): the task's child writes to the
    same output, and print() under PYTHONUNBUFFERED=1 writes a line and its newline apart, so a
    child's line could land between them (it did, once in a CI run)."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"ferry-launch: {msg}\n".encode())


def _task_end(name, rc):
    """Prints the line the launcher reads as this task's exit, and returns the exit status."""
    _say(f"{name} ended: {describe_status(rc)} [task-exit {rc}]")
    return rc if rc >= 0 else 128 - rc


def slurm_task_main(opts):
    say = _say

    procid = os.environ.get("SLURM_PROCID")
    name = f"slurm task {procid}"
    try:
        if procid is None or not procid.isdigit():
            raise LaunchError("--slurm-task runs under srun: SLURM_PROCID is not set")
        cluster = parse_spec(decode_spec(opts.spec_json or "", "--spec-json"))
        cards, gpu_note = cards_here(opts.gpus_per_host,
                                     visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES")))
        build_commands(cluster, Binaries(opts.bin_dir), opts, lambda t: cards)
        tasks = cluster.tasks
        if int(procid) >= len(tasks):
            raise LaunchError(f"SLURM_PROCID {procid} but the plan has {len(tasks)} tasks "
                              "(srun --ntasks does not match)")
        task = tasks[int(procid)]
        name = task.name
        node = os.environ.get("SLURMD_NODENAME")
        if node and node != task.host:
            raise LaunchError(f"{name} (slurm task {procid}) was placed on {task.host} but runs "
                              f"on {node}: srun did not follow SLURM_HOSTFILE "
                              "(--distribution=arbitrary)")
        if opts.keys_dir:  # CURVE: the files this process reads, as this node sees them
            try:
                check_key_folder(opts.keys_dir, [task], len(cluster.workers))
            except LaunchError as e:
                raise LaunchError(f"{name} on {node or task.host}: {e} (the key folder must be "
                                  "on a file system every node sees, at the same path)") from None
    except LaunchError as e:
        say(f"error: {e}")
        return _task_end(name, 1)

    stop, wake = threading.Event(), threading.Event()

    def read_stdin():  # EOF: the launcher closed the step's stdin, or died
        try:
            while os.read(0, 65536):
                pass
        except OSError:
            pass
        stop.set()
        wake.set()

    def on_signal(_signum, _frame):
        stop.set()
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    threading.Thread(target=read_stdin, daemon=True).start()
    say(f"slurm task {procid} is {name} on {node or task.host} "
        f"(SLURM_NODEID {os.environ.get('SLURM_NODEID', '?')}, "
        f"SLURM_LOCALID {os.environ.get('SLURM_LOCALID', '?')})")
    if task.role == "worker" and gpu_note:
        say(gpu_note)

    if task.role == "worker":
        got = wait_for_servers(cluster.ps, opts.rendezvous_timeout, say,
                               lambda s: "stopped" if stop.wait(s) else None,
                               progress=task.rank == 0)
        if got == "timeout":
            return _task_end(name, 1)
        if got == "stopped":
            say(f"{name}: stopped before its servers were up")
            return _task_end(name, -signal.SIGTERM)

    env = environ_for(os.environ, task.env) if task.env else None
    try:
        child = subprocess.Popen(task.argv, stdin=subprocess.DEVNULL, env=env,
                                 preexec_fn=_die_with_launcher(signal.SIGKILL))
    except OSError as e:
        say(f"error: cannot start {task.argv[0]}: {e.strerror}")
        return _task_end(name, 127)
    say(f"started {name} pid {child.pid}: {task.command_text()}")

    def reap():
        child.wait()
        wake.set()

    threading.Thread(target=reap, daemon=True).start()
    wake.wait()
    if child.poll() is None:  # asked to stop
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=opts.grace)
        except subprocess.TimeoutExpired:
            say(f"{name} pid {child.pid} ignored SIGTERM for {opts.grace:g} s; sending SIGKILL")
            child.kill()
            try:
                child.wait(timeout=common.REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                say(f"{name} pid {child.pid} could not be reaped {common.REAP_TIMEOUT_S:g} s after "
                    "SIGKILL (stuck in the kernel?); leaving it")
                return _task_end(name, -signal.SIGKILL)
    return _task_end(name, child.wait())
