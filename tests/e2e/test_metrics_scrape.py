"""Both metrics endpoints of a real run, scraped the way Prometheus does: a ferry-ps and a
ferry-trainer process on 127.0.0.1, each with --metrics 127.0.0.1:0, while the trainer trains
(sync dense tables, async embedding tables).

Every series is checked against Prometheus' conventions: each family has # HELP and # TYPE, a
counter's name ends in _total (and only a counter's), units are in the name (_seconds, _bytes; no
_ms, _kib, ...), the worker rank and the table are labels (no digits or table names in a name), and
only tables that have staleness get the staleness histogram. `promtool check metrics` checks both
pages when promtool is installed (build.sh installs prometheus); without it that test says it is
skipped. The Grafana dashboard (launch/grafana/ferry.json) must query only names served here.
A Python worker (ferry.torch, told FERRY_METRICS as ferry-launch tells it) serves the trainer's
names under the same conventions, with its steps, examples and time on them.

Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it. Run by hand:
  FERRY_BUILD_DIR=build python3 -m unittest -v test_metrics_scrape   (from tests/e2e/)

Every process is started by the test with a deadline and killed at the end.
"""

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

from build_paths import BUILD_DIR, PS_BIN, TRAINER_BIN

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(HERE, "..", "..", "launch", "grafana", "ferry.json")
DEADLINE_S = 90  # for each process's line, and for the trainer's first steps

TRAINER_ARGS = ["--device", "cpu", "--model", "ctr", "--ctr-train", "20000", "--ctr-test", "1000",
                "--batch", "64", "--steps", "1000000", "--consistency", "sync",
                "--table", "ctr/emb*:consistency=async", "--blas-threads", "1", "--log-every", "1000000"]


# A ferry.torch worker that trains until stopped (async tables: it waits for nobody), recording
# each step on its metrics page.
PYTHON_WORKER = """
import torch
import ferry.torch as ft
session = ft.init()
emb = ft.EmbeddingBagCollection([ft.EmbeddingBagConfig("emb", 4, consistency="async")], prefix="py/")
head = ft.ServerParameters(torch.nn.Linear(4, 1), prefix="py/head/", consistency="async")
for step in range(1, 10 ** 7):
    loss = (head(emb({"emb": torch.randint(0, 100, (32, 2))})["emb"]) ** 2).mean()
    loss.backward()
    session.record(step, 32 * step, float(loss))
"""


class Process:
    """A child process whose output lines a thread collects; killed (after SIGTERM) by stop()."""

    def __init__(self, argv, env=None):
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, pattern, deadline):
        """The first match of `pattern` in the lines to come, or None at the deadline (or exit)."""
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    return None
                continue
            self.output.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def parse(page):
    """(families, samples) of a text exposition: families name -> {"help", "type"} in order of
    appearance; samples [(family, sample name, {label: value}, value, line)]."""
    families, samples = {}, []
    label_re = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    for line in page.splitlines():
        if not line:
            continue
        m = re.match(r"# (HELP|TYPE) (\S+) ?(.*)$", line)
        if m:
            families.setdefault(m.group(2), {})[m.group(1).lower()] = m.group(3)
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$", line)
        if not m:
            raise AssertionError(f"not a sample line: {line!r}")
        name = m.group(1)
        family = name
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[:-len(suffix)]
            if name.endswith(suffix) and families.get(base, {}).get("type") == "histogram":
                family = base
        labels = dict(label_re.findall(m.group(2) or ""))
        samples.append((family, name, labels, float(m.group(3)), line))
    return families, samples


UNIT_WORDS = re.compile(r"(^|_)(ms|us|ns|msec|usec|millis|micros|sec|secs|kib|mib|gib|kb|mb|gb)(_|$)")


def convention_problems(page, rank_label, tables):
    """What breaks the naming conventions on one page, as readable lines ([] when none)."""
    problems = []
    families, samples = parse(page)
    for name, f in families.items():
        if not f.get("help"):
            problems.append(f"{name}: no # HELP")
        kind = f.get("type")
        if kind not in ("counter", "gauge", "histogram", "summary"):
            problems.append(f"{name}: # TYPE is {kind!r}")
        if (kind == "counter") != name.endswith("_total"):
            problems.append(f"{name}: a {kind} " + ("must end in _total" if kind == "counter" else
                                                    "must not end in _total"))
        if re.search(r"\d", name):
            problems.append(f"{name}: a number in a name (ranks and ids are labels)")
        if UNIT_WORDS.search(name):
            problems.append(f"{name}: a unit other than seconds or bytes")
        for word in ("seconds", "bytes"):
            if word in name and not re.search(rf"_{word}(_total)?$", name):
                problems.append(f"{name}: '{word}' must be the name's unit suffix")
        for table in tables:
            if re.sub(r"\W", "_", table) in name:
                problems.append(f"{name}: holds the table name {table!r}")
    for family, name, labels, _, line in samples:
        if family not in families:
            problems.append(f"{line}: no # HELP / # TYPE for {family}")
        if family.startswith(("ferry_", "process_")) and rank_label not in labels:
            problems.append(f"{line}: no {rank_label} label")
    return problems


@unittest.skipUnless(os.path.exists(PS_BIN) and os.path.exists(TRAINER_BIN), "ferry-ps / ferry-trainer not built")
class MetricsScrapeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ps = Process([PS_BIN, "--bind", "tcp://127.0.0.1:0", "--rank", "0", "--num-servers", "1",
                          "--compute-threads", "1", "--max-wait-s", "30", "--metrics", "127.0.0.1:0"])
        cls.trainer = None
        try:
            deadline = time.monotonic() + DEADLINE_S
            endpoint = cls.ps.wait_for(r"listening on (tcp://\S+)", deadline)
            ps_url = cls.ps.wait_for(r"metrics at (http://\S+)", deadline)
            if not endpoint or not ps_url:
                raise AssertionError("ferry-ps did not start: " + "".join(cls.ps.output))
            cls.trainer = Process([TRAINER_BIN, "--servers", endpoint.group(1), "--rank", "0", "--num-workers", "1",
                                   "--metrics", "127.0.0.1:0"] + TRAINER_ARGS)
            trainer_url = cls.trainer.wait_for(r"ferry-trainer rank 0: metrics at (http://\S+)", deadline)
            if not trainer_url:
                raise AssertionError("ferry-trainer did not say where its metrics are: " + "".join(cls.trainer.output))
            # While it trains: once it has done some steps (every series is there from the start).
            while True:
                cls.trainer_page = scrape(trainer_url.group(1))
                _, samples = parse(cls.trainer_page)
                step = [v for f, _, _, v, _ in samples if f == "ferry_trainer_step"]
                if step and step[0] >= 5:
                    break
                if time.monotonic() > deadline or cls.trainer.proc.poll() is not None:
                    raise AssertionError("the trainer did no steps: " + "".join(cls.trainer.output))
                time.sleep(0.2)
            cls.ps_page = scrape(ps_url.group(1))
            if cls.trainer.proc.poll() is not None:
                raise AssertionError("the trainer ended before the scrapes: " + "".join(cls.trainer.output))
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        if cls.trainer:
            cls.trainer.stop()
        cls.ps.stop()

    def tables(self):
        _, samples = parse(self.ps_page)
        return sorted({labels["table"] for f, _, labels, _, _ in samples if f == "ferry_table_rows"})

    def test_every_series_follows_the_conventions(self):
        tables = self.tables()
        self.assertEqual(convention_problems(self.ps_page, "server", tables), [], self.ps_page)
        self.assertEqual(convention_problems(self.trainer_page, "worker", tables), [], self.trainer_page)

    def test_the_pages_hold_the_series_the_readme_lists(self):
        ps, ps_samples = parse(self.ps_page)
        for name in ("ferry_messages_total", "ferry_received_bytes_total", "ferry_connections_open",
                     "ferry_request_service_seconds", "ferry_table_rows", "ferry_table_pull_requests_total",
                     "ferry_table_staleness_versions", "process_resident_memory_bytes",
                     "process_cpu_seconds_total", "process_open_fds"):
            self.assertIn(name, ps)
        trainer, trainer_samples = parse(self.trainer_page)
        for name in ("ferry_trainer_step", "ferry_trainer_examples_total", "ferry_trainer_loss",
                     "ferry_trainer_time_seconds_total", "ferry_trainer_sent_bytes_total",
                     "process_resident_memory_bytes", "process_cpu_seconds_total"):
            self.assertIn(name, trainer)

        def value(samples, name, **labels):
            return [v for f, n, l, v, _ in samples if n == name and labels.items() <= l.items()]

        # What the run did is on them: the trainer's steps and examples, the server's requests.
        self.assertGreater(value(trainer_samples, "ferry_trainer_examples_total", worker="0")[0], 0)
        self.assertEqual(sorted(l["part"] for f, _, l, _, _ in trainer_samples
                                if f == "ferry_trainer_time_seconds_total"),
                         ["compute", "eval", "pull", "push", "wait"])
        self.assertGreater(value(ps_samples, "ferry_request_service_seconds_count", kind="PullSparseTables")[0], 0)
        self.assertGreater(value(ps_samples, "process_resident_memory_bytes", server="0")[0], 0)
        self.assertGreater(value(trainer_samples, "process_resident_memory_bytes", worker="0")[0], 0)

    def test_only_tables_with_staleness_have_its_histogram(self):
        _, samples = parse(self.ps_page)
        stale = sorted({l["table"] for f, _, l, _, _ in samples if f == "ferry_table_staleness_versions"})
        tables = self.tables()
        embeddings = [t for t in tables if re.fullmatch(r"ctr/emb\d+", t)]
        self.assertTrue(embeddings, tables)
        self.assertEqual(stale, embeddings)  # async; the dense (sync) tables have none
        self.assertGreater(len(tables), len(embeddings))

    def test_promtool_accepts_both_pages(self):
        promtool = shutil.which("promtool")
        if promtool is None:
            self.skipTest("promtool not found (Debian package prometheus; build.sh installs it): "
                          "`promtool check metrics` skipped")
        for who, page in (("ferry-ps", self.ps_page), ("ferry-trainer", self.trainer_page)):
            r = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True,
                               timeout=60)
            self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""), f"{who}:\n{page}")

    @unittest.skipIf(os.environ.get("FERRY_SANITIZE"), "a sanitizer build: its Python module cannot load into "
                     "Debian's uninstrumented python3 (the plain build runs this)")
    def test_a_python_worker_serves_the_trainers_names(self):
        """ferry.torch with FERRY_METRICS: the families of ferry-trainer's page, the conventions,
        promtool, and what it did: its steps and examples, its time by part adding up to its wall
        time, the bytes its client moved."""
        ps = Process([PS_BIN, "--bind", "tcp://127.0.0.1:0", "--compute-threads", "1", "--max-wait-s", "30"])
        worker = None
        try:
            deadline = time.monotonic() + DEADLINE_S
            endpoint = ps.wait_for(r"listening on (tcp://\S+)", deadline)
            self.assertTrue(endpoint, "".join(ps.output))
            env = dict(os.environ, FERRY_SERVERS=endpoint.group(1), FERRY_RANK="0", FERRY_NUM_WORKERS="1",
                       FERRY_METRICS="127.0.0.1:0", PYTHONPATH=os.path.join(BUILD_DIR, "python"))
            python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
            worker = Process([python, "-c", PYTHON_WORKER], env=env)
            url = worker.wait_for(r"\[worker 0\] metrics at (http://\S+)", deadline)
            self.assertTrue(url, "".join(worker.output))
            while True:
                page = scrape(url.group(1))
                families, samples = parse(page)
                step = [v for f, _, _, v, _ in samples if f == "ferry_trainer_step"]
                if step and step[0] >= 5:
                    break
                self.assertLess(time.monotonic(), deadline, "the worker did no steps: " + "".join(worker.output))
                self.assertIsNone(worker.proc.poll(), "".join(worker.output))
                time.sleep(0.2)
        finally:
            if worker:
                worker.stop()
            ps.stop()
        self.assertEqual(sorted(families), sorted(parse(self.trainer_page)[0]), page)
        self.assertEqual(convention_problems(page, "worker", ["py/emb"]), [], page)

        def value(name, **labels):
            return [v for f, n, l, v, _ in samples if n == name and labels.items() <= l.items()]

        step = value("ferry_trainer_step", worker="0")[0]
        self.assertEqual(value("ferry_trainer_examples_total", worker="0")[0], 32 * step)
        parts = {l["part"]: v for f, _, l, v, _ in samples if f == "ferry_trainer_time_seconds_total"}
        self.assertEqual(sorted(parts), ["compute", "eval", "pull", "push", "wait"])
        self.assertGreater(parts["pull"], 0)
        self.assertGreater(parts["push"], 0)
        self.assertGreater(value("ferry_trainer_sent_bytes_total", worker="0")[0], 0)
        self.assertGreater(value("ferry_trainer_received_bytes_total", worker="0")[0], 0)
        promtool = shutil.which("promtool")
        if promtool is not None:
            r = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
            self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""), page)

    def test_the_dashboard_queries_only_served_names(self):
        with open(DASHBOARD) as f:
            dashboard = json.load(f)
        served = set(parse(self.ps_page)[0]) | set(parse(self.trainer_page)[0])
        exprs = []

        def walk(node):
            if isinstance(node, dict):
                for k, v in node.items():
                    if k in ("expr", "query") and isinstance(v, str):
                        exprs.append(v)
                    walk(v)
            elif isinstance(node, list):
                for v in node:
                    walk(v)

        walk(dashboard)
        self.assertGreater(len(exprs), 5)
        for expr in exprs:
            for name in re.findall(r"\b((?:ferry|process)_[a-z_]+)\b", expr):
                family = re.sub(r"_(bucket|sum|count)$", "", name)
                self.assertTrue(name in served or family in served, f"{name} in {expr!r} is not served")


if __name__ == "__main__":
    unittest.main()
