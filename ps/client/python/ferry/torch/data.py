"""PyTorch datasets over Ferry's data readers (the C++ of trainer/data, as ferry._data).

Each item is a whole batch, a dict of CPU tensors
    {"labels": float32 [B], "dense": float32 [B, D], "ids": int64 [B, F]}
made with torch.from_numpy from the arrays the C++ filled (no copy: the tensors share the C++
vectors' memory). Use them with torch.utils.data.DataLoader(dataset, batch_size=None):

    from ferry import _data
    from ferry.torch.data import SyntheticCtrDataset, CriteoDataset
    train = SyntheticCtrDataset(64, num_examples=1_000_000, epochs=2, shard_index=rank, num_shards=M)
    for batch in torch.utils.data.DataLoader(train, batch_size=None, num_workers=2):
        ...  # batch["ids"][:, f] are field f's ids
    test = train.test_set(20000)             # + "true_probs": the planted model's click probabilities
    planted_auc = _data.auc(test["true_probs"].numpy(), test["labels"].numpy())

SyntheticCtrDataset mirrors ferry-trainer --model ctr (trainer/models/ctr.cc, trainer/src/trainer.cc):
with the same settings a Python job sees the same examples in the same order. The flags map to
the arguments as follows (the defaults are the trainer's):
    --ctr-fields F --ctr-vocab V   vocab_sizes=[V] * F         (8 x 1000)
    --ctr-dense D                  num_dense=D                  (4)
    --ctr-zipf S                   zipf_exponent=S              (1.1)
    --data-seed S                  data_seed=S                  (1): the examples and the planted model
    --seed S                       seed=S                       (1): the per-epoch shuffle (the trainer
                                                                also seeds its parameters with it)
    --ctr-train N                  num_examples=N               (1000000): examples 0 .. N-1
    --train-limit L                num_examples=min(L, N)      (the test set still starts at N)
    --ctr-test T                   test_set(T)                  (20000): examples [N, N + T)
    --rank R --num-workers M       shard_index=R, num_shards=M  (--local: 0 of 1)
    --batch B --accumulate k       batch_size=B * k             (64 x 1): the examples of one step
    --epochs E | --steps N         epochs=E | steps=N           (1 | None)
    --no-shuffle                   shuffle=False
    (no flag)                      drop_last=False              the trainer's batching; the default
                                                                drop_last=True differs from it only at
                                                                an epoch's end (see SyntheticCtrDataset)
The rule: example i is SyntheticCtr(seed=data_seed, ...).generate([i]); epoch e of shard r visits
epoch_indices(num_examples, r, M, e, shuffle, seed) in order, cut into the epoch's steps; step t
(counting over epochs) is step t % steps_per_epoch of epoch t // steps_per_epoch.

CriteoDataset streams Criteo TSV files (plain or gzipped), as --criteo-train does.

DataLoader workers (num_workers > 0): each loader worker reads only its part, never the same
data twice (torch.utils.data.get_worker_info()):
  - SyntheticCtrDataset: loader worker w of W makes batches w, w + W, w + 2W, ... of the
    sequence above. DataLoader takes the workers' batches in turn, so the loader yields exactly
    the batches, in exactly the order, of num_workers=0.
  - CriteoDataset: loader worker w of W reads a part of this shard's lines (see CriteoDataset):
    over a pass the loader yields every example of the shard exactly once, but the order and the
    grouping into batches differ from num_workers=0, and each worker's pass ends with its own
    partial batch. The pass counts (`passes`) and bad-line warnings stay in the worker processes.

Thread-safety: a dataset may be iterated by one thread at a time; each iteration (and each loader
worker) opens readers of its own.
"""

import concurrent.futures
import operator
import warnings

import torch
from torch.utils.data import IterableDataset, get_worker_info

from .. import _data

__all__ = ["SyntheticCtrDataset", "synthetic_ctr_test_set", "CriteoDataset", "CriteoBadLinesWarning"]

# ferry-trainer's defaults for --model ctr (trainer/include/ferry/trainer/options.h).
TRAINER_VOCAB_SIZES = (1000,) * 8
TRAINER_NUM_DENSE = 4
TRAINER_ZIPF = 1.1
TRAINER_TRAIN = 1_000_000
TRAINER_TEST = 20_000
TRAINER_BATCH = 64


def _as_tensors(labels, dense, ids):
    """A batch's numpy arrays as the dict of tensors the datasets yield; shares their memory."""
    return {"labels": torch.from_numpy(labels), "dense": torch.from_numpy(dense), "ids": torch.from_numpy(ids)}


def _loader_worker():
    """(this DataLoader worker's id, the number of workers); (0, 1) outside a loader worker."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


def _count(name, value, least):
    """`value` as an int, checked to be >= least (TypeError for a non-integer, ValueError below)."""
    if isinstance(value, bool):
        raise TypeError("%s must be an integer, not %r" % (name, value))
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError("%s must be an integer, not %r" % (name, value)) from None
    if value < least:
        raise ValueError("%s must be >= %d, not %d" % (name, least, value))
    return value


def synthetic_ctr_test_set(num_test=TRAINER_TEST, *, first=TRAINER_TRAIN, data_seed=1,
                           vocab_sizes=TRAINER_VOCAB_SIZES, num_dense=TRAINER_NUM_DENSE,
                           zipf_exponent=TRAINER_ZIPF):
    """ferry-trainer's synthetic ctr test set: examples [first, first + num_test) (first is
    --ctr-train: the test set follows the training examples), as a dict of tensors with
    "true_probs" (float32 [num_test], each example's click probability under the planted model)
    beside "labels", "dense" and "ids". The planted AUC the trainer reports ("planted_auc") is
    ferry._data.auc(true_probs, labels) over all of them (--test-limit caps only the evaluation)."""
    num_test = _count("num_test", num_test, 0)
    gen = _data.SyntheticCtr(seed=data_seed, vocab_sizes=list(vocab_sizes), num_dense=num_dense,
                             zipf_exponent=zipf_exponent)
    labels, dense, ids, true_probs = gen.generate_range(first, num_test)
    out = _as_tensors(labels, dense, ids)
    out["true_probs"] = torch.from_numpy(true_probs)
    return out


class SyntheticCtrDataset(IterableDataset):
    """Synthetic click-through batches (ferry._data.SyntheticCtr: a planted logistic model), this
    shard's examples of each epoch in the order ferry._data.epoch_indices gives, as ferry-trainer
    --model ctr trains on them (the module docstring maps its flags to these arguments).

    Batching of an epoch. Every shard makes the same number of batches, steps_per_epoch, so that
    sync workers stay in step; shards differ by at most one example (the first
    num_examples % num_shards have one more):
      drop_last=False  the trainer's rule: ceil(smallest shard / batch_size) batches; the last takes
                       what is left of this shard (1 .. batch_size + 1 examples), so every example
                       is used once per epoch. Exactly ferry-trainer's batches.
      drop_last=True   floor(smallest shard / batch_size) batches of exactly batch_size; the rest of
                       the epoch is skipped. The same examples as the trainer's except at each
                       epoch's end (where it differs from the trainer's unless every shard's size is
                       a multiple of batch_size).
    steps: the total number of batches, over as many epochs as needed (--steps); None: epochs x
    steps_per_epoch. len(dataset) is that total (over all DataLoader workers together).

    read_ahead: each batch is made on a thread of the iterator's own while the caller uses the
    one before (the same batches in the same order; one batch more in memory).

    Raises ValueError for bad options, or when the smallest shard cannot fill one batch.
    """

    def __init__(self, batch_size=TRAINER_BATCH, *, num_examples=TRAINER_TRAIN, epochs=1, steps=None,
                 data_seed=1, seed=1, vocab_sizes=TRAINER_VOCAB_SIZES, num_dense=TRAINER_NUM_DENSE,
                 zipf_exponent=TRAINER_ZIPF, shard_index=0, num_shards=1, shuffle=True, drop_last=True,
                 read_ahead=True):
        super().__init__()
        self.read_ahead = bool(read_ahead)
        self.batch_size = _count("batch_size", batch_size, 1)
        self.num_examples = _count("num_examples", num_examples, 0)
        self.epochs = _count("epochs", epochs, 0)
        self.steps = None if steps is None else _count("steps", steps, 0)
        self.data_seed = data_seed
        self.seed = seed
        self.vocab_sizes = tuple(vocab_sizes)
        self.num_dense = num_dense
        self.zipf_exponent = zipf_exponent
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self._generator = None
        self.generator  # noqa: B018 -- ValueError for bad generator options here, not in a loader worker
        _data.shard_size(self.num_examples, shard_index, num_shards)  # ValueError for a bad shard
        smallest = _data.shard_size(self.num_examples, num_shards - 1, num_shards)
        b = self.batch_size
        self.steps_per_epoch = smallest // b if self.drop_last else (smallest + b - 1) // b
        if self.steps_per_epoch == 0:
            raise ValueError("%d examples over %d shard(s) leave shard %d with %d: not one batch of %d%s" %
                             (self.num_examples, num_shards, num_shards - 1, smallest, b,
                              " (drop_last)" if self.drop_last and smallest else ""))
        self.total_steps = self.steps if self.steps is not None else self.epochs * self.steps_per_epoch

    @property
    def generator(self):
        """The ferry._data.SyntheticCtr of this data (made once per process)."""
        if self._generator is None:
            self._generator = _data.SyntheticCtr(seed=self.data_seed, vocab_sizes=list(self.vocab_sizes),
                                                 num_dense=self.num_dense, zipf_exponent=self.zipf_exponent)
        return self._generator

    def __getstate__(self):  # the extension object does not pickle (loader workers started by spawn)
        state = dict(self.__dict__)
        state["_generator"] = None
        return state

    def __len__(self):
        return self.total_steps

    def batch_indices(self, step, order=None):
        """The example indices of batch `step` (counting over epochs), as an int64 array; `order`:
        that epoch's epoch_indices when the caller has them."""
        epoch, k = divmod(step, self.steps_per_epoch)
        if order is None:
            order = self.epoch_order(epoch)
        first = k * self.batch_size
        last = len(order) if (not self.drop_last and k + 1 == self.steps_per_epoch) else first + self.batch_size
        return order[first:last]  # a view

    def epoch_order(self, epoch):
        """This shard's example indices of epoch `epoch`, in visiting order (int64 array)."""
        return _data.epoch_indices(self.num_examples, self.shard_index, self.num_shards, epoch, self.shuffle,
                                   self.seed)

    def __iter__(self):
        worker, workers = _loader_worker()
        gen = self.generator
        epoch_order = [None, -1]  # the order of the epoch last made, and its number

        def make(step):
            epoch = step // self.steps_per_epoch
            if epoch != epoch_order[1]:
                epoch_order[:] = [self.epoch_order(epoch), epoch]
            labels, dense, ids, _ = gen.generate(self.batch_indices(step, epoch_order[0]))
            return _as_tensors(labels, dense, ids)

        steps = range(worker, self.total_steps, workers)
        if not self.read_ahead:
            for step in steps:
                yield make(step)
            return
        # The next batch is made on a thread (generate releases the GIL) while the caller uses
        # this one, as ferry-trainer loads its next batch while a step's exchange travels.
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ferry-ctr-data") as pool:
            ahead = None
            for step in steps:
                made = pool.submit(make, step)
                if ahead is not None:
                    yield ahead.result()
                ahead = made
            if ahead is not None:
                yield ahead.result()

    def test_set(self, num_test=TRAINER_TEST, *, first=None):
        """The trainer's test set for this data: synthetic_ctr_test_set with this dataset's
        generator options, starting at `first` (default num_examples; pass --ctr-train when
        num_examples stands for --train-limit)."""
        return synthetic_ctr_test_set(num_test, first=self.num_examples if first is None else first,
                                      data_seed=self.data_seed, vocab_sizes=self.vocab_sizes,
                                      num_dense=self.num_dense, zipf_exponent=self.zipf_exponent)


class CriteoBadLinesWarning(UserWarning):
    """A pass over Criteo files skipped bad lines (the message names the first ones)."""


class CriteoDataset(IterableDataset):
    """Batches of Criteo TSV examples (13 dense, 26 categorical fields; ferry/data/criteo.h) from
    this shard's part of `paths`: a string of comma-separated paths and glob patterns, or a list of
    paths read as they are.

      steps=None  one pass over the files (ferry._data.CriteoReader): batches of batch_size, ending
                  at the files' end with a last, smaller batch unless drop_last (pass_limit > 0:
                  the pass ends after that many examples).
      steps=N     exactly N batches of batch_size from ferry._data.CriteoStream, passing over the
                  files again at their end (a batch may span two passes; pass_limit > 0 ends each
                  pass after that many examples): ferry-trainer's --criteo-train source with
                  --steps N (and --train-limit pass_limit).
    read_ahead: the next batch is parsed while the caller uses one (on CriteoStream's own thread,
    or on a thread of this dataset's for one pass); the batches are the same.

    Sharding (shard_index of num_shards, as --rank / --num-workers): shard_by "file" (file i is
    shard i % num_shards's), "line" (line k of every file is shard k % num_shards's) or "auto" (by
    file when there are at least as many files as shards); `shard_by` then says which. Under a
    DataLoader with W > 1 workers, loader worker w reads, by line: this shard's files (by file)
    split by line into W, or lines k with k % (num_shards * W) == shard_index + num_shards * w (by
    line); together the workers read this shard's examples once per pass. A pass_limit is split
    among them (worker w's passes end after ceil((pass_limit - w) / W) of its examples).

    Bad lines are skipped, counted and recorded: each finished pass is appended to `passes` (a
    ferry._data.CriteoPass: examples, bad_lines, lines, bytes, files, first_bad_lines as
    "file:line: reason"), and a pass with bad lines warns CriteoBadLinesWarning naming the first
    ones. With steps=N, a pass is recorded when a batch crosses its end.

    Errors: FileNotFoundError naming a missing file (at construction: every file of the shard is
    opened once), ValueError for bad options or a shard with no file, OSError for a read error (a
    corrupt or truncated gzip, when the iteration reaches it); with steps=N, ValueError when a whole
    pass yields no example.
    """

    def __init__(self, paths, batch_size, *, shard_index=0, num_shards=1, shard_by="auto", hash_buckets=0,
                 steps=None, pass_limit=0, drop_last=False, read_ahead=True, max_bad_line_records=10):
        super().__init__()
        self.batch_size = _count("batch_size", batch_size, 1)
        self.steps = None if steps is None else _count("steps", steps, 0)
        self.pass_limit = _count("pass_limit", pass_limit, 0)
        self.files = _data.expand_criteo_paths(paths)
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.hash_buckets = hash_buckets
        self.drop_last = bool(drop_last)
        self.read_ahead = bool(read_ahead)
        self.max_bad_line_records = max_bad_line_records
        self.passes = []
        # Opens this shard's files once: the errors of a missing file or bad options come now.
        probe = _data.CriteoReader(self.files, shard_index=shard_index, num_shards=num_shards, shard_by=shard_by,
                                   hash_buckets=hash_buckets, max_bad_line_records=max_bad_line_records)
        self.shard_by = probe.shard_by
        self.shard_files = probe.files  # this shard's files, in reading order
        del probe

    def __getstate__(self):  # the passes' records stay in the process that read them
        state = dict(self.__dict__)
        state["passes"] = []
        return state

    def __len__(self):
        if self.steps is None:
            raise TypeError("a one-pass CriteoDataset has no length until it is read (give steps=N)")
        return self.steps

    @property
    def bad_lines(self):
        """Bad lines skipped over the passes in `passes`."""
        return sum(p.bad_lines for p in self.passes)

    def _reader_args(self, worker, workers):
        """(files, shard_index, num_shards, shard_by) of loader worker `worker` of `workers`."""
        if workers == 1:
            return self.files, self.shard_index, self.num_shards, self.shard_by
        if self.shard_by == "file":
            return self.shard_files, worker, workers, "line"
        return self.files, self.shard_index + self.num_shards * worker, self.num_shards * workers, "line"

    def _record(self, passes):
        for p in passes:
            self.passes.append(p)
            if p.bad_lines:
                warnings.warn("Criteo pass %d: %d of %d line(s) bad, skipped; the first: %s" %
                              (p.pass_, p.bad_lines, p.lines, "; ".join(p.first_bad_lines)),
                              CriteoBadLinesWarning, stacklevel=3)

    def __iter__(self):
        worker, workers = _loader_worker()
        files, index, shards, by = self._reader_args(worker, workers)
        options = dict(shard_index=index, num_shards=shards, shard_by=by, hash_buckets=self.hash_buckets,
                       max_bad_line_records=self.max_bad_line_records)
        # A loader worker's share of a pass limit (the workers' shares add up to it).
        limit = _data.shard_size(self.pass_limit, worker, workers)
        if self.pass_limit > 0 and limit == 0:
            if self.steps is None:
                return iter(())
            raise ValueError("pass_limit %d leaves DataLoader worker %d of %d no example" %
                             (self.pass_limit, worker, workers))
        if self.steps is None:
            return self._one_pass(_data.CriteoReader(files, **options), limit)
        stream = _data.CriteoStream(files, read_ahead=self.read_ahead, pass_limit=limit, **options)
        return self._steps(stream, range(worker, self.steps, workers))

    def _steps(self, stream, steps):
        for _ in steps:
            labels, dense, ids = stream.next(self.batch_size)
            self._record(stream.take_finished_passes())
            yield _as_tensors(labels, dense, ids)

    def _one_pass(self, reader, limit):
        size = self.batch_size
        asked = 0

        def ask():  # how many examples the next read asks for (0: the pass limit is reached)
            nonlocal asked
            n = size if limit == 0 else min(size, limit - asked)
            asked += n
            return n

        pool = (concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-criteo")
                if self.read_ahead else None)
        try:
            n = ask()
            pending = pool.submit(reader.read, n) if pool is not None and n > 0 else None
            while n > 0:
                labels, dense, ids = pending.result() if pool is not None else reader.read(n)
                got = len(labels)
                n = ask() if got == n else 0  # fewer than asked: the files' end
                if pool is not None and n > 0:
                    pending = pool.submit(reader.read, n)  # read while the caller uses this batch
                if got == size or (got > 0 and not self.drop_last):
                    yield _as_tensors(labels, dense, ids)
            self._record([reader.stats])
        finally:
            if pool is not None:
                pool.shutdown(wait=True)
