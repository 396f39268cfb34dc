"""Sharded embedding bags: Ferry's sparse tables behind a torch.nn.Module.

    ebc = ferry.torch.EmbeddingBagCollection([
        ferry.torch.EmbeddingBagConfig("user", 16, optimizer="adagrad", lr=0.05),
        ferry.torch.EmbeddingBagConfig("item", 16, pooling="mean"),
    ])
    pooled = ebc({"user": (ids, offsets), "item": item_ids_2d})   # {"user": [B, 16], ...}
    loss(pooled, ...).backward()       # pushes every table's row gradients; the servers update

Forward takes each table's bags in nn.EmbeddingBag's layout: `(ids, offsets)` (1-D ids,
offsets[b] where bag b starts), `(ids, offsets, per_sample_weights)` (sum pooling only), a
`Bags`, or a 2-D ids tensor [B, L] (B bags of L ids). One C++ call (ferry._ferry.Bags) checks
every table's bags and deduplicates each table's ids; the rows of every table are pulled in one
message per server (sync and async tables together; ssp tables in one more) into one buffer per
table, and one C++ call pools them all, so the result is nn.EmbeddingBag's on the same rows.
Backward (one autograd.Function for all the tables) turns the pooled gradients into the rows'
gradients, summed per distinct id, in one C++ call, and pushes every table's the same way,
tagged with the step the pull was served at. No optimizer state lives on the worker: the servers
apply each table's optimizer.

A push is sent, not waited for: the next forward (or flush()) waits for it and raises its
failure. A sync table missing from a forward's features is pulled and pushed with no ids (its
servers close each step with every worker's gradient); other missing tables are left out.

Memory: pulled rows are written by the client straight into the buffers the pooling reads, the
pooled tensors share memory with the arrays the C++ pooling wrote (torch.from_numpy), and
gradients are read from autograd's own tensors (CPU, float32): no copy on the worker beyond the
wire's. ids on a GPU are copied to the host once; pooling runs on the host and its result is
copied to the ids' device.

Thread-safety: a module is used by one training loop at a time (autograd may run its backward
on another thread; the client is thread-safe).
"""

import collections
import functools
import time
import typing

import numpy as np
import torch

from .. import _ferry
from . import session as _session
from . import tables as _tables


class EmbeddingBagConfig:
    """One sparse table: `name`, row width `dim`, `pooling` ("sum" or "mean"), and its server
    settings with the names and defaults of ferry-trainer's --table (see ferry.torch.tables):
    optimizer, lr, consistency, wire, init ("uniform", "normal", "zeros", "constant") with
    init_scale, seed, skip_nonfinite_rows, replicas_to_aggregate (sync: the quorum, for backup
    workers; 0: every worker), and **options (momentum, beta1, ..., admit_after, max_rows, ...).
    Initial rows depend on (seed, table, id) only: the same on any server count."""

    def __init__(self, name, dim, *, pooling="sum", optimizer="sgd", lr=0.1, consistency="sync", wire="f32",
                 init="uniform", init_scale=0.05, seed=1, skip_nonfinite_rows=False, replicas_to_aggregate=0,
                 **options):
        where = f"table '{name}'"
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: the name must be a non-empty str")
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"{where}: dim must be an int >= 1, not {dim!r}")
        if pooling not in ("sum", "mean"):
            raise ValueError(f"{where}: pooling '{pooling}' is not sum or mean")
        _tables.check_settings(where, optimizer, lr, consistency, wire, replicas_to_aggregate, options)
        self.name, self.dim, self.pooling = name, dim, pooling
        self.replicas_to_aggregate = int(replicas_to_aggregate)
        self.optimizer, self.lr, self.consistency, self.wire = optimizer, float(lr), consistency, wire
        self.init, self.init_scale, self.seed = init, float(init_scale), int(seed)
        self.skip_nonfinite_rows = bool(skip_nonfinite_rows)
        self.options = {k: float(v) for k, v in options.items()}

    @property
    def kind(self):
        return _tables.kind_of(self.consistency)

    def __repr__(self):
        return (f"EmbeddingBagConfig({self.name!r}, {self.dim}, pooling={self.pooling!r}, optimizer={self.optimizer!r}, "
                f"lr={self.lr}, consistency={self.consistency!r})")


class Bags(typing.NamedTuple):
    """One table's bags: 1-D ids, offsets (bag b is ids[offsets[b]:offsets[b+1]]), and
    optional per-sample weights (sum pooling)."""
    ids: torch.Tensor
    offsets: torch.Tensor
    weights: typing.Optional[torch.Tensor] = None


class _Table:
    """One table's part of a forward: its bags on the host (ids, offsets, weights; numpy) and the
    device the pooled result goes to; `given` is False for a sync table the forward left out (it
    takes part with no ids)."""
    __slots__ = ("config", "server_name", "ids", "offsets", "weights", "device", "given")

    def __init__(self, config, server_name, given):
        self.config, self.server_name, self.given = config, server_name, given
        self.ids, self.offsets, self.weights = _NO_IDS, _NO_IDS, None
        self.device = _CPU


class _Batch:
    """The bags of every table of one forward, checked and deduplicated in one C++ call: each
    table's distinct ids (`unique`) and the row buffer a pull writes (`rows`); pool() and
    row_gradients() are one C++ call each for all the tables."""
    __slots__ = ("tables", "bags", "unique")

    def __init__(self, tables):
        self.tables = tables
        self.bags = _ferry.Bags([(t.config.name, t.ids, t.offsets, t.weights, t.config.dim, t.config.pooling == "mean")
                                 for t in tables])
        self.unique = self.bags.distinct()


_NO_IDS = np.empty(0, dtype=np.int64)
_CPU = torch.device("cpu")


@functools.lru_cache(maxsize=64)
def _fixed_offsets(bags, per):
    """The offsets of `bags` bags of `per` ids each (shared: never written)."""
    out = np.arange(0, bags * per, per, dtype=np.int64) if per > 0 else np.zeros(bags, dtype=np.int64)
    out.flags.writeable = False
    return out


def _int_tensor(x, where, what):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: {what} must be a torch.Tensor, not {type(x).__name__}")
    if x.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}: {what} must be int64 (or int32), not {x.dtype}")
    return x


def _host(x):
    """A tensor's values on the host as numpy (its own memory when it is there already)."""
    return (x if x.device.type == "cpu" else x.cpu()).numpy()


def _prepare(config, server_name, value):
    """Checks one table's bags' types and shapes (TypeError / ValueError naming the table) and
    puts them on the host; their values are checked by _Batch (ValueError naming the table)."""
    where = f"table '{config.name}'"
    t = _Table(config, server_name, True)
    if isinstance(value, torch.Tensor):
        ids = _int_tensor(value, where, "ids")
        if ids.dim() != 2:
            raise ValueError(f"{where}: ids without offsets must be 2-D [bags, ids per bag], not {tuple(ids.shape)}")
        t.device = ids.device
        t.offsets = _fixed_offsets(*ids.shape)
        t.ids = _host(ids).reshape(-1)
        return t
    if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
        raise TypeError(f"{where}: want (ids, offsets), (ids, offsets, per_sample_weights), Bags or 2-D ids, "
                        f"not {type(value).__name__}")
    ids = _int_tensor(value[0], where, "ids")
    offsets = _int_tensor(value[1], where, "offsets")
    weights = value[2] if len(value) == 3 else None
    if ids.dim() != 1:
        raise ValueError(f"{where}: ids with offsets must be 1-D, not {tuple(ids.shape)}")
    if offsets.dim() != 1:
        raise ValueError(f"{where}: offsets must be 1-D, not {tuple(offsets.shape)}")
    t.device = ids.device
    t.ids, t.offsets = _host(ids), _host(offsets)
    if weights is not None:
        if config.pooling != "sum":
            raise ValueError(f"{where}: per-sample weights need sum pooling, not {config.pooling}")
        if not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
            raise TypeError(f"{where}: per_sample_weights must be a floating-point torch.Tensor")
        n = ids.numel()
        if tuple(weights.shape) != (n,):
            raise ValueError(f"{where}: per_sample_weights has shape {tuple(weights.shape)}, want ({n},) like the "
                             "ids")
        if weights.requires_grad:
            raise ValueError(f"{where}: per_sample_weights require a gradient, which ferry.torch does not compute: "
                             "pass weights.detach()")
        t.weights = _host(weights.to(torch.float32))
    return t


def _snapshot(value):
    """One table's bags as prefetch() saw them: each tensor with its in-place version counter."""
    if isinstance(value, torch.Tensor):
        return (value, value._version)
    if isinstance(value, (tuple, list)):
        return tuple(_snapshot(v) for v in value)
    return value


def _same_bags(seen, value):
    """Whether a table's bags hold what prefetch() saw (`seen`, a _snapshot): the same tensor
    not written since, or an equal one."""
    if isinstance(value, torch.Tensor):
        if not (isinstance(seen, tuple) and len(seen) == 2 and isinstance(seen[0], torch.Tensor)):
            return False
        t, version = seen
        if t is value:
            return t._version == version
        return t.dtype == value.dtype and t.shape == value.shape and t.device == value.device and torch.equal(t, value)
    if value is None:
        return seen is None
    if not isinstance(value, (tuple, list)) or not isinstance(seen, tuple) or len(seen) != len(value):
        return False
    return all(_same_bags(a, b) for a, b in zip(seen, value))


class _Pull:
    """The rows of one forward's batch, in flight, written into the batch's row buffers: one call
    for the sync tables at the global step `want`, one for the async and ssp tables at this
    worker's `clock` (the step is the ssp clock; async tables ignore it). After the wait, `served`
    is the step the sync tables were served at; after the backward, `pushed`."""

    def __init__(self, module, batch, want, clock):
        self.batch = batch
        self.want, self.clock = want, clock
        self.handles = []
        self.served = want
        self.pushed = False
        self.features = {}  # prefetch(): the features it was read ahead for
        entries = {True: [], False: []}
        for t, unique, rows in zip(batch.tables, batch.unique, batch.bags.rows()):
            entries[t.config.kind == "sync"].append((t.server_name, unique, rows))
        for sync, step in ((True, want), (False, clock)):
            if entries[sync]:
                self.handles.append((sync, step, module._client.pull_sparse_tables(entries[sync], step, distinct=True)))

    def reads(self, batch):
        """Whether this pull reads the rows `batch` needs: the same distinct ids of the same tables."""
        mine = self.batch
        return len(mine.tables) == len(batch.tables) and all(
            a.server_name == b.server_name and np.array_equal(x, y)
            for a, b, x, y in zip(mine.tables, batch.tables, mine.unique, batch.unique))

    def done(self):
        return all(h.done() for _, _, h in self.handles)

    def wait(self):
        """Waits for every call; raises the first failure."""
        for sync, step, h in self.handles:
            h.wait()
            if sync:
                self.served = h.version if h.version >= 0 else step


class _Pool(torch.autograd.Function):
    """Forward: every table's bags pooled from a pull's rows (one C++ call), one output per table.
    Backward: the row gradients of the tables whose output the loss reached (a gradient that is
    not None) in one C++ call, pushed in one call per step group."""

    @staticmethod
    def forward(ctx, anchor, module, pull):
        ctx.set_materialize_grads(False)  # an output the loss did not reach gets None, not zeros
        ctx.module, ctx.pull = module, pull
        return tuple(torch.from_numpy(a) for a in pull.batch.bags.pool())

    @staticmethod
    def backward(ctx, *grads):
        ctx.module._push(ctx.pull, grads)
        return (None, None, None)


class EmbeddingBagCollection(torch.nn.Module):
    """Named sparse tables on Ferry's servers, pooled like nn.EmbeddingBag. See the module
    docstring. `tables`: EmbeddingBagConfigs; `prefix` is put before each table's name on the
    servers; `session`: a ferry.torch.Session (default: the one init() made)."""

    def __init__(self, tables, *, session=None, prefix=""):
        super().__init__()
        self._session = _session.resolve(session)
        self._client = self._session.client
        self.configs = collections.OrderedDict()
        for c in tables:
            if not isinstance(c, EmbeddingBagConfig):
                raise TypeError(f"tables must be EmbeddingBagConfigs, not {type(c).__name__}")
            if c.name in self.configs:
                raise ValueError(f"table '{c.name}' is given twice")
            self.configs[c.name] = c
        if not self.configs:
            raise ValueError("an EmbeddingBagCollection needs at least one table")
        self.prefix = prefix
        self._has_ssp = any(c.kind == "ssp" for c in self.configs.values())
        for c in self.configs.values():
            _tables.declare(self._client.declare_sparse, f"table '{c.name}'", name=prefix + c.name,
                            dim=c.dim, optimizer=c.optimizer, lr=c.lr, consistency=c.consistency, init=c.init,
                            init_scale=c.init_scale, seed=c.seed, skip_nonfinite_rows=c.skip_nonfinite_rows,
                            wire=c.wire, replicas_to_aggregate=c.replicas_to_aggregate, options=c.options)
        self.own_steps = all(c.kind != "sync" for c in self.configs.values())  # async, ssp: its own
        self._steps = _tables.Steps(self._session._resume_step(self.own_steps))
        self._anchor = torch.zeros((), requires_grad=True)  # lets autograd reach _Pool.backward
        self._pushes = []      # (handle, sync step it was tagged with or None) not yet waited for
        self._pending = None   # the pull of the training forward whose backward has not pushed
        self._ahead = collections.deque()  # pulls issued by prefetch(), oldest first
        self._dropped = []     # pulls no forward took: kept until done (their buffers are written)
        # Forwards that pulled, that took rows read ahead, pulls read ahead and not taken; seconds
        # spent sending and waiting for pulls (pull_s), sending pushes (push_send_s), and waiting
        # for pushes sent earlier (push_wait_s).
        self.stats = {"pulls": 0, "pulls_taken_ahead": 0, "pulls_ahead_dropped": 0, "pull_s": 0.0,
                      "push_send_s": 0.0, "push_wait_s": 0.0}
        if self._session.resume:
            self._join()
        self.joined_at = self._steps.want  # the step this worker's first training forward reads
        self._session._attach(self)

    def _join(self):
        """A worker the launcher restarted joins the job where it is: the sync tables' global
        step (a pull with no ids, served at the step the servers are at, which may be past the
        checkpoint's if this worker died alone), and its ssp clock there."""
        if self._has_ssp:
            self._client.advance_clock(self._steps.clock, wait=True)
        sync = [(self.prefix + n, _NO_IDS, np.empty((0, c.dim), np.float32))
                for n, c in self.configs.items() if c.kind == "sync"]
        if sync:
            h = self._client.pull_sparse_tables(sync, self._steps.want, distinct=True)
            h.wait()
            if h.version > self._steps.want:
                self._steps.want = self._steps.clock = h.version

    @property
    def step(self):
        """The step this worker's next training forward reads: the global step of the sync
        tables (where the job is, for a worker that joined late), else this worker's count of
        steps pushed (the ssp clock)."""
        return self._steps.want

    def server_name(self, table):
        return self.prefix + table

    def _prepare_all(self, features):
        """Checks every table's bags (before anything is sent) and deduplicates them: a _Batch. A
        sync table not given takes part with no ids, another is left out."""
        if not isinstance(features, collections.abc.Mapping):
            raise TypeError(f"features must be a mapping from table name to bags, not {type(features).__name__}")
        unknown = [k for k in features if k not in self.configs]
        if unknown:
            raise ValueError(f"table '{unknown[0]}' is not in this collection (its tables: {', '.join(self.configs)})")
        tables = []
        for name, c in self.configs.items():
            if name in features:
                tables.append(_prepare(c, self.prefix + name, features[name]))
            elif c.kind == "sync":
                tables.append(_Table(c, self.prefix + name, False))
        return _Batch(tables)

    def _settle(self):
        """Waits for the pushes sent; raises the first failure (after waiting for all). A sync
        push that failed is this worker's step again: the next forward reads that step (the
        servers that applied it serve the next one and drop the repeated push as late; one that
        refused it still waits for it), so one failed step does not stop the job."""
        pushes, self._pushes = self._pushes, []
        t0 = time.perf_counter()
        first = None
        for h, tag in pushes:
            try:
                h.wait()
            except Exception as e:  # noqa: BLE001 — the first is raised below
                first = first or e
                if tag is not None and tag < self._steps.want:
                    self._steps.want = tag
        self._dropped = [p for p in self._dropped if not p.done()]
        self.stats["push_wait_s"] += time.perf_counter() - t0
        if first is not None:
            self._drop_ahead()
            raise first

    def _drop_ahead(self):
        """Rows read ahead that no forward will take: kept until done (the client writes them)."""
        self.stats["pulls_ahead_dropped"] += len(self._ahead)
        self._dropped.extend(self._ahead)
        self._ahead.clear()

    def _next_ask(self):
        """(want, clock) of the next pull issued: past the step a training forward pulled and
        has not pushed yet, and past the pulls already read ahead."""
        later = len(self._ahead) + (1 if self._pending is not None else 0)
        return self._steps.want + later, self._steps.clock + later

    def prefetch(self, features):
        """Starts the pull of a later training forward's rows now: the forward after those
        already pulled or read ahead. A training forward takes it if it reads the same distinct
        ids of the same tables at the same step; otherwise it pulls (see _take_ahead). Sync
        tables: the servers answer it once the step before has closed, so the rows are a pull's
        in its place. Async and ssp tables: they lack this worker's updates sent after the call
        (one step of staleness)."""
        batch = self._prepare_all(features)
        want, clock = self._next_ask()
        pull = _Pull(self, batch, want, clock)
        pull.features = {k: _snapshot(v) for k, v in features.items()}  # to skip preparing them again
        self._ahead.append(pull)

    def _prepared_ahead(self, features):
        """The batch prefetch() prepared, when the oldest read ahead was for these very features
        (the same tables, and ids, offsets and weights equal to what it saw, or the same tensors
        not written in place since): checking them is cheaper than preparing them again."""
        if not self._ahead or not isinstance(features, collections.abc.Mapping):
            return None
        mine = self._ahead[0].features
        if mine.keys() != features.keys() or not all(_same_bags(mine[k], features[k]) for k in mine):
            return None
        return self._ahead[0].batch

    def _take_ahead(self, batch):
        """The pull read ahead for this forward's rows, if it asked for this step. Pulls read
        ahead for batches before it (never forwarded) are dropped; so is its own if it asked for
        another step (a forward whose backward never came shifts the steps by one); those after
        it stay for their forwards."""
        for i, pull in enumerate(self._ahead):
            if not pull.reads(batch):
                continue
            for _ in range(i + 1):
                self._dropped.append(self._ahead.popleft())
            if (pull.want, pull.clock) != (self._steps.want, self._steps.clock):
                self.stats["pulls_ahead_dropped"] += i + 1
                return None
            self._dropped.pop()
            self.stats["pulls_ahead_dropped"] += i
            self.stats["pulls_taken_ahead"] += 1
            if batch is not pull.batch:  # this forward's bags: the same distinct ids, so the same rows
                batch.bags.take_rows(pull.batch.bags)
                pull.batch = batch
            return pull
        return None

    def forward(self, features):
        """features: {table: bags}; returns {table: pooled [bags, dim]} for the tables given.
        With gradients enabled it is a training step's forward: its backward pushes. Under
        torch.no_grad() it only reads (evaluation), at the step the next training forward
        reads, and leaves rows read ahead alone."""
        train = torch.is_grad_enabled()
        batch = (self._prepared_ahead(features) if train else None) or self._prepare_all(features)
        t0 = time.perf_counter()
        if train and self._pending is not None:
            self._pending = None  # a training forward whose backward never came: superseded
        pull = self._take_ahead(batch) if train else None
        if pull is None:
            self.stats["pulls"] += 1
            pull = _Pull(self, batch, self._steps.want, self._steps.clock)
        try:
            self._settle()  # after the pull went: a push's reply and the rows travel together
            pull.wait()
        except Exception:
            self._dropped.append(pull)
            raise
        self.stats["pull_s"] += time.perf_counter() - t0
        if train and pull.served != pull.want:
            # The job is at another step (this worker joined late, or its step closed without
            # it): rows read ahead asked for steps after the wrong one.
            self._drop_ahead()
        if train:
            self._pending = pull
            pooled = _Pool.apply(self._anchor, self, pull)
        else:
            pooled = [torch.from_numpy(a) for a in batch.bags.pool()]
        return {t.config.name: (p.to(t.device) if t.device.type != "cpu" else p)
                for t, p in zip(batch.tables, pooled) if t.given}

    def _push(self, pull, grads):
        """Backward: every table's row gradients in one call per step group, tagged with the step
        the pull was served at (sync), its clock (ssp). A table the loss did not reach (its grad
        is None) sends no ids (a sync table must send, even nothing: its step closes with every
        worker's)."""
        if pull.pushed:
            raise RuntimeError("ferry.torch: backward ran twice through one forward of an EmbeddingBagCollection; "
                               "its gradients were pushed once already (the servers refuse a second push of a step)")
        if pull is not self._pending:
            raise RuntimeError("ferry.torch: backward through an EmbeddingBagCollection forward that a later training "
                               "forward superseded: run one backward per training forward, in order")
        pull.pushed = True
        self._pending = None
        t0 = time.perf_counter()
        batch = pull.batch
        # A gradient is read in place where its rows are contiguous (a column block of the
        # gradient of a concatenation of the pooled outputs is).
        rows = batch.bags.row_gradients([None if g is None else g.detach().to(_CPU, torch.float32).numpy()
                                         for g in grads])
        entries = {True: [], False: []}
        for t, unique, grad in zip(batch.tables, batch.unique, rows):
            sync = t.config.kind == "sync"
            if grad is not None:
                entries[sync].append((t.server_name, unique, grad))
            elif sync:
                entries[True].append((t.server_name, _NO_IDS, np.empty((0, t.config.dim), np.float32)))
        if entries[True]:
            self._pushes.append((self._client.push_sparse_tables(entries[True], pull.served, distinct=True),
                                 pull.served))
        if entries[False]:
            self._pushes.append((self._client.push_sparse_tables(entries[False], pull.clock, distinct=True), None))
        if self._has_ssp:
            self._pushes.append((self._client.advance_clock(pull.clock + 1, wait=False), None))
        self._steps.pushed(pull.served)
        self.stats["push_send_s"] += time.perf_counter() - t0

    def flush(self, raise_errors=True):
        """Waits for the pushes sent; raises the first failure. Rows read ahead stay for the
        forwards they are for (a sync step's rows come only once every worker pushed the step
        before: waiting for them here could wait for steps nobody will take); they end with the
        client (closing it cancels what is in flight)."""
        try:
            self._settle()
        except Exception:
            if raise_errors:
                raise
