"""ferry_launch: start and supervise a Ferry cluster (ferry-ps servers + ferry-trainer workers).

The package behind launch/ferry-launch. Modules, in the order a launch uses them:
  cli            options (parsed in one place) and main()
  spec, hosts    the cluster description: Tasks from flags, a JSON spec or a Slurm allocation
  commands       build_commands(): what every process is told
  preflight      checks before anything starts; checkpoints: what a checkpoint folder holds
  curve          CURVE: the job's key folder (--curve makes it, --curve-keys names it), the
                 files each process reads, the warning for servers exposed without it
  supervise      children, their output, signals, reaping, the rendezvous with the servers
  recovery       the job's progress read from the output; restart records and their report
  backend_local  the local and ssh backends, with the restarts
  backend_slurm  the Slurm backend, the launcher's side; slurm_task: one task of its step
  common         constants, exit statuses, the ssh wrapper, exceptions

No mpirun; Python 3 standard library only. One description of the cluster (Tasks: role, rank,
host, port) comes from flags, a JSON spec or a Slurm allocation, and build_commands() is the one
place that decides what every process is told (its flags and CUDA_VISIBLE_DEVICES; for workers
that run a program of the user's, given after "--", its environment: FERRY_SERVERS, FERRY_RANK,
FERRY_NUM_WORKERS, FERRY_RESUME, TF_CONFIG, ...).

Backends:
  local  hosts localhost / 127.0.0.0/8: children of the launcher, each in its own session, killed
         with the launcher (PR_SET_PDEATHSIG) even when it is SIGKILLed.
  ssh    any other host: `SSH HOST 'sh -c WRAPPER ... COMMAND'` (--ssh, default
         "ssh -o BatchMode=yes"). ssh forwards no signals, so WRAPPER (REMOTE_WRAPPER below) runs
         COMMAND and stops it (SIGTERM, SIGKILL after --grace) when its stdin reaches EOF. The
         launcher holds that stdin open and closes it to stop the process; it also closes when
         the launcher dies, however it dies.
  slurm  --slurm, or SLURM_JOB_ID set and no --spec: hosts from SLURM_JOB_NODELIST, ONE srun step
         with a task per process placed through SLURM_HOSTFILE (--distribution=arbitrary). Every
         task runs `ferry-launch --slurm-task`, which takes its role and rank from SLURM_PROCID,
         builds its command with the same build_commands() and runs it; it stops the process
         when the step's stdin (srun --input=all, held open by the launcher) reaches EOF.

Flow (local, ssh): options -> commands -> preflight (binaries, free ports, hosts reachable over
ssh and binaries there, --curve-keys files, the checkpoint folder, the log dir) -> --curve: the
job's keys in the log dir, commands again with their folder -> start servers -> rendezvous
(every ps port accepts TCP from here, with a deadline) -> start workers -> supervise until all
workers exit 0 (then stop the servers, exit 0). A process that dies meanwhile is restarted while
--max-restarts allows: a worker alone with --resume; after a server's death (with a checkpoint)
every process, servers with --restore, workers with --resume. Otherwise (or past the budget)
everything stops, exit 1 with a summary. Slurm (no restarts): the
same, except that the step starts servers and workers together and each worker task waits for
the servers itself; the launcher's deadline is for every task to be running. SIGINT/SIGTERM are
handled from before preflight on. Every wait has a deadline except the supervision of running
workers (they end, or srun does).

Exit status: 0 success; 1 a process failed or the rendezvous timed out; 2 bad usage / spec /
preflight; 128+N when the launcher itself got signal N (SIGINT, SIGTERM).

Threading: the main thread owns all decisions. Per child process, one reader thread copies its
output (prefixed "[role rank] ") to stdout and a log file and hands it to recovery.JobWatch
(steps, checkpoints, "resuming" lines, which it posts as events), and one waiter thread reaps it
and posts an event on a queue the main thread blocks on. Every process is started from the main
thread (PR_SET_PDEATHSIG follows the thread that forked). Preflight checks each ssh host from a
thread of its own; the rendezvous probes each server from a thread of its own.
"""

# The names tests and tools use, re-exported. Tunables (common.REAP_TIMEOUT_S,
# common.WAIT_REPORT_EVERY_S) are read through `common` where used: patch them there.
import os
import socket

from . import checkpoints, common
from .backend_local import Launcher, TaskProc
from .backend_slurm import SlurmLauncher
from .cli import main
from .hosts import expand_hostlist
from .common import TAIL_LINES, LaunchError
from .spec import Cluster, Task, cluster_from_nodes, ps_ports
from .supervise import Console, StopSignals, Stream, _die_with_launcher, cause_lines, wait_for_servers
