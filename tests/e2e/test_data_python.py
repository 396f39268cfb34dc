"""ferry._data (the C++ data readers for Python) and ferry.torch.data (PyTorch datasets over them).

Checked against values computed here independently, from the definitions in the C++ headers
(SplitMix64, the rejection-inversion Zipf sampler and Box-Muller of synthetic_ctr.h, Fisher-Yates
of shard.h, FNV-1a + Mix64 ids and log(1 + max(x, 0)) of criteo.h), and, where this build has
ferry-trainer, against the trainer's own report of the planted model's AUC. Criteo files (plain
and gzipped, with bad lines) are written to a temporary folder.

Needs FERRY_BUILD_DIR (ctest sets it) with the package built (ferry_python, ferry_data_python)
and Debian's python3 with python3-numpy. The torch tests need python3-torch and skip without
it; the comparison with ferry-trainer skips where the trainer is not built. Every test takes well
under a second. Run by hand, from tests/e2e/:
  FERRY_BUILD_DIR=../../build /usr/bin/python3 -m unittest -v test_data_python
"""

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings
from unittest import mock

from build_paths import BUILD_DIR, TRAINER_BIN

# ctest registers this test only where the extension is built: failing to import it is a failure.
sys.path.insert(0, os.path.join(BUILD_DIR, "python"))
import numpy as np  # noqa: E402
from ferry import _data  # noqa: E402

try:
    import torch  # noqa: E402
    import ferry.torch.data as fdata  # noqa: E402
except ImportError:  # python3-torch missing: the torch tests skip
    torch = None

M64 = (1 << 64) - 1


# ---- Independent reference implementations (from the headers' definitions) ----

def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def hash_pair(a, b):
    return mix64(mix64(a & M64) ^ ((b * 0xD6E8FEB86659FD93) & M64))


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & M64

    def next(self):
        x = self.state
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        return mix64(x)

    def below(self, bound):
        threshold = ((1 << 64) - bound) % bound
        while True:
            x = self.next()
            if x >= threshold:
                return x % bound

    def uniform(self):
        return (self.next() >> 11) * 2.0 ** -53


def normal_from_key(key):
    rng = SplitMix64(key)
    u1 = 1.0 - rng.uniform()
    u2 = rng.uniform()
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def _helper1(x):
    return math.log1p(x) / x if abs(x) > 1e-8 else 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))


def _helper2(x):
    return math.expm1(x) / x if abs(x) > 1e-8 else 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))


class Zipf:
    """Rejection-inversion Zipf(n, s) over [1, n] (Hörmann & Derflinger; zipf.h)."""

    def __init__(self, n, s):
        self.n, self.s = n, s
        self.hx1 = self.hi(1.5) - 1.0
        self.hn = self.hi(n + 0.5)
        self.threshold = 2.0 - self.hii(self.hi(2.5) - self.h(2.0))

    def h(self, x):
        return math.exp(-self.s * math.log(x))

    def hi(self, x):
        lx = math.log(x)
        return _helper2((1.0 - self.s) * lx) * lx

    def hii(self, x):
        t = max(x * (1.0 - self.s), -1.0)
        return math.exp(_helper1(t) * x)

    def sample(self, unit):
        if self.n == 1:
            return 1
        while True:
            u = self.hn + unit() * (self.hx1 - self.hn)
            x = self.hii(u)
            k = min(max(int(x + 0.5), 1), self.n)
            if k - x <= self.threshold or u >= self.hi(k + 0.5) - self.h(k):
                return k


def reference_examples(indices, seed, vocab_sizes, num_dense, zipf_exponent,
                       id_weight_stddev=0.5, dense_weight_stddev=0.5, bias=-1.5):
    """(labels, dense, ids, true_probs) of synthetic_ctr.h's examples `indices`, in pure Python."""
    example_key, weight_key, dense_key = hash_pair(seed, 1), hash_pair(seed, 2), hash_pair(seed, 3)
    offsets = np.concatenate([[0], np.cumsum(vocab_sizes)[:-1]]).astype(int)
    samplers = [Zipf(v, zipf_exponent) for v in vocab_sizes]
    dense_w = [dense_weight_stddev * normal_from_key(hash_pair(dense_key, j)) for j in range(num_dense)]
    labels, dense, ids, probs = [], [], [], []
    for index in indices:
        rng = SplitMix64(hash_pair(example_key, int(index) & M64))
        row_ids = [int(offsets[f]) + samplers[f].sample(rng.uniform) - 1 for f in range(len(vocab_sizes))]
        row_dense = [np.float32(normal_from_key(rng.next())) for _ in range(num_dense)]
        logit = bias
        for i in row_ids:
            logit += id_weight_stddev * normal_from_key(hash_pair(weight_key, i))
        for j in range(num_dense):
            logit += dense_w[j] * float(row_dense[j])
        p = 1.0 / (1.0 + math.exp(-logit))
        labels.append(1.0 if rng.uniform() < p else 0.0)
        dense.append(row_dense)
        ids.append(row_ids)
        probs.append(p)
    return (np.array(labels, np.float32), np.array(dense, np.float32).reshape(len(indices), num_dense),
            np.array(ids, np.int64), np.array(probs, np.float64))


def reference_permutation(n, epoch, seed):
    order = list(range(n))
    rng = SplitMix64(hash_pair(seed, epoch))
    for i in range(n, 1, -1):
        j = rng.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for c in data:
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def reference_field_id(field, value, hash_buckets=0):
    h = mix64(fnv1a64(value.encode()) ^ mix64(field + 1))
    return h >> 1 if hash_buckets == 0 else field * hash_buckets + h % hash_buckets


# ---- Criteo files ----

def criteo_line(n, label=None):
    """Line n of the test files: I1 = n, I2 = -n (dense 0), I3 empty, I4.. = small ints; C1 =
    n in hex (so C1's id names the line), C2 empty (the missing id), C3.. fixed hex values."""
    label = n % 2 if label is None else label
    ints = [str(n), str(-n), ""] + [str((n * 7 + j) % 50) for j in range(10)]
    cats = ["%08x" % n, ""] + ["%08x" % (0x68FD1E64 + f) for f in range(2, 26)]
    return "\t".join([str(label)] + ints + cats)


def expected_row(n, hash_buckets=0):
    """(label, dense [13], ids [26]) the reader should make of criteo_line(n)."""
    ints = [n, -n, 0] + [(n * 7 + j) % 50 for j in range(10)]
    dense = [np.float32(math.log1p(max(x, 0))) for x in ints]
    cats = ["%08x" % n, ""] + ["%08x" % (0x68FD1E64 + f) for f in range(2, 26)]
    ids = [reference_field_id(f, c, hash_buckets) for f, c in enumerate(cats)]
    return float(n % 2), np.array(dense, np.float32), np.array(ids, np.int64)


def write_criteo(path, lines):
    text = "".join(line + "\n" for line in lines)
    if path.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)


BAD_LINES = [  # (line, the reason's words)
    ("1\t2\t3", "3 tab-separated fields, expected 40"),
    (criteo_line(0).replace("0", "2", 1), 'label "2" is not 0 or 1'),
    ("0\tabc" + criteo_line(0)[3:], 'integer feature I1 "abc" is not a decimal int64'),
]


class CriteoFolder:
    """day_0.tsv (plain), day_1.gz, day_2.gz, day_10.gz: examples numbered 1.. in file order
    (line k of the files holds example k + 1 of that file's range); day_1.gz has the bad lines
    at its lines 2, 4 and 6."""

    def __init__(self, folder, per_file=(30, 25, 20, 15)):
        self.folder = folder
        self.files, self.numbers, self.bad = [], [], []  # bad: (file, line number, reason)
        n = 1
        for name, count in zip(["day_0.tsv", "day_1.gz", "day_2.gz", "day_10.gz"], per_file):
            path = os.path.join(folder, name)
            lines, numbers = [], []
            for _ in range(count):
                if name == "day_1.gz" and len(lines) in (1, 3, 5):
                    line, reason = BAD_LINES[len(self.bad) % len(BAD_LINES)]
                    lines.append(line)
                    self.bad.append((path, len(lines), reason))
                    numbers.append(None)
                lines.append(criteo_line(n))
                numbers.append(n)
                n += 1
            write_criteo(path, lines)
            self.files.append(path)
            self.numbers.append(numbers)  # per line: the example number, None for a bad line

    def examples(self, files=None):
        files = range(len(self.files)) if files is None else files
        return [n for i in files for n in self.numbers[i] if n is not None]


def quietly(dataset):
    """The dataset's batches, its bad-line warnings ignored."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fdata.CriteoBadLinesWarning)
        return list(dataset)


def example_numbers(ids):
    """The example numbers of a batch's rows (C1 is the number in hex)."""
    by_id = example_numbers.table
    return [by_id[int(i)] for i in np.asarray(ids)[:, 0]]


example_numbers.table = {reference_field_id(0, "%08x" % n): n for n in range(0, 2000)}


# ---- Tests ----

class SyntheticCtrTest(unittest.TestCase):
    VOCAB = [10, 100, 1000, 1, 5000]

    def test_examples_match_an_independent_computation(self):
        gen = _data.SyntheticCtr(seed=7, vocab_sizes=self.VOCAB, num_dense=3, zipf_exponent=1.3)
        indices = np.array([0, 1, 2, 999, 123456789, -5, 2 ** 40 + 3] + list(range(500, 540)), np.int64)
        labels, dense, ids, probs = gen.generate(indices)
        r_labels, r_dense, r_ids, r_probs = reference_examples(indices, 7, self.VOCAB, 3, 1.3)
        np.testing.assert_array_equal(ids, r_ids)
        np.testing.assert_allclose(dense, r_dense, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(probs, r_probs.astype(np.float32), rtol=1e-6)
        np.testing.assert_array_equal(labels, r_labels)
        # The planted model's weights, as the header defines them.
        self.assertAlmostEqual(gen.dense_weight(1), 0.5 * normal_from_key(hash_pair(hash_pair(7, 3), 1)), places=12)
        self.assertAlmostEqual(gen.id_weight(42), 0.5 * normal_from_key(hash_pair(hash_pair(7, 2), 42)), places=12)
        self.assertEqual(gen.bias, -1.5)

    def test_shapes_ranges_and_determinism(self):
        gen = _data.SyntheticCtr(seed=3, vocab_sizes=self.VOCAB, num_dense=2)
        self.assertEqual((gen.num_fields, gen.num_dense, gen.total_vocab), (5, 2, sum(self.VOCAB)))
        offsets = [gen.field_offset(f) for f in range(5)]
        self.assertEqual(offsets, [0, 10, 110, 1110, 1111])
        labels, dense, ids, probs = gen.generate_range(100, 4000)
        self.assertEqual((labels.shape, dense.shape, ids.shape, probs.shape), ((4000,), (4000, 2), (4000, 5), (4000,)))
        self.assertEqual((labels.dtype, dense.dtype, ids.dtype, probs.dtype),
                         (np.float32, np.float32, np.int64, np.float32))
        for f, (offset, v) in enumerate(zip(offsets, self.VOCAB)):
            self.assertTrue(np.all((ids[:, f] >= offset) & (ids[:, f] < offset + v)), f)
            # Zipf: the field's most frequent id is its first.
            self.assertEqual(np.bincount(ids[:, f] - offset).argmax(), 0)
        self.assertTrue(set(np.unique(labels)) <= {0.0, 1.0})
        self.assertTrue(np.all((probs > 0) & (probs < 1)))
        # Same seed, same data; generate() in any order gives the same rows.
        again = _data.SyntheticCtr(seed=3, vocab_sizes=self.VOCAB, num_dense=2).generate_range(100, 4000)
        for a, b in zip((labels, dense, ids, probs), again):
            np.testing.assert_array_equal(a, b)
        picked = np.array([3999 + 100, 100, 2050], np.int64)
        for a, b in zip(gen.generate(picked), (labels, dense, ids, probs)):
            np.testing.assert_array_equal(a, b[picked - 100])
        # Another seed, other data.
        other = _data.SyntheticCtr(seed=4, vocab_sizes=self.VOCAB, num_dense=2).generate_range(100, 4000)
        self.assertFalse(np.array_equal(other[2], ids))
        self.assertFalse(np.array_equal(other[1], dense))

    def test_arrays_own_the_cpp_vectors(self):
        labels, dense, ids, probs = _data.SyntheticCtr().generate_range(0, 16)
        for a in (labels, dense, ids, probs):
            self.assertEqual(type(a.base).__name__, "PyCapsule")  # the moved vector, not a copy
            self.assertFalse(a.flags.owndata)
            self.assertTrue(a.flags.c_contiguous and a.flags.writeable)
        empty = _data.SyntheticCtr(vocab_sizes=[5, 5], num_dense=0).generate_range(0, 0)
        self.assertEqual([a.shape for a in empty], [(0,), (0, 0), (0, 2), (0,)])

    def test_planted_auc(self):
        labels, dense, ids, probs = _data.SyntheticCtr(seed=1, vocab_sizes=[1000] * 8, num_dense=4).generate_range(
            1000000, 20000)
        auc = _data.auc(probs, labels)
        self.assertGreater(auc, 0.7)
        # The planted probabilities beat the base rate's log-loss.
        base = float(labels.mean())
        base_loss = -(base * math.log(base) + (1 - base) * math.log(1 - base))
        self.assertLess(_data.log_loss(probs, labels), base_loss - 0.05)
        # The metrics against numpy.
        order = np.argsort(probs, kind="stable")
        ranks = np.empty(len(probs))
        ranks[order] = np.arange(1, len(probs) + 1)
        pos = labels == 1
        mw = (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())
        self.assertAlmostEqual(auc, mw, places=4)  # (ties are rare among float probabilities)
        p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
        self.assertAlmostEqual(_data.log_loss(probs, labels),
                               float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p))), places=5)

    @unittest.skipUnless(os.path.exists(TRAINER_BIN), "ferry-trainer not built")
    def test_planted_auc_equals_the_trainers(self):
        if torch is None:
            self.skipTest("python3-torch missing")
        with tempfile.TemporaryDirectory(prefix="ferry-data-python-") as tmp:
            metrics = os.path.join(tmp, "m.jsonl")
            argv = [TRAINER_BIN, "--local", "--device", "cpu", "--model", "ctr", "--ctr-train", "3000",
                    "--ctr-test", "2500", "--ctr-fields", "5", "--ctr-vocab", "300", "--ctr-dense", "3",
                    "--ctr-zipf", "1.2", "--data-seed", "9", "--steps", "1", "--batch", "64", "--hidden", "8",
                    "--emb-dim", "4", "--blas-threads", "1", "--quiet", "--metrics-out", metrics]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            with open(metrics) as f:
                start = next(e for e in map(json.loads, f) if e.get("event") == "start")
        test = fdata.synthetic_ctr_test_set(2500, first=3000, data_seed=9, vocab_sizes=[300] * 5, num_dense=3,
                                            zipf_exponent=1.2)
        self.assertAlmostEqual(_data.auc(test["true_probs"].numpy(), test["labels"].numpy()),
                               start["planted_auc"], places=12)
        self.assertAlmostEqual(_data.log_loss(test["true_probs"].numpy(), test["labels"].numpy()),
                               start["planted_log_loss"], places=12)

    def test_errors_are_python_exceptions(self):
        for kwargs in ({"vocab_sizes": []}, {"vocab_sizes": [10, 0]}, {"zipf_exponent": 0.0}, {"num_dense": -1}):
            with self.assertRaises(ValueError) as e:
                _data.SyntheticCtr(**kwargs)
            self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
            self.assertIn("SyntheticCtrOptions", str(e.exception))
        gen = _data.SyntheticCtr(vocab_sizes=[3, 4])
        with self.assertRaises(ValueError):
            gen.field_offset(2)
        with self.assertRaises(ValueError):
            gen.generate_range(0, -1)
        # Indices are integers of any dtype; floats are refused, not truncated.
        for a, b in zip(gen.generate(np.array([7, 2], np.uint16)), gen.generate(np.array([7, 2], np.int64))):
            np.testing.assert_array_equal(a, b)
        with self.assertRaises(TypeError) as e:
            gen.generate(np.array([1.7]))
        self.assertIn("generate: indices must be an array of integers (any width and sign), not float64",
                      str(e.exception))
        with self.assertRaises(ValueError) as e:
            _data.auc(np.array([0.1, 0.2], np.float32), np.array([1, 1], np.float32))  # one class only
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
        with self.assertRaises(ValueError):
            _data.auc(np.zeros(3, np.float32), np.zeros(2, np.float32))
        with self.assertRaises(ValueError):
            _data.log_loss(np.zeros(0, np.float32), np.zeros(0, np.float32))

    def test_data_module_imports_without_torch(self):
        code = "import sys; from ferry import _data; _data.SyntheticCtr(); assert 'torch' not in sys.modules"
        env = dict(os.environ, PYTHONPATH=os.path.join(BUILD_DIR, "python"))
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(done.returncode, 0, done.stderr)


class EpochIndicesTest(unittest.TestCase):
    def test_the_shuffle_is_the_documented_one(self):
        # Pinned in tests/unit/data/shard_test.cc, and computed here from the definition.
        self.assertEqual(_data.epoch_indices(10, 0, 1, 0, True, 42).tolist(), [6, 1, 8, 5, 2, 7, 4, 3, 9, 0])
        self.assertEqual(_data.epoch_indices(10, 0, 1, 1, True, 42).tolist(), [8, 2, 4, 0, 9, 1, 7, 3, 5, 6])
        self.assertEqual(_data.epoch_indices(1000, 0, 1, 3, True, 5).tolist(), reference_permutation(1000, 3, 5))

    def test_shards_cover_every_example_once(self):
        n, shards = 1003, 4
        for shuffle in (True, False):
            for epoch in (0, 1):
                full = _data.epoch_indices(n, 0, 1, epoch, shuffle, 11)
                parts = [_data.epoch_indices(n, r, shards, epoch, shuffle, 11) for r in range(shards)]
                for r, part in enumerate(parts):
                    self.assertEqual(part.dtype, np.int64)
                    self.assertEqual(len(part), _data.shard_size(n, r, shards))
                    np.testing.assert_array_equal(part, full[r::shards])  # positions r, r + M, ...
                joined = np.concatenate(parts)
                self.assertEqual(len(joined), n)
                self.assertEqual(len(np.unique(joined)), n)  # no overlap, nothing missing
                if not shuffle:
                    np.testing.assert_array_equal(parts[1], np.arange(1, n, shards))
        self.assertEqual([_data.shard_size(n, r, shards) for r in range(shards)], [251, 251, 251, 250])
        a = _data.epoch_indices(n, 0, 1, 0, True, 11)
        self.assertFalse(np.array_equal(a, _data.epoch_indices(n, 0, 1, 1, True, 11)))  # per epoch
        self.assertFalse(np.array_equal(a, _data.epoch_indices(n, 0, 1, 0, True, 12)))  # per seed

    def test_bad_shards(self):
        for args in ((10, 3, 3), (10, -1, 2), (10, 0, 0), (-1, 0, 1)):
            with self.assertRaises(ValueError):
                _data.epoch_indices(*args)


class CriteoReaderTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-data-python-")
        self.data = CriteoFolder(self.tmp)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def read_all(self, reader, n=7):
        parts = []
        while True:
            batch = reader.read(n)
            if len(batch[0]) == 0:
                return [np.concatenate(p) for p in zip(*parts)]
            parts.append(batch)

    def test_values_and_bad_lines(self):
        day1 = self.data.files[1]
        for buckets in (0, 1000):
            reader = _data.CriteoReader([day1], hash_buckets=buckets)
            labels, dense, ids = self.read_all(reader)
            numbers = self.data.examples([1])
            self.assertEqual((labels.shape, dense.shape, ids.shape), ((25,), (25, 13), (25, 26)))
            self.assertEqual((labels.dtype, dense.dtype, ids.dtype), (np.float32, np.float32, np.int64))
            for row, n in enumerate(numbers):
                label, want_dense, want_ids = expected_row(n, buckets)
                self.assertEqual(labels[row], label)
                np.testing.assert_array_equal(dense[row], want_dense)  # log(1 + max(x, 0)); empty: 0
                np.testing.assert_array_equal(ids[row], want_ids)
            if buckets:
                for f in range(26):
                    self.assertTrue(np.all((ids[:, f] >= f * buckets) & (ids[:, f] < (f + 1) * buckets)))
            stats = reader.stats
            self.assertEqual((stats.pass_, stats.examples, stats.bad_lines, stats.lines, stats.files),
                             (0, 25, 3, 28, 1))
            self.assertEqual(stats.first_bad_lines,
                             ["%s:%d: %s" % (path, line, reason) for path, line, reason in self.data.bad])
        # Pinned ids (tests/unit/data/criteo_test.cc), through the extension and the reference.
        for field, value, buckets, want in ((0, "", 0, 1948871140692137074), (0, "68fd1e64", 0, 7110095864571872725),
                                            (7, "68fd1e64", 1000000, 7613139)):
            self.assertEqual(_data.criteo_field_id(field, value, buckets), want)
            self.assertEqual(reference_field_id(field, value, buckets), want)

    def test_glob_plain_and_gzip_in_file_order(self):
        pattern = os.path.join(self.tmp, "day_*")
        files = _data.expand_criteo_paths(pattern)
        self.assertEqual(files, self.data.files)  # day_2 before day_10
        self.assertEqual(_data.expand_criteo_paths(pattern + "," + self.data.files[0]), self.data.files)
        reader = _data.CriteoReader(pattern)
        labels, dense, ids = self.read_all(reader, n=16)
        self.assertEqual(example_numbers(ids), self.data.examples())
        stats = reader.stats
        self.assertEqual((stats.examples, stats.bad_lines, stats.files), (90, 3, 4))
        self.assertEqual(len(reader.read(5)[0]), 0)  # the pass is over
        reader.rewind()
        self.assertEqual(reader.stats.pass_, 1)
        self.assertEqual(example_numbers(reader.read(3)[2]), [1, 2, 3])

    def test_sharding_by_file_and_by_line(self):
        everything = self.data.examples()
        for by, shards in (("file", 2), ("line", 3), ("auto", 2), ("auto", 5)):
            seen, bad = [], 0
            for r in range(shards):
                reader = _data.CriteoReader(self.data.files, shard_index=r, num_shards=shards, shard_by=by)
                applied = reader.shard_by
                seen += example_numbers(self.read_all(reader)[2])
                bad += reader.stats.bad_lines
                if applied == "file":
                    self.assertEqual(reader.files, self.data.files[r::shards])
            self.assertEqual(applied, {"file": "file", "line": "line"}.get(by, "file" if shards <= 4 else "line"))
            self.assertEqual(sorted(seen), everything, (by, shards))  # each example once
            self.assertEqual(bad, 3)  # each bad line counted by one shard
        # By line: shard r takes line k of each file with k % M == r.
        reader = _data.CriteoReader([self.data.files[0]], shard_index=1, num_shards=3, shard_by="line")
        self.assertEqual(example_numbers(self.read_all(reader)[2]), self.data.numbers[0][1::3])
        with self.assertRaises(ValueError) as e:  # 4 files by file leave shard 4 of 5 none
            _data.CriteoReader(self.data.files, shard_index=4, num_shards=5, shard_by="file")
        self.assertIn("shard by line instead", str(e.exception))
        with self.assertRaises(ValueError):
            _data.CriteoReader(self.data.files, shard_by="rows")

    def test_missing_files_raise_naming_them(self):
        missing = os.path.join(self.tmp, "nope.gz")
        for paths in (missing, [self.data.files[0], missing], self.data.files[0] + "," + missing):
            with self.assertRaises(FileNotFoundError) as e:
                _data.CriteoStream(paths)
            self.assertIn(missing, str(e.exception))
            self.assertEqual(e.exception.code, "NOT_FOUND")
        with self.assertRaises(FileNotFoundError) as e:
            _data.expand_criteo_paths(os.path.join(self.tmp, "week_*"))
        self.assertIn("week_*: no file matches", str(e.exception))

    def test_corrupt_gzip_raises(self):
        path = os.path.join(self.tmp, "corrupt.gz")
        write_criteo(path, [criteo_line(n) for n in range(1, 3000)])
        with open(path, "rb") as f:
            blob = bytearray(f.read())
        blob[len(blob) // 2: len(blob) // 2 + 64] = bytes(64)  # zeros in the deflate stream
        with open(path, "wb") as f:
            f.write(blob)
        reader = _data.CriteoReader(path)  # the header is fine
        with self.assertRaises(OSError) as e:
            self.read_all(reader, n=256)
        self.assertEqual(e.exception.code, "DATA_LOSS")
        self.assertIn(path, str(e.exception))
        with self.assertRaises(OSError):  # it stays failed
            reader.read(1)
        truncated = os.path.join(self.tmp, "truncated.gz")
        with open(truncated, "wb") as f:
            f.write(blob[: len(blob) // 3])
        stream = _data.CriteoStream(truncated)
        with self.assertRaises(OSError) as e:
            for _ in range(100):
                stream.next(256)
        self.assertIn(truncated, str(e.exception))

    def test_stream_passes_again_and_counts_them(self):
        for read_ahead in (False, True):
            stream = _data.CriteoStream(self.data.files[1], read_ahead=read_ahead)  # 25 examples, 3 bad lines
            got = []
            for _ in range(4):
                labels, dense, ids = stream.next(10)
                self.assertEqual((labels.shape, dense.shape, ids.shape), ((10,), (10, 13), (10, 26)))
                got += example_numbers(ids)
            one = self.data.examples([1])
            self.assertEqual(got, one + one[:15])  # the third batch spans two passes
            self.assertEqual(stream.pass_, 1)
            passes = stream.take_finished_passes()
            self.assertEqual([(p.pass_, p.examples, p.bad_lines) for p in passes], [(0, 25, 3)])
            self.assertEqual(len(passes[0].first_bad_lines), 3)
            self.assertEqual(stream.take_finished_passes(), [])
            stream.skip(10)  # to the end of pass 1
            self.assertEqual(example_numbers(stream.next(1)[2]), one[:1])
            self.assertEqual([p.pass_ for p in stream.take_finished_passes()], [1])
        limited = _data.CriteoStream(self.data.files[0], pass_limit=4, read_ahead=False)
        self.assertEqual(example_numbers(limited.next(10)[2]), [1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
        with self.assertRaises(ValueError):
            limited.next(0)
        bad_only = os.path.join(self.tmp, "bad.tsv")
        write_criteo(bad_only, [line for line, _ in BAD_LINES])
        with self.assertRaises(ValueError) as e:  # a whole pass without an example
            _data.CriteoStream(bad_only).next(1)
        self.assertIn("no usable example", str(e.exception))
        self.assertIn(bad_only + ":1:", str(e.exception))


@unittest.skipIf(torch is None, "python3-torch missing")
class TorchDatasetTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-data-python-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def check_batch(self, batch, rows, dense, fields):
        self.assertEqual(set(batch), {"labels", "dense", "ids"})
        self.assertEqual((batch["labels"].shape, batch["dense"].shape, batch["ids"].shape),
                         ((rows,), (rows, dense), (rows, fields)))
        self.assertEqual((batch["labels"].dtype, batch["dense"].dtype, batch["ids"].dtype),
                         (torch.float32, torch.float32, torch.int64))

    def test_synthetic_batches_follow_the_trainer_mapping(self):
        # 1003 examples over 4 shards: shards of 251, 251, 251, 250; batches of 64.
        n, shards, b = 1003, 4, 64
        gen = _data.SyntheticCtr(seed=5, vocab_sizes=[50, 60, 70], num_dense=2, zipf_exponent=1.1)
        for drop_last, sizes in ((False, [64, 64, 64, 59]), (True, [64, 64, 64])):
            seen = []
            for r in range(shards):
                ds = fdata.SyntheticCtrDataset(b, num_examples=n, epochs=2, data_seed=5, seed=8,
                                               vocab_sizes=[50, 60, 70], num_dense=2, shard_index=r,
                                               num_shards=shards, drop_last=drop_last)
                batches = list(ds)
                self.assertEqual(len(batches), len(ds))
                self.assertEqual(ds.steps_per_epoch, len(sizes))
                want_sizes = list(sizes)
                if not drop_last and r == 3:
                    want_sizes[-1] = 250 - 192  # the short shard's last batch
                self.assertEqual([len(x["labels"]) for x in batches], want_sizes * 2)
                for step, batch in enumerate(batches):
                    self.check_batch(batch, want_sizes[step % len(sizes)], 2, 3)
                    epoch, k = divmod(step, len(sizes))
                    order = _data.epoch_indices(n, r, shards, epoch, True, 8)
                    idx = order[k * b: k * b + len(batch["labels"])]
                    labels, dense, ids, _ = gen.generate(idx)
                    np.testing.assert_array_equal(batch["ids"].numpy(), ids)
                    np.testing.assert_array_equal(batch["dense"].numpy(), dense)
                    np.testing.assert_array_equal(batch["labels"].numpy(), labels)
                    if epoch == 0:
                        seen += idx.tolist()
            if not drop_last:
                self.assertEqual(sorted(seen), list(range(n)))  # every example once an epoch
        # steps: past the epochs' end, step t is step t % steps_per_epoch of epoch t // steps_per_epoch.
        ds = fdata.SyntheticCtrDataset(100, num_examples=350, steps=9, data_seed=2, seed=3, vocab_sizes=[40] * 4)
        batches = list(ds)
        self.assertEqual((len(batches), ds.steps_per_epoch), (9, 3))
        whole = _data.SyntheticCtr(seed=2, vocab_sizes=[40] * 4, num_dense=4)
        order = _data.epoch_indices(350, 0, 1, 2, True, 3)
        np.testing.assert_array_equal(batches[7]["ids"].numpy(), whole.generate(order[100:200])[2])
        self.assertEqual(len(fdata.SyntheticCtrDataset(num_examples=64)), 1)  # the trainer's defaults
        with self.assertRaises(ValueError):
            fdata.SyntheticCtrDataset(64, num_examples=10)  # not one batch
        with self.assertRaises(ValueError):
            fdata.SyntheticCtrDataset(64, num_examples=1000, shard_index=2, num_shards=2)

    def test_tensors_share_the_arrays_memory(self):
        made = []
        real = torch.from_numpy

        def spy(a):
            made.append(a)
            return real(a)

        ds = fdata.SyntheticCtrDataset(32, num_examples=100, vocab_sizes=[10] * 3)
        with mock.patch.object(fdata.torch, "from_numpy", side_effect=spy):
            batch = next(iter(ds))
        arrays = dict(zip(["labels", "dense", "ids"], made))
        for key, tensor in batch.items():
            self.assertEqual(tensor.data_ptr(), arrays[key].ctypes.data, key)  # no copy
            self.assertEqual(type(arrays[key].base).__name__, "PyCapsule")  # the C++ vector itself

    def test_synthetic_test_set_and_planted_auc(self):
        ds = fdata.SyntheticCtrDataset(64, num_examples=5000, data_seed=4, vocab_sizes=[200] * 6, num_dense=3)
        test = ds.test_set(3000)
        self.assertEqual(set(test), {"labels", "dense", "ids", "true_probs"})
        self.check_batch({k: v for k, v in test.items() if k != "true_probs"}, 3000, 3, 6)
        labels, dense, ids, probs = _data.SyntheticCtr(seed=4, vocab_sizes=[200] * 6, num_dense=3).generate_range(
            5000, 3000)  # the examples after the training set's
        np.testing.assert_array_equal(test["ids"].numpy(), ids)
        np.testing.assert_array_equal(test["true_probs"].numpy(), probs)
        self.assertGreater(_data.auc(test["true_probs"].numpy(), test["labels"].numpy()), 0.65)

    def test_synthetic_under_a_dataloader_with_workers(self):
        ds = fdata.SyntheticCtrDataset(50, num_examples=1234, epochs=2, vocab_sizes=[30] * 4, drop_last=False)
        alone = list(ds)
        loaded = list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        self.assertEqual(len(loaded), len(alone))
        self.assertEqual(len(loaded), len(ds))
        for a, b in zip(alone, loaded):  # the same batches in the same order
            for key in a:
                self.assertTrue(torch.equal(a[key], b[key]), key)

    def write_folder(self):
        return CriteoFolder(self.tmp)

    def test_criteo_one_pass(self):
        data = self.write_folder()
        pattern = os.path.join(self.tmp, "day_*")
        for read_ahead in (True, False):
            ds = fdata.CriteoDataset(pattern, 16, read_ahead=read_ahead)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                batches = list(ds)
            self.assertEqual([len(x["labels"]) for x in batches], [16] * 5 + [10])  # 90 examples
            for batch in batches:
                self.check_batch(batch, len(batch["labels"]), 13, 26)
            self.assertEqual([n for x in batches for n in example_numbers(x["ids"])], data.examples())
            first = batches[0]
            label, dense, ids = expected_row(1)
            self.assertEqual(float(first["labels"][0]), label)
            np.testing.assert_array_equal(first["dense"][0].numpy(), dense)
            np.testing.assert_array_equal(first["ids"][0].numpy(), ids)
            self.assertEqual([(p.examples, p.bad_lines) for p in ds.passes], [(90, 3)])
            self.assertEqual(ds.bad_lines, 3)
            bad = [w for w in caught if issubclass(w.category, fdata.CriteoBadLinesWarning)]
            self.assertEqual(len(bad), 1)
            self.assertIn("%s:%d:" % data.bad[0][:2], str(bad[0].message))
            with self.assertRaises(TypeError):
                len(ds)
        dropped = fdata.CriteoDataset(pattern, 16, drop_last=True)
        self.assertEqual([len(x["labels"]) for x in quietly(dropped)], [16] * 5)
        limited = fdata.CriteoDataset(data.files, 16, pass_limit=20)
        self.assertEqual([len(x["labels"]) for x in quietly(limited)], [16, 4])

    def test_criteo_steps_and_shards(self):
        data = self.write_folder()
        ds = fdata.CriteoDataset(data.files[:1], 8, steps=5)  # 30 examples: the 4th batch spans two passes
        with warnings.catch_warnings():
            warnings.simplefilter("error", fdata.CriteoBadLinesWarning)  # day_0 has no bad line
            batches = list(ds)
        self.assertEqual(len(ds), 5)
        self.assertEqual([len(x["labels"]) for x in batches], [8] * 5)
        got = [n for x in batches for n in example_numbers(x["ids"])]
        self.assertEqual(got, (data.examples([0]) * 2)[:40])
        self.assertEqual([(p.pass_, p.examples) for p in ds.passes], [(0, 30)])
        for shard_by in ("file", "line"):
            seen = []
            for r in range(2):
                ds = fdata.CriteoDataset(data.files, 7, shard_index=r, num_shards=2, shard_by=shard_by)
                self.assertEqual(ds.shard_by, shard_by)
                seen += [n for x in quietly(ds) for n in example_numbers(x["ids"])]
            self.assertEqual(sorted(seen), data.examples())
        missing = os.path.join(self.tmp, "gone.gz")
        with self.assertRaises(FileNotFoundError) as e:
            fdata.CriteoDataset([data.files[0], missing], 8)
        self.assertIn(missing, str(e.exception))

    def test_criteo_under_a_dataloader_with_workers(self):
        data = self.write_folder()
        for shard_by, shards in (("file", 2), ("line", 2), ("auto", 1)):
            seen = []
            for r in range(shards):
                ds = fdata.CriteoDataset(data.files, 6, shard_index=r, num_shards=shards, shard_by=shard_by)
                mine = [n for x in quietly(ds) for n in example_numbers(x["ids"])]
                loaded = quietly(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
                for batch in loaded:
                    self.check_batch(batch, len(batch["labels"]), 13, 26)
                    self.assertLessEqual(len(batch["labels"]), 6)
                numbers = [n for x in loaded for n in example_numbers(x["ids"])]
                self.assertEqual(sorted(numbers), sorted(mine), (shard_by, r))  # this shard's, once each
                seen += numbers
            self.assertEqual(sorted(seen), data.examples(), shard_by)
        ds = fdata.CriteoDataset(data.files, 6, steps=7)
        loaded = quietly(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        self.assertEqual([len(x["labels"]) for x in loaded], [6] * 7)
        # A pass limit is split between the loader workers: 20 examples in all, none twice.
        ds = fdata.CriteoDataset(data.files, 6, pass_limit=20)
        numbers = [n for x in quietly(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
                   for n in example_numbers(x["ids"])]
        self.assertEqual(len(numbers), 20)
        self.assertEqual(len(set(numbers)), 20)


if __name__ == "__main__":
    unittest.main()
