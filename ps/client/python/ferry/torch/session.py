"""The worker's place in a Ferry job: servers, rank, worker count, resume, checkpoints.

`init()` reads them from the environment `ferry-launch` sets for a worker program (or from
TF_CONFIG, or from its arguments), connects a `ferry.Client`, and makes the result the default
`Session` of the modules of `ferry.torch`. It also prints the lines the launcher reads to follow
a job (`[worker R] step T/TOTAL ...`, `[worker R] checkpoint of step S saved: ...`,
`[worker R] resuming the job at step S of TOTAL`). With FERRY_METRICS (which ferry-launch sets
where it gives ferry-trainer --metrics) or init(metrics=...), it serves the worker's series for
Prometheus with the names ferry-trainer serves (ferry_trainer_step, ..._examples_total, ..._loss,
..._time_seconds_total{part}, ..._sent_bytes_total, ...; `[worker R] metrics at URL` says where),
updated by log_step() and record().

Thread-safety: a Session may be used from several threads (its client is thread-safe); init()
and default_session() are meant for the main thread.
"""

import os
import sys
import time

import ferry

# The environment ferry-launch gives a worker program (launch/README.md, "Running your own
# program as the workers").
ENV_SERVERS = "FERRY_SERVERS"
ENV_RANK = "FERRY_RANK"
ENV_NUM_WORKERS = "FERRY_NUM_WORKERS"
ENV_RESUME = "FERRY_RESUME"
ENV_CHECKPOINT_EVERY = "FERRY_CHECKPOINT_EVERY"
ENV_CURVE_KEYS = "FERRY_CURVE_KEYS"
ENV_METRICS = "FERRY_METRICS"
ENV_INCARNATION = "FERRY_INCARNATION"

_default = None


def _int_from(env, name, low):
    text = env.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(f"environment variable {name}='{text}': want an integer >= {low}")
    return value


def _duration(seconds):
    """45s, 3m05s, 2h03m."""
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Session:
    """One worker's connection to the job: `client` (a ferry.Client), `rank`, `num_workers`,
    `num_servers`, `resume` (True for a worker the launcher restarted), `restored_step` (the
    step of the checkpoint the servers started from; 0 if none), `worker_step` (this worker's own
    steps as the servers knew them: its predecessor's pushes they took, or the checkpoint's
    record of this rank; -1 if a server is older than 1.11), `checkpoint_every` (0: none asked
    for) and `start_step` (where this worker's loop begins; see there)."""

    def __init__(self, client, *, resume=False, checkpoint_every=0, out=None, metrics=None):
        self.client = client
        self.rank = client.rank
        self.num_workers = client.num_workers
        self.num_servers = client.num_servers
        self.resume = bool(resume)
        self.restored_step = client.restored_step
        self.worker_step = client.worker_step
        self.checkpoint_every = int(checkpoint_every or 0)
        self._out = out or sys.stdout
        self._modules = []  # the ferry.torch modules on this session, flushed before a checkpoint
        self._first_log = None  # (time, step, examples) of the first log_step
        self._started = time.monotonic()
        # metrics: "HOST:PORT" or "PORT" (0: a free port) to serve this worker's series on.
        self.metrics = ferry.WorkerMetrics(str(metrics), self.rank) if metrics else None
        if self.metrics is not None:
            self.say(f"metrics at {self.metrics.url}")

    def _attach(self, module):
        self._modules.append(module)

    def _resume_step(self, own):
        """The step a module of a restarted worker starts from: for one without sync tables
        (`own`: async and ssp count this worker's own steps) this worker's own step as the
        servers knew it, so that it neither does again nor skips steps of its own; else the
        restored checkpoint's (a sync table's first pull then moves it to the job's step); 0 in a
        new job."""
        if not self.resume:
            return 0
        return self.worker_step if own and self.worker_step >= 0 else self.restored_step

    @property
    def own_steps(self):
        """True when every module of this worker is async or ssp: its steps are its own, not the
        job's global step."""
        return bool(self._modules) and all(m.own_steps for m in self._modules)

    @property
    def start_step(self):
        """Where this worker's training loop begins: 0 in a new job. For a worker the launcher
        restarted (resume), the step its modules joined the job at: a sync table's global step
        (the servers' step now, which is past the checkpoint's when this worker died alone); for
        async and ssp modules this worker's own step (worker_step); with none, the restored
        checkpoint's step. Read it after making the modules."""
        if not self.resume:
            return 0
        if not self._modules:
            return self.restored_step
        return max(m.joined_at for m in self._modules)

    def say(self, text):
        """Prints one line prefixed with this worker, as the launcher expects."""
        print(f"[worker {self.rank}] {text}", file=self._out, flush=True)

    def resuming(self, step, total):
        """Tells the launcher this (restarted) worker joins the job at `step` of `total` ("of its
        own" when its modules count their own steps: the launcher then counts what this worker
        lost by its own step)."""
        self.say(f"resuming the job at step {step} of {total}" + (" of its own" if self.own_steps else ""))

    def log_step(self, step, total, examples=None, **metrics):
        """A progress line: `[worker R] step T/TOTAL k v ... [N examples/s] ETA D` (the launcher
        follows the job by it). `examples`: the training examples this worker has processed
        since its first log_step (for examples/s). The ETA is at the pace since the first call."""
        now = time.monotonic()
        if self._first_log is None:
            self._first_log = (now, step, examples or 0)
        t0, step0, examples0 = self._first_log
        parts = [f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items()]
        if examples is not None and now > t0:
            parts.append(f"{(examples - examples0) / (now - t0):.0f} examples/s")
        if step > step0 and now > t0:
            parts.append("ETA " + _duration((now - t0) / (step - step0) * max(total - step, 0)))
        self.say(f"step {step}/{total} {' '.join(parts)}".rstrip())
        self.record(step, examples, metrics.get("loss"))

    def record(self, step, examples=None, loss=None):
        """Updates the metrics page (if this session serves one): `step` steps done, `examples`
        training examples processed (cumulative), `loss` the last step's. Time by part: pull is
        the modules' waiting for rows, parameters and earlier pushes; push their sending;
        compute the rest of the wall time since the session began (the model, the data, the
        caller's own work); wait and eval are 0 (ferry-trainer's; a Python worker's waits for
        other workers are in pull). log_step() calls it; call it each step for a finer page."""
        if self.metrics is None:
            return
        pull = push = 0.0
        for m in self._modules:
            st = m.stats
            pull += st.get("pull_s", 0.0) + st.get("exchange_wait_s", 0.0)
            push += st.get("push_send_s", 0.0) + st.get("exchange_send_s", 0.0)
        wall = time.monotonic() - self._started
        c = self.client.stats()
        self.metrics.update(step=int(step), examples=int(examples or 0), loss=float(loss or 0.0), pull_s=pull,
                            push_s=push, compute_s=max(wall - pull - push, 0.0), bytes_sent=c["bytes_sent"],
                            bytes_received=c["bytes_received"])

    def checkpoint_due(self, step):
        """Whether `step` is one the job checkpoints at (--checkpoint-every N: every N-th)."""
        return self.checkpoint_every > 0 and step > 0 and step % self.checkpoint_every == 0

    def checkpoint(self, step):
        """Has every server save its shard of every table as of `step`, then the manifest
        written (worker 0 only; other ranks return at once). With sync tables, call it after
        this step's forward (its pull) and before its backward (its push): the servers are then
        all at `step`. Raises ferry.Error if a server cannot."""
        if self.rank != 0:
            return
        for m in self._modules:
            m.flush()
        self.client.checkpoint(step)
        self.say(f"checkpoint of step {step} saved: {self.num_servers} shards")

    def init_process_group(self, backend="gloo", timeout_s=300):
        """torch.distributed for the workers of this job (the hybrid: dense layers under
        DistributedDataParallel, embeddings on Ferry): world size num_workers, this rank. The
        rendezvous is MASTER_ADDR:MASTER_PORT when both are set. Otherwise worker 0 opens
        torch's TCPStore on a free port of MASTER_ADDR (default 127.0.0.1: one host) and the
        workers learn the port through the servers (Client.all_reduce_sum, a collective of every
        worker: a worker restarted alone cannot join it, so set MASTER_ADDR and MASTER_PORT for
        jobs that restart workers)."""
        import datetime

        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = os.environ.get("MASTER_PORT")
        if port is not None:
            dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                    world_size=self.num_workers, timeout=timeout)
            return
        store = None
        if self.rank == 0:  # bound here, on port 0: no race for the port
            store = dist.TCPStore(addr, 0, self.num_workers, True, timeout=timeout, wait_for_workers=False)
        port = int(self.client.all_reduce_sum([float(store.port if store else 0)])[0])
        if store is None:
            store = dist.TCPStore(addr, port, self.num_workers, False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.num_workers, timeout=timeout)

    def finish(self):
        """Ends this worker's training: sends what is pending and tells the servers (sync steps
        stop waiting for it)."""
        for m in self._modules:
            m.flush()
        self.client.finish()

    def close(self):
        global _default
        for m in self._modules:
            m.flush(raise_errors=False)
        if self.metrics is not None:
            self.metrics.close()
        self.client.close()
        if _default is self:
            _default = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def init(servers=None, rank=None, num_workers=None, *, request_timeout=360.0, connect_timeout=30.0,
         curve_keys=None, heartbeat_timeout=5.0, metrics=None, env=None):
    """Connects this worker to the job's servers and returns its Session (also the default one
    the modules of ferry.torch use).

    Where each setting comes from, first found wins: the argument; FERRY_SERVERS (endpoints,
    comma-separated), FERRY_RANK, FERRY_NUM_WORKERS, FERRY_CURVE_KEYS, FERRY_RESUME=1,
    FERRY_CHECKPOINT_EVERY and FERRY_INCARNATION (which start of the rank this process is: the
    servers give the rank to the highest), as ferry-launch sets them for a worker program; TF_CONFIG (a worker
    task). metrics ("HOST:PORT", "PORT"; port 0: a free one) or FERRY_METRICS: serve this worker's
    series for Prometheus there (see the module docstring). The timeouts are in seconds (ferry.Client's). ValueError if servers, rank or worker count cannot be found or are malformed;
    ferry.Error if a server does not answer within connect_timeout seconds."""
    global _default
    env = os.environ if env is None else env
    if isinstance(servers, str):
        servers = [s for s in servers.split(",") if s]
    if servers is None and env.get(ENV_SERVERS):
        servers = [s for s in env[ENV_SERVERS].split(",") if s]
    rank = _int_from(env, ENV_RANK, 0) if rank is None else rank
    num_workers = _int_from(env, ENV_NUM_WORKERS, 1) if num_workers is None else num_workers
    if servers is None or rank is None or num_workers is None:
        tf = ferry.cluster_from_tf_config(env["TF_CONFIG"]) if env.get("TF_CONFIG") else None
        if tf is not None:
            if tf["task_type"] == "ps":
                raise ValueError(f"TF_CONFIG: this task is ps {tf['task_index']}, not a worker")
            servers = tf["servers"] if servers is None else servers
            rank = tf["rank"] if rank is None else rank
            num_workers = tf["num_workers"] if num_workers is None else num_workers
    missing = [n for n, v in (("servers", servers), ("rank", rank), ("num_workers", num_workers)) if v is None]
    if missing:
        raise ValueError(f"ferry.torch.init: no {', '.join(missing)}: pass them, run under ferry-launch "
                         f"({ENV_SERVERS}, {ENV_RANK}, {ENV_NUM_WORKERS}) or set TF_CONFIG")
    if not servers:
        raise ValueError("ferry.torch.init: the server list is empty")
    if not 0 <= rank < num_workers:
        raise ValueError(f"ferry.torch.init: rank {rank} is not in [0, {num_workers})")
    curve_keys = curve_keys if curve_keys is not None else env.get(ENV_CURVE_KEYS)
    resume = env.get(ENV_RESUME) == "1"
    client = ferry.Client(list(servers), rank=rank, num_workers=num_workers, request_timeout=request_timeout,
                          connect_timeout=connect_timeout, curve_keys=curve_keys, heartbeat_timeout=heartbeat_timeout,
                          incarnation=_int_from(env, ENV_INCARNATION, 0) or 0, resumes=resume)
    every = _int_from(env, ENV_CHECKPOINT_EVERY, 0) or 0
    metrics = metrics if metrics is not None else env.get(ENV_METRICS)
    try:
        _default = Session(client, resume=resume, checkpoint_every=every, metrics=metrics)
    except Exception:
        client.close()
        raise
    return _default


def default_session():
    """The Session init() made; RuntimeError if there is none."""
    if _default is None:
        raise RuntimeError("ferry.torch: no session: call ferry.torch.init() first, or pass session=")
    return _default


def resolve(session):
    return default_session() if session is None else session
