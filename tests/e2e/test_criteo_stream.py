"""Criteo-format files much larger than the reader's buffer train end to end with bounded memory.

ferry-trainer --local trains the ctr model on generated gzipped Criteo-format files (the 40
tab-separated columns, 8-hex-digit categorical values) twice, for the same number of steps: on
a small set (2 files, about 6 MB of text) and on a large one (4 files, about 100 MB of text,
100 times the reader's 1 MiB buffer). Each run reads all of its files at least once (its "pass"
events say so) and reports its peak resident memory in its "end" event. Streaming, the peak does
not grow with the data; holding the training set (about 264 bytes an example, as the trainer
once did) would add about 80 MB for the large set.

Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it. Run by hand:
  FERRY_BUILD_DIR=build python3 -m unittest -v test_criteo_stream   (from tests/e2e/)

Every process is started by the test with a deadline.
"""

import gzip
import json
import os
import random
import shutil
import subprocess
import tempfile
import unittest

from build_paths import TRAINER_BIN

BATCH = 4096
# A sanitizer build (FERRY_SANITIZE, set by ctest) keeps freed memory in quarantine and adds
# shadow memory, so its peak RSS says nothing of the reader's; there the files are smaller (the
# run is 5-10x slower) and the bound is not checked.
SANITIZED = bool(os.environ.get("FERRY_SANITIZE"))
# The large set's text is about 100 MB; holding it as examples would take about 80 MB more than
# the small set's. Streaming, the two peaks may differ by allocator noise, far below that.
MAX_PEAK_GROWTH_KIB = 24 * 1024


def write_files(folder, files, lines_per_file, seed, prefix="day_"):
    """Gzipped Criteo-format files day_0.gz ..; labels 90% set by C1. Returns the line count.
    The values of each field are the same for every seed; the lines differ."""
    rng = random.Random(1)
    pools = [["%08x" % rng.getrandbits(32) for _ in range(64)] for _ in range(26)]
    tails = []
    for _ in range(2048):  # the 13 integers and C2..C26 of a line
        ints = [str(rng.randrange(1000)) for _ in range(13)]
        cats = [rng.choice(pools[f]) for f in range(1, 26)]
        tails.append("\t".join(ints) + "\t%s\t" + "\t".join(cats))
    rng.seed(seed)
    for i in range(files):
        out = []
        for _ in range(lines_per_file):
            c1 = rng.randrange(64)
            click = (c1 < 32) != (rng.random() < 0.1)
            out.append(("1\t" if click else "0\t") + rng.choice(tails) % pools[0][c1])
        with gzip.open(os.path.join(folder, "%s%d.gz" % (prefix, i)), "wt", compresslevel=1) as f:
            f.write("\n".join(out) + "\n")
    return files * lines_per_file


@unittest.skipUnless(os.path.exists(TRAINER_BIN), "ferry-trainer not built")
class CriteoStreamTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-criteo-stream-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def train(self, name, files, lines_per_file, steps):
        folder = os.path.join(self.tmp, name)
        os.mkdir(folder)
        lines = write_files(folder, files, lines_per_file, seed=files)
        write_files(self.tmp, 1, 2000, seed=99, prefix=name + "_test_")
        test = os.path.join(self.tmp, name + "_test_0.gz")
        metrics = os.path.join(self.tmp, name + ".jsonl")
        argv = [TRAINER_BIN, "--local", "--device", "cpu", "--model", "ctr", "--emb-dim", "4", "--hidden", "16",
                "--optimizer", "adam", "--lr", "0.01", "--batch", str(BATCH), "--steps", str(steps),
                "--criteo-train", os.path.join(folder, "day_*.gz"), "--criteo-test", test,
                "--blas-threads", "1", "--log-every", "100000", "--metrics-out", metrics]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        with open(metrics) as f:
            events = [json.loads(line) for line in f]
        passes = [e for e in events if e["event"] == "pass"]
        end = [e for e in events if e["event"] == "end"][0]
        data_bytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
        print("%s: %d lines in %d files (%.1f MB gzipped, %.1f MB of text); %d pass(es); peak RSS %.1f MiB; AUC %.4f"
              % (name, lines, files, data_bytes / 1e6, passes[0]["bytes"] / 1e6 if passes else 0, len(passes),
                 end["peak_rss_kib"] / 1024, end["final"]["auc"]))
        self.assertGreaterEqual(len(passes), 1, "the files were not read to their end")
        self.assertEqual(passes[0]["examples"], lines)
        self.assertEqual(passes[0]["files"], files)
        self.assertEqual(passes[0]["bad_lines"], 0)
        return passes[0]["bytes"], end

    def test_peak_memory_does_not_grow_with_the_files(self):
        per_file = 15000 if SANITIZED else 90000
        steps = 4 * per_file // BATCH + 2  # the large set is read to its end once
        small_bytes, small = self.train("small", 2, 10000, steps)
        large_bytes, large = self.train("large", 4, per_file, steps)
        if SANITIZED:
            print("peak RSS not compared: a %s build" % os.environ["FERRY_SANITIZE"])
            self.assertGreater(large["final"]["auc"], 0.65)  # 16 steps: learning, not learnt (0.5: chance)
            return
        self.assertGreater(large_bytes, 80e6, "the large set is smaller than planned")
        self.assertGreater(large_bytes, 50 * (1 << 20), "not much larger than the 1 MiB read buffer")
        growth = large["peak_rss_kib"] - small["peak_rss_kib"]
        print("peak RSS grew by %d KiB for %.0f MB more text" % (growth, (large_bytes - small_bytes) / 1e6))
        self.assertLess(growth, MAX_PEAK_GROWTH_KIB)
        # And it learned: C1 sets 90% of the labels.
        self.assertGreater(large["final"]["auc"], 0.8)

    def test_a_file_without_line_ends_ends_the_run_naming_it(self):
        # /dev/zero has no line end: it was read past forever (the run hung until killed). Now
        # the reader gives up after 64 times the longest line and the trainer exits, naming it.
        write_files(self.tmp, 1, 200, seed=7, prefix="test_")
        argv = [TRAINER_BIN, "--local", "--device", "cpu", "--model", "ctr", "--emb-dim", "4", "--hidden", "16",
                "--steps", "10", "--batch", "64", "--criteo-train", "/dev/zero",
                "--criteo-test", os.path.join(self.tmp, "test_0.gz"), "--blas-threads", "1"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        # Exit status 2 (INVALID_ARGUMENT): a restart would read the same file and fail the same way.
        self.assertEqual(done.returncode, 2, done.stdout + done.stderr)
        self.assertIn("/dev/zero: no line end in ", done.stderr)
        self.assertIn("not text lines", done.stderr)


if __name__ == "__main__":
    unittest.main()
