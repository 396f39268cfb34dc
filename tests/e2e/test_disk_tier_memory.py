"""A sync ctr job whose embedding tables need ten times the memory its servers may use: each
ferry-ps runs in a cgroup of its own (the v1 memory controller) whose limit it cannot exceed,
with the tables' rows beyond a small RAM tier on disk (--table 'ctr/emb*:disk_tier=1'). The job
must end with the test loss and AUC of the same job on servers without a limit and without the
tier, bit for bit; no row may be lost (none evicted; as many rows in RAM and on disk as the
unlimited servers hold; disk_tier_train_test checks the rows' values bit for bit); and the
limited servers must have stayed alive and under their limit (the kernel's own count of their
peak, memory.max_usage_in_bytes: what the store's files leave in the page cache counts, and the
kernel takes it back at the limit; the process's own memory it cannot take back).

Skipped, saying why, where this process cannot make memory cgroups (it needs root and a writable
/sys/fs/cgroup/memory) and in sanitizer builds (whose shadow memory alone passes the limit).
Real ferry-ps and ferry-trainer processes on 127.0.0.1; every process and cgroup is the test's
own and is removed at the end. Run by hand, from tests/e2e/:
    FERRY_BUILD_DIR=../../build python3 -m unittest -v test_disk_tier_memory
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest
import urllib.request

from build_paths import PS_BIN, TRAINER_BIN
from test_sync_cluster import Servers, run_workers

CGROUP_ROOT = "/sys/fs/cgroup/memory"
LIMIT = 72 << 20        # each server's cgroup: its whole memory, the program's own included
FIELDS, DIM = 8, 256    # the ctr model's tables and their rows: 256 floats + Adam's 2 x 256 state
STEPS, BATCH = 330, 256
ROW_BYTES = 3 * DIM * 4  # a row's value and optimizer state alone, without any index
RAM_ROWS = 256          # the RAM tier: rows per server and table (and rows on probation beside it)

CTR = ["--model", "ctr", "--optimizer", "adam", "--lr", "0.01", "--batch", str(BATCH), "--ctr-fields", str(FIELDS),
       "--emb-dim", str(DIM), "--ctr-vocab", str(1 << 40), "--ctr-zipf", "1.1", "--ctr-train", str(2 * BATCH * STEPS),
       "--ctr-test", "4000", "--hidden", "16", "--steps", str(STEPS), "--seed", "3", "--consistency", "sync",
       "--log-every", "100000", "--blas-threads", "1"]


def why_no_cgroups():
    """Why this process cannot run servers in memory cgroups of its own, or None."""
    if os.environ.get("FERRY_SANITIZE"):
        return f"a sanitizer build (FERRY_SANITIZE={os.environ['FERRY_SANITIZE']}): its shadow memory passes the limit"
    if not os.path.isfile(os.path.join(CGROUP_ROOT, "memory.limit_in_bytes")):
        return f"no cgroup v1 memory controller at {CGROUP_ROOT}"
    probe = os.path.join(CGROUP_ROOT, f"ferry-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as e:
        return f"cannot make a memory cgroup in {CGROUP_ROOT}: {e}"
    return None


class LimitedServers(Servers):
    """ferry-ps processes on 127.0.0.1, each in a memory cgroup of its own limited to `limit`
    bytes (None: no cgroup), with Prometheus metrics; stopped and their cgroups removed on exit."""

    def __init__(self, n, limit, extra_args_of_rank):
        self.procs, self.endpoints, self.metrics, self.groups = [], [], [], []
        try:
            for r in range(n):
                group = None
                if limit is not None:
                    group = os.path.join(CGROUP_ROOT, f"ferry-test-{os.getpid()}-{r}")
                    os.mkdir(group)
                    self.groups.append(group)
                    with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
                        f.write(str(limit))

                def enter(group=group):  # in the child, before exec: into its cgroup
                    if group:
                        with open(os.path.join(group, "cgroup.procs"), "w") as f:
                            f.write(str(os.getpid()))
                p = subprocess.Popen([PS_BIN, "--bind", "tcp://127.0.0.1:0", "--rank", str(r), "--num-servers", str(n),
                                      "--compute-threads", "1", "--metrics", "127.0.0.1:0", "--max-wait-s", "120"]
                                     + extra_args_of_rank(r), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, preexec_fn=enter)
                self.procs.append(p)
                for _ in range(2):  # "listening on tcp://..." and "metrics at http://..."
                    line = p.stdout.readline()
                    if m := re.search(r"listening on (tcp://\S+)", line):
                        self.endpoints.append(m.group(1))
                    if m := re.search(r"metrics at (http://\S+)", line):
                        self.metrics.append(m.group(1))
                if len(self.endpoints) != r + 1 or len(self.metrics) != r + 1:
                    raise RuntimeError(f"ferry-ps {r} did not report its endpoint and metrics: {line!r}")
        except BaseException:
            self.stop()
            raise

    def scrape(self, r):
        """Server r's metrics: {name{labels}: value}."""
        with urllib.request.urlopen(self.metrics[r], timeout=30) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def memory(self, r, name):
        with open(os.path.join(self.groups[r], name)) as f:
            return f.read()

    def stop(self):
        super().stop()  # the processes (SIGKILL after SIGTERM), then their cgroups
        for group in self.groups:
            for _ in range(50):  # the cgroup empties once its process is reaped
                try:
                    os.rmdir(group)
                    break
                except OSError:
                    time.sleep(0.1)


def table_sum(metrics, name):
    """The sum over the ctr tables of a per-table metric."""
    return sum(v for k, v in metrics.items() if k.startswith(name + "{") and 'table="ctr/emb' in k)


def server_sum(metrics, name):
    """A per-server metric (one series)."""
    return sum(v for k, v in metrics.items() if k.startswith(name + "{"))


NO_CGROUPS = why_no_cgroups()


@unittest.skipIf(NO_CGROUPS, NO_CGROUPS)
class DiskTierUnderAMemoryLimitTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ferry-disk-tier-memory-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def train(self, servers, tag, extra):
        res = run_workers(servers, 2, lambda r: CTR + extra, self.tmp, tag, timeout=600)
        for rank, (rc, out, end) in enumerate(res):
            self.assertEqual(rc, 0, f"{tag} worker {rank}: {out[-3000:]}")
            self.assertIsNotNone(end, f"{tag} worker {rank}: no end record")
        return [end for _, _, end in res]

    def test_a_job_needing_ten_times_the_servers_memory_trains_to_the_bits_of_one_without_a_limit(self):
        # The unlimited job's tables have row lifecycle settings too, with room for every row: a
        # pull of an id no push has made then makes no row in either job.
        with LimitedServers(2, None, lambda r: []) as free:
            want = self.train(free, "ram", ["--table", f"ctr/emb*:max_rows={1 << 40}"])
            rows_ram = [table_sum(free.scrape(r), "ferry_table_rows") for r in range(2)]
        tier = os.path.join(self.tmp, "tier")
        with LimitedServers(2, LIMIT, lambda r: ["--disk-tier-dir", os.path.join(tier, f"server-{r}"),
                                                 "--disk-tier-cache-mb", "1"]) as limited:
            got = self.train(limited, "tiered", ["--table", f"ctr/emb*:max_rows={RAM_ROWS},disk_tier=1"])
            metrics = [limited.scrape(r) for r in range(2)]
            for r in range(2):
                self.assertIsNone(limited.procs[r].poll(), f"server {r} died: {limited.procs[r].returncode}")
            peaks = [int(limited.memory(r, "memory.max_usage_in_bytes")) for r in range(2)]
            limits = [int(limited.memory(r, "memory.limit_in_bytes")) for r in range(2)]
            failcnt = [int(limited.memory(r, "memory.failcnt")) for r in range(2)]
            # What the cgroup holds at the end: the process's own memory (rss) and the page cache
            # of the store's files (cache), which the kernel takes back when the limit is met.
            stat = [dict(line.split() for line in limited.memory(r, "memory.stat").splitlines()) for r in range(2)]
        for r in range(2):
            # The same test loss and AUC, bit for bit (JSON keeps a double's 17 digits).
            self.assertEqual(got[r].get("final"), want[r].get("final"), f"worker {r}")
        for r in range(2):
            m = metrics[r]
            # Rows on disk: those demoted less those promoted back (the store's own count is an
            # estimate, and keeps stale copies of promoted rows until compaction).
            ram = table_sum(m, "ferry_table_rows")
            disk = table_sum(m, "ferry_table_rows_demoted_total") - table_sum(m, "ferry_table_rows_promoted_total")
            evicted = table_sum(m, "ferry_table_rows_evicted_capacity_total") + \
                table_sum(m, "ferry_table_rows_evicted_age_total")
            print(f"\n  server {r}: {ram:.0f} rows in RAM, {disk:.0f} on disk, {rows_ram[r]:.0f} in the unlimited "
                  f"run ({table_sum(m, 'ferry_table_disk_bytes') / 2**20:.0f} MiB of files); {ram + disk:.0f} rows x {ROW_BYTES} B = {(ram + disk) * ROW_BYTES / 2**20:.0f} MiB of values "
                  f"and state under a limit of {limits[r] / 2**20:.0f} MiB; peak {peaks[r] / 2**20:.1f} MiB, "
                  f"the limit met {failcnt[r]} times; at the end rss {int(stat[r]['rss']) / 2**20:.1f} MiB, page cache "
                  f"{int(stat[r]['cache']) / 2**20:.1f} MiB; rows read for requests by the disk readers "
                  f"{server_sum(m, 'ferry_disk_tier_rows_read_ahead_total'):.0f}, by the I/O thread "
                  f"{server_sum(m, 'ferry_disk_tier_rows_read_inline_total'):.0f}, kept at the end "
                  f"{server_sum(m, 'ferry_disk_tier_rows_kept'):.0f}", flush=True)
            self.assertEqual(limits[r], LIMIT)
            self.assertLessEqual(peaks[r], LIMIT)
            self.assertEqual(evicted, 0, f"server {r} evicted rows")
            self.assertEqual(ram + disk, rows_ram[r], f"server {r}: rows lost or made")
            # The RAM tiers, and beside them at most a step's rows on probation.
            self.assertLessEqual(ram, FIELDS * (RAM_ROWS + 2 * BATCH), f"server {r}: the RAM tier over its rows")
            # Ten times the memory the server may use, counting the rows' values and state alone.
            self.assertGreaterEqual((ram + disk) * ROW_BYTES, 10 * LIMIT, f"server {r}: too few rows to prove it")


if __name__ == "__main__":
    unittest.main()
