"""A torch.nn.Module whose parameters live on Ferry's servers (the parameter-server strategy).

    mlp = ferry.torch.ServerParameters(torch.nn.Sequential(...), optimizer="adam", lr=1e-3)
    y = mlp(x)            # the parameters of this step are in place before the module runs
    loss.backward()       # at the end of backward: one push+pull round trip per server

Each parameter is a dense table named prefix + its name in the module (`0.weight`). The servers
hold the values and apply the optimizer; the worker holds no optimizer state, and no local
optimizer may step these parameters. At the end of a backward pass (an autograd callback) the
gradients of every parameter are pushed and the next step's values pulled in one
PushPullDense call (one message per server); the next forward waits for it and raises its
failure. A parameter that got no gradient pushes zeros (a sync step needs every worker's
gradient of every table).

Initial values: the servers' (init, init_scale, seed; per table and element, never per server,
so every worker and any server count read the same), copied into the module at the first
forward. The default, init="torch", declares each parameter with the distribution torch starts
it from: uniform of half-width 1/sqrt(fan_in) for Linear and Conv layers (fan_in: the product
of the dimensions after the first; for a bias, its weight's), 1 and 0 for a norm layer's 1-D
weight and bias; any other init ("zeros", "uniform", "normal", "constant" with init_scale) is
used as it is for every parameter.

Memory: on the CPU the client writes pulled values straight into the parameters and reads
gradients from the autograd's own .grad tensors (taken from the parameters at the end of
backward, so the user's zero_grad cannot touch them while they travel): no copy. On a GPU
both go through host buffers (one copy each way).

Thread-safety: one training loop at a time, as for EmbeddingBagCollection.
"""

import math
import time

import torch

from . import session as _session
from . import tables as _tables


def _fan_in(name, p, params):
    if p.dim() >= 2:
        return int(math.prod(p.shape[1:]))
    # A bias: the fan-in of the weight of the same module.
    w = params.get(_sibling(name, "weight"))
    if w is not None and w.dim() >= 2:
        return int(math.prod(w.shape[1:]))
    return max(1, p.numel())


def _sibling(name, leaf):
    """The name of parameter `leaf` of the module that holds parameter `name`."""
    return name.rsplit(".", 1)[0] + "." + leaf if "." in name else leaf


def _torch_init(name, p, params):
    """init="torch": (init, init_scale) of the distribution torch starts this parameter from: a
    norm layer's 1-D weight at 1 and its bias at 0; anything else, as Linear and Conv layers,
    uniform of half-width 1/sqrt(fan_in)."""
    if p.dim() == 1:
        weight = params.get(_sibling(name, "weight"))
        if name.endswith("weight"):
            return "constant", 1.0
        if weight is not None and weight.dim() == 1:
            return "zeros", 0.0
    return "uniform", 1.0 / math.sqrt(_fan_in(name, p, params))


class ServerParameters(torch.nn.Module):
    """Wraps `module`; its parameters become dense tables on the servers. Settings as
    EmbeddingBagConfig's (the names and defaults of ferry-trainer's --table): optimizer, lr,
    consistency, wire, init (default "torch", see the module docstring), init_scale, seed,
    **options. `prefix` (default "dense/") is put before each table name."""

    def __init__(self, module, *, session=None, prefix="dense/", optimizer="sgd", lr=0.1, consistency="sync",
                 wire="f32", init="torch", init_scale=0.0, seed=1, replicas_to_aggregate=0, **options):
        super().__init__()
        where = f"ServerParameters '{prefix}'"
        _tables.check_settings(where, optimizer, lr, consistency, wire, replicas_to_aggregate, options)
        self.module = module
        self._session = _session.resolve(session)
        self._client = self._session.client
        self.prefix, self.consistency = prefix, consistency
        named = dict(module.named_parameters())
        if not named:
            raise ValueError(f"{where}: the module has no parameters")
        self._names = list(named)
        self._params = [named[n] for n in self._names]
        for n, p in named.items():
            if p.dtype != torch.float32:
                raise TypeError(f"{where}: parameter '{n}' is {p.dtype}; Ferry's dense tables hold float32")
            t_init, scale = _torch_init(n, p, named) if init == "torch" else (init, init_scale)
            _tables.declare(self._client.declare_dense, f"parameter '{n}'", name=prefix + n,
                            shape=list(p.shape) or [1], optimizer=optimizer, lr=float(lr), consistency=consistency,
                            init=t_init, init_scale=float(scale), seed=int(seed),
                            replicas_to_aggregate=int(replicas_to_aggregate),
                            options={k: float(v) for k, v in options.items()}, wire=wire)
        self.own_steps = _tables.kind_of(consistency) != "sync"  # async, ssp: this worker's steps
        self._steps = _tables.Steps(self._session._resume_step(self.own_steps))
        self._exchange = None   # (handle, tag) of the push+pull in flight (the handle keeps its arrays)
        self._pulled = False    # the module holds the values of a pull
        self._queued = False    # the end-of-backward callback is queued for this backward
        # Host buffers of the parameters the client cannot use in place (on a GPU, or not
        # contiguous); None for the others.
        self._staging = [None if p.device.type == "cpu" and p.is_contiguous()
                         else torch.empty(p.shape, dtype=torch.float32) for p in self._params]
        self._grad_accs = []
        # Seconds spent sending push+pulls (exchange_send_s) and waiting for pulls and push+pulls
        # (exchange_wait_s).
        self.stats = {"exchange_send_s": 0.0, "exchange_wait_s": 0.0}
        with torch.enable_grad():  # the graph node exists under no_grad() too
            for p in self._params:
                if p.requires_grad:
                    acc = p.expand_as(p).grad_fn.next_functions[0][0]  # the parameter's AccumulateGrad
                    acc.register_hook(self._on_grad)
                    self._grad_accs.append(acc)
        if self._session.resume:
            # A restarted worker: its ssp clock where the job resumed, and the sync step the job
            # is at (the first pull's, which may be past the checkpoint's).
            if self.consistency.startswith("ssp:"):
                self._client.advance_clock(self._steps.clock, wait=True)
            self._pull()
        self.joined_at = self._steps.want  # the step this worker's first training forward reads
        self._session._attach(self)

    @property
    def step(self):
        """The step the next pull reads (sync: the global step it asks for)."""
        return self._steps.want

    def _host(self, i):
        """Where the client reads and writes parameter i: the parameter itself, or its host
        buffer."""
        h = self._staging[i]
        return self._params[i].data if h is None else h

    def _copy_in(self):
        """Copies what was pulled into host buffers to their parameters."""
        with torch.no_grad():
            for p, h in zip(self._params, self._staging):
                if h is not None:
                    p.copy_(h)

    def _pull(self):
        want = self._steps.want
        h = self._client.pull_dense_tables([(self.prefix + n, self._host(i).numpy()) for i, n in enumerate(self._names)],
                                           want)
        h.wait()
        if self.consistency == "sync" and h.version > want:
            self._steps.want = self._steps.clock = h.version
        self._copy_in()
        self._pulled = True

    def _settle(self):
        """Waits for the push+pull in flight; raises its failure (the module then pulls again)."""
        if self._exchange is None:
            return
        h, tag = self._exchange
        self._exchange = None
        try:
            h.wait()
        except Exception:
            self._pulled = False
            raise
        self._steps.pushed(tag)
        if self.consistency == "sync" and h.version >= 0:
            self._steps.want = max(self._steps.want, h.version)
        self._copy_in()

    def forward(self, *args, **kwargs):
        if self._queued:
            # The last backward raised before its end, so its callback never ran (autograd drops
            # it): what it accumulated is not a step's gradient.
            self._queued = False
            for p in self._params:
                p.grad = None
        t0 = time.perf_counter()
        self._settle()
        if not self._pulled:
            self._pull()
        self.stats["exchange_wait_s"] += time.perf_counter() - t0
        return self.module(*args, **kwargs)

    def _on_grad(self, *unused):
        # A parameter's gradient is in; at the end of this backward pass, push them all.
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self):
        self._queued = False
        t0 = time.perf_counter()
        if self._exchange is not None:
            raise RuntimeError("ferry.torch: a second backward before the next forward of ServerParameters "
                               f"'{self.prefix}': its gradients of this step were pushed already")
        entries = []
        for i, (n, p) in enumerate(zip(self._names, self._params)):
            g = p.grad
            p.grad = None  # taken: the push reads it while the caller goes on
            if g is None:
                g = torch.zeros(p.shape, dtype=torch.float32)
            else:
                g = g.detach().to("cpu", torch.float32).contiguous()
            entries.append((self.prefix + n, g.numpy(), self._host(i).numpy()))
        tag = self._steps.want if self.consistency != "ssp" else self._steps.clock
        h = self._client.push_pull_dense_tables(entries, tag)
        self._exchange = (h, tag)
        self.stats["exchange_send_s"] += time.perf_counter() - t0

    def state_dict(self, *args, **kwargs):
        """The module's state once the push+pull in flight has written the next values (the
        client writes them into the parameters after backward, until the next forward)."""
        self.flush()
        return super().state_dict(*args, **kwargs)

    def flush(self, raise_errors=True):
        """Waits for the push+pull in flight; raises its failure."""
        try:
            self._settle()
        except Exception:
            if raise_errors:
                raise
