#!/usr/bin/python3
"""A small DLRM on Ferry's tables: a bottom MLP over the dense features, one embedding bag per
categorical field, pairwise dot-product interaction, a top MLP, sigmoid cross-entropy.

    # 2 servers x 2 workers, everything on the servers (sync), planted CTR data:
    launch/ferry-launch --num-ps 2 --num-workers 2 -- /usr/bin/python3 examples/dlrm.py --steps 600
    # the hybrid PERSIA uses: embeddings on Ferry, dense layers on the workers under DDP (gloo)
    launch/ferry-launch --num-ps 2 --num-workers 2 -- /usr/bin/python3 examples/dlrm.py --mode hybrid
    # Criteo files, streamed and sharded per worker
    launch/ferry-launch --num-ps 2 --num-workers 2 -- /usr/bin/python3 examples/dlrm.py \\
        --criteo-train 'train/day_*.gz' --criteo-test test/day_23.gz --test-limit 100000 --steps 20000
    # one process, no servers: the same model with local nn.EmbeddingBag tables (the baseline)
    /usr/bin/python3 examples/dlrm.py --mode local

Modes: `ps` (default): embeddings (EmbeddingBagCollection) and the MLPs (one ServerParameters:
one push+pull round trip a step) on the servers, which apply the optimizers. `hybrid`: embeddings on the servers, the MLPs on each
worker under DistributedDataParallel with a local optimizer of the same kind. `local`: no
servers, torch's own EmbeddingBag and optimizer.

Checkpoints: under `ferry-launch --checkpoint-dir D --checkpoint-every N` worker 0 has the
servers save every N steps and at the end (in hybrid mode it also saves the MLPs and their
optimizer in --dense-dir); a restarted job (FERRY_RESUME) continues from the step the job is at
(the restored checkpoint's, or the servers' own for a worker restarted alone), skipping the
data before it: a sync job resumed gives the results of the uninterrupted one. Prints `[worker R] step T/TOTAL ...` lines (the launcher
follows them), and at the end `final: auc A planted_auc P logloss L` (worker 0) with
--metrics-out's JSON lines.
"""

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("ps", "hybrid", "local"), default="ps")
    ap.add_argument("--arch", choices=("dlrm", "ctr"), default="dlrm",
                    help="ctr: ferry-trainer --model ctr's model instead (the pooled embeddings and the dense "
                         "features into one MLP, --top), to compare the two paths")
    ap.add_argument("--steps", type=int, default=1000, help="training steps (the job's, in sync mode)")
    ap.add_argument("--batch", type=int, default=512, help="examples per worker per step")
    ap.add_argument("--emb-dim", type=int, default=16)
    ap.add_argument("--bottom", default="64,16", help="bottom MLP widths; the last must be --emb-dim")
    ap.add_argument("--top", default="64,32", help="top MLP hidden widths (then 1 output)")
    ap.add_argument("--optimizer", choices=("sgd", "adagrad", "adam"), default="adam")
    ap.add_argument("--lr", type=float, default=0.002, help="the embeddings' learning rate")
    ap.add_argument("--dense-lr", type=float, default=0.002, help="the MLPs' learning rate")
    ap.add_argument("--consistency", default="sync", help="sync, async or ssp:S (ps and hybrid modes)")
    ap.add_argument("--prefetch", action="store_true", help="pull the next batch's rows during a step")
    ap.add_argument("--seed", type=int, default=1, help="initial values")
    # Data: synthetic planted CTR (ferry-trainer --model ctr's flags and defaults) or Criteo.
    ap.add_argument("--ctr-fields", type=int, default=8)
    ap.add_argument("--ctr-vocab", type=int, default=1000)
    ap.add_argument("--ctr-dense", type=int, default=4)
    ap.add_argument("--ctr-train", type=int, default=1000000)
    ap.add_argument("--ctr-test", type=int, default=20000)
    ap.add_argument("--ctr-zipf", type=float, default=1.1)
    ap.add_argument("--data-seed", type=int, default=1)
    ap.add_argument("--criteo-train", help="Criteo TSV files or globs, comma-separated (plain or gzipped)")
    ap.add_argument("--criteo-test", help="Criteo TSV files held for evaluation")
    ap.add_argument("--test-limit", type=int, default=100000, help="test examples kept, at most")
    ap.add_argument("--hash-buckets", type=int, default=0, help="Criteo: ids per field (0: 63-bit ids)")
    ap.add_argument("--eval-every", type=int, default=0, help="evaluate every N steps (0: at the end)")
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--metrics-out", help="JSON lines: start, train, eval and end records with the time split "
                                          "({rank} is replaced by the worker's rank)")
    ap.add_argument("--dense-dir", help="hybrid mode: where worker 0 saves the MLPs at each checkpoint (needed "
                                        "with ferry-launch --checkpoint-every)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    ap.add_argument("--device", default="cpu",
                    help="where the model computes: cpu, cuda or cuda:N (the batches are moved there; the servers' "
                         "rows and parameters travel through the host)")
    args = ap.parse_args(argv)
    try:
        args.device = torch.device(args.device)
    except RuntimeError as e:
        ap.error(f"--device {args.device}: {e}")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA GPU here (torch.cuda.is_available() is False)")
    if int(args.bottom.split(",")[-1]) != args.emb_dim:
        ap.error(f"--bottom {args.bottom}: its last width must be --emb-dim {args.emb_dim} (the dot interaction)")
    return args


def mlp(widths, last_activation):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2 or last_activation:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class Interaction(torch.nn.Module):
    """DLRM's dot interaction: the pairwise dot products of the bottom MLP's output and every
    field's pooled embedding (the strict upper triangle), beside the bottom output."""

    def forward(self, bottom, pooled):
        z = torch.stack([bottom] + pooled, dim=1)               # [B, F + 1, E]
        dots = torch.bmm(z, z.transpose(1, 2))                   # [B, F + 1, F + 1]
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1)
        return torch.cat([bottom, dots[:, i, j]], dim=1)


class Tower(torch.nn.Module):
    """The dense part: the bottom MLP over the dense features, the dot interaction with the
    pooled embeddings, the top MLP. Without a bottom MLP (--arch ctr) the pooled embeddings and
    the dense features go into the top MLP side by side, as ferry-trainer's ctr model does. One
    module, so that on the servers (ServerParameters) it costs one push+pull round trip a step."""

    def __init__(self, bottom, top):
        super().__init__()
        self.bottom, self.top = bottom, top
        self.interaction = Interaction()

    def forward(self, dense, pooled):
        if self.bottom is None:
            x = torch.cat(pooled + [dense], dim=1)
        else:
            x = self.interaction(self.bottom(dense), pooled)
        return self.top(x).squeeze(1)


class DLRM(torch.nn.Module):
    """`embeddings(features)` returns {field name: [B, E]}; `tower` is a Tower (maybe wrapped in
    ServerParameters or DistributedDataParallel)."""

    def __init__(self, embeddings, tower, fields):
        super().__init__()
        self.embeddings, self.tower, self.fields = embeddings, tower, fields

    def forward(self, dense, features):
        pooled = self.embeddings(features)
        return self.tower(dense, [pooled[f] for f in self.fields])


class LocalBags(torch.nn.Module):
    """The baseline: one nn.EmbeddingBag per field, with the servers' initial distribution
    (uniform +-0.05)."""

    def __init__(self, fields, vocab, dim):
        super().__init__()
        self.bags = torch.nn.ModuleDict({f: torch.nn.EmbeddingBag(vocab, dim, mode="sum") for f in fields})
        for b in self.bags.values():
            torch.nn.init.uniform_(b.weight, -0.05, 0.05)

    def forward(self, features):
        return {f: self.bags[f](ids) for f, ids in features.items()}


def features_of(batch, fields):
    """One id per field per example: field f's bags are the column ids[:, f] as [B, 1]."""
    ids = batch["ids"]
    return {f: ids[:, i:i + 1] for i, f in enumerate(fields)}


def dense_widths(args, num_dense, fields):
    """The bottom MLP's widths (None for --arch ctr) and the top MLP's."""
    hidden = [int(w) for w in args.top.split(",")]
    if args.arch == "ctr":
        return None, [len(fields) * args.emb_dim + num_dense] + hidden + [1]
    n = len(fields) + 1
    return [num_dense] + [int(w) for w in args.bottom.split(",")], [args.emb_dim + n * (n - 1) // 2] + hidden + [1]


def make_tower(bottom_widths, top_widths):
    return Tower(None if bottom_widths is None else mlp(bottom_widths, True), mlp(top_widths, False))


def to_device(batch, device):
    """A batch's tensors on `device` (the same dict on the CPU)."""
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def evaluate(model, test, device, batch=4096):
    """(auc, logloss) of the model on the test tensors."""
    from ferry import _data
    model.eval()
    probs = []
    with torch.no_grad():
        for lo in range(0, test["labels"].numel(), batch):
            part = to_device({k: v[lo:lo + batch] for k, v in test.items()}, device)
            probs.append(torch.sigmoid(model(part["dense"], features_of(part, model.fields))).cpu())
    model.train()
    p = torch.cat(probs).numpy()
    labels = test["labels"].numpy()
    return _data.auc(p, labels), _data.log_loss(p, labels)


class Clock:
    """The step's time split: pull (waiting for rows and parameters), push (sending gradients and
    waiting for pushes sent before), compute (the rest of the step)."""

    def __init__(self, modules):
        self.modules = modules
        self.marks = self.read()

    def read(self):
        pull = push = 0.0
        for m in self.modules:
            s = getattr(m, "stats", None) or {}
            pull += s.get("pull_s", 0.0) + s.get("exchange_wait_s", 0.0)
            push += s.get("push_send_s", 0.0) + s.get("push_wait_s", 0.0) + s.get("exchange_send_s", 0.0)
        return pull, push

    def lap(self, wall):
        pull, push = self.read()
        d = (pull - self.marks[0], push - self.marks[1])
        self.marks = (pull, push)
        return {"pull_s": d[0], "push_s": d[1], "compute_s": wall - d[0] - d[1]}


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import ferry.torch as ft
    from ferry.torch import data as fdata

    session = None
    rank, workers = 0, 1
    if args.mode != "local":
        session = ft.init()
        rank, workers = session.rank, session.num_workers
    torch.manual_seed(args.seed)

    # Data: this worker's shard, in batches.
    if args.criteo_train:
        train = fdata.CriteoDataset(args.criteo_train, args.batch, shard_index=rank, num_shards=workers,
                                    hash_buckets=args.hash_buckets, steps=args.steps)
        test = None
        if args.criteo_test:  # held in memory: the first --test-limit examples, in one batch
            test = next(iter(fdata.CriteoDataset(args.criteo_test, args.test_limit, hash_buckets=args.hash_buckets)))
        num_dense, num_fields = 13, 26
    else:
        ctr = dict(vocab_sizes=[args.ctr_vocab] * args.ctr_fields, num_dense=args.ctr_dense,
                   zipf_exponent=args.ctr_zipf, data_seed=args.data_seed)
        train = fdata.SyntheticCtrDataset(args.batch, num_examples=args.ctr_train, steps=args.steps, seed=args.seed,
                                          shard_index=rank, num_shards=workers, **ctr)
        test = fdata.synthetic_ctr_test_set(args.ctr_test, first=args.ctr_train, **ctr)
        num_dense, num_fields = args.ctr_dense, args.ctr_fields
    fields = [f"emb{f}" for f in range(num_fields)]
    bottom_w, top_w = dense_widths(args, num_dense, fields)

    # The model.
    tower = make_tower(*dense_widths(args, num_dense, fields)).to(args.device)
    if args.mode == "local":
        vocab = args.hash_buckets * num_fields if args.criteo_train else args.ctr_vocab * num_fields
        emb = LocalBags(fields, vocab, args.emb_dim).to(args.device)
    else:
        emb = ft.EmbeddingBagCollection(
            [ft.EmbeddingBagConfig(f, args.emb_dim, optimizer=args.optimizer, lr=args.lr,
                                   consistency=args.consistency, seed=args.seed) for f in fields],
            prefix="dlrm/")
        if args.mode == "ps":
            tower = ft.ServerParameters(tower, prefix="dlrm/dense/", optimizer=args.optimizer, lr=args.dense_lr,
                                        consistency=args.consistency, seed=args.seed)
        else:
            if session.checkpoint_every and not args.dense_dir:
                raise SystemExit("dlrm: --mode hybrid with checkpoints needs --dense-dir (the MLPs live on the "
                                 "workers, not in the servers' checkpoint)")
            session.init_process_group("gloo")
            tower = torch.nn.parallel.DistributedDataParallel(tower)  # gloo reduces CUDA tensors too
    model = DLRM(emb, tower, fields)
    # The workers' optimizer: everything (local), the MLPs (hybrid); --lr and --dense-lr as the
    # servers use them.
    local_opt = None
    if args.mode != "ps":
        groups = [{"params": list(tower.parameters()), "lr": args.dense_lr}]
        if args.mode == "local":
            groups.append({"params": list(emb.parameters()), "lr": args.lr})
        local_opt = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[args.optimizer](
            groups)

    # Resume: the step the job is at (Session.start_step); the data before it is skipped.
    start = session.start_step if session else 0
    dense_dir = args.dense_dir
    if session and session.resume:
        session.resuming(start, args.steps)
        if args.mode == "hybrid" and start > 0:
            state = torch.load(os.path.join(dense_dir, f"dense-{start}.pt"))
            tower.module.load_state_dict(state["tower"])
            local_opt.load_state_dict(state["opt"])
    metrics = open(args.metrics_out.replace("{rank}", str(rank)), "a") if args.metrics_out else None

    def record(kind, **fields_):
        if metrics:
            metrics.write(json.dumps(dict(kind=kind, rank=rank, **fields_)) + "\n")
            metrics.flush()

    def checkpoint(at):
        """The servers' tables as of step `at` (worker 0 asks), and in hybrid mode the MLPs and
        their optimizer beside them (--dense-dir)."""
        session.checkpoint(at)
        if args.mode == "hybrid" and rank == 0:
            os.makedirs(dense_dir, exist_ok=True)
            torch.save({"tower": tower.module.state_dict(), "opt": local_opt.state_dict()},
                       os.path.join(dense_dir, f"dense-{at}.pt"))

    loss_fn = torch.nn.BCEWithLogitsLoss()
    batches = iter(train)
    for _ in range(start):
        next(batches)
    # Moved to the device before a Prefetcher sees them: its bags are then the forward's own.
    batches = (to_device(b, args.device) for b in batches)
    if args.prefetch and args.mode != "local":
        batches = iter(ft.Prefetcher(batches, emb, lambda b: features_of(b, fields)))
    clock = Clock([emb, tower])
    record("start", mode=args.mode, arch=args.arch, workers=workers, batch=args.batch, steps=args.steps, start=start,
           consistency=args.consistency, prefetch=args.prefetch, threads=torch.get_num_threads(),
           device=str(args.device))
    t_run = time.perf_counter()
    window = {"pull_s": 0.0, "push_s": 0.0, "compute_s": 0.0, "loss": 0.0, "n": 0}
    totals = {"pull_s": 0.0, "push_s": 0.0, "compute_s": 0.0}
    step = start
    while step < args.steps:
        t0 = time.perf_counter()
        batch = next(batches)
        logits = model(batch["dense"], features_of(batch, fields))
        if session and session.checkpoint_due(step):
            checkpoint(step)
        loss = loss_fn(logits, batch["labels"])
        if local_opt:
            local_opt.zero_grad()
        loss.backward()
        if local_opt:
            local_opt.step()
        step += 1
        split = clock.lap(time.perf_counter() - t0)
        for k in totals:
            totals[k] += split[k]
            window[k] += split[k]
        window["loss"] += float(loss)  # on a GPU, this waits for the step's work
        window["n"] += 1
        if step % args.log_every == 0 or step == args.steps:
            n = window.pop("n")
            line = {k: v / n for k, v in window.items()}
            if session:
                session.log_step(step, args.steps, examples=(step - start) * args.batch, **line)
            else:
                print(f"step {step}/{args.steps} " + " ".join(f"{k} {v:.6g}" for k, v in line.items()), flush=True)
            record("train", step=step, **line)
            window = {"pull_s": 0.0, "push_s": 0.0, "compute_s": 0.0, "loss": 0.0, "n": 0}
        if args.eval_every and step % args.eval_every == 0 and step < args.steps and rank == 0 and test:
            auc, ll = evaluate(model, test, args.device)
            record("eval", step=step, auc=auc, logloss=ll)
    train_s = time.perf_counter() - t_run
    ran = step - start
    end = dict(steps=ran, train_s=train_s, examples_per_s=ran * args.batch / train_s if train_s > 0 else 0.0,
               **{k: v / max(ran, 1) for k, v in totals.items()})
    if session:
        for m in (emb, tower):
            if hasattr(m, "flush"):
                m.flush()
        # The job's last step is checkpointed too (as ferry-trainer's --checkpoint-every does), so
        # that --resume continues from the end: worker 0 reads the tables at the final step first
        # (the embeddings with no ids; the MLPs' last push+pull was waited for just now).
        if session.checkpoint_every and rank == 0 and ran > 0:
            with torch.no_grad():
                emb({})
            checkpoint(step)
        # Finished workers no longer hold sync steps up: worker 0 evaluates at the final step.
        if rank != 0:
            session.finish()
    if rank == 0 and test:
        auc, ll = evaluate(model, test, args.device)
        end.update(auc=auc, logloss=ll)
        if "true_probs" in test:
            from ferry import _data
            end["planted_auc"] = _data.auc(test["true_probs"].numpy(), test["labels"].numpy())
        print("final: " + " ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in end.items()),
              flush=True)
    record("end", **end)
    if session:
        if rank == 0:
            session.finish()
        session.close()
    if args.mode == "hybrid":
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
