"""TF_CONFIG end to end: ferry-ps and ferry-trainer processes that get their cluster only from
the TF_CONFIG environment variable, as under Kubeflow's TFJob (here on 127.0.0.1).

Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it. Run by hand:
  FERRY_BUILD_DIR=build python3 -m unittest -v test_tf_config   (from tests/e2e/)

Every process is started by the test with a deadline and killed at the end.
"""

import json
import os
import re
import socket
import subprocess
import tempfile
import unittest

from build_paths import PS_BIN, TRAINER_BIN

JOB = ["--model", "ctr", "--batch", "8", "--ctr-fields", "2", "--ctr-train", "2000", "--ctr-test", "200",
       "--consistency", "sync", "--steps", "30", "--log-every", "100000", "--blas-threads", "1",
       "--device", "cpu"]


def free_ports(n):
    """n ports free on 127.0.0.1 just now (the servers bind them right after)."""
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def env_with(config):
    env = dict(os.environ)
    env["TF_CONFIG"] = config
    return env


@unittest.skipUnless(os.path.exists(PS_BIN) and os.path.exists(TRAINER_BIN), "ferry-ps / ferry-trainer not built")
class TfConfigTest(unittest.TestCase):
    def setUp(self):
        self.procs = []
        self.tmp = tempfile.mkdtemp(prefix="ferry-tfconfig-test-")

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout:
                p.stdout.close()

    def start(self, argv, config):
        p = subprocess.Popen(argv, env=env_with(config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        self.procs.append(p)
        return p

    def test_servers_and_workers_take_the_cluster_from_tf_config(self):
        ports = free_ports(2)
        cluster = {"ps": [f"127.0.0.1:{p}" for p in ports],
                   "chief": ["chief-0.example:2222"], "worker": ["worker-0.example:2222"]}
        for i in range(2):
            ps = self.start([PS_BIN, "--compute-threads", "1", "--max-wait-s", "60"], tf_config(cluster, "ps", i))
            banner = ps.stdout.readline() + ps.stdout.readline()
            self.assertIn(f"cluster from TF_CONFIG (ps {i} of 2)", banner)
            self.assertRegex(banner, rf"rank {i} of 2 listening on tcp://127\.0\.0\.1:{ports[i]}\b")
        workers = []
        for task, index in (("chief", 0), ("worker", 0)):
            metrics = os.path.join(self.tmp, f"{task}.jsonl")
            workers.append((task, metrics, self.start([TRAINER_BIN, "--metrics-out", metrics] + JOB,
                                                      tf_config(cluster, task, index))))
        for task, metrics, p in workers:
            out, _ = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, out)
            rank = 0 if task == "chief" else 1
            self.assertIn(f"cluster: from TF_CONFIG ({task} 0): worker {rank} of 2, 2 server(s)", out)
            with open(metrics) as f:
                events = [json.loads(line) for line in f]
            end = [e for e in events if e["event"] == "end"][0]
            # A sync job of two workers: both ran the 30 steps together, every push counted.
            self.assertEqual(end["pushes_used"], 30, out)
            self.assertEqual(end["global_step"], 29, out)

    def test_each_program_refuses_the_other_programs_task(self):
        cluster = {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}
        ps = self.start([PS_BIN], tf_config(cluster, "worker", 0))
        out, _ = ps.communicate(timeout=30)
        self.assertEqual(ps.returncode, 2, out)
        self.assertIn("this task is worker 0: run ferry-trainer there", out)
        trainer = self.start([TRAINER_BIN] + JOB, tf_config(cluster, "ps", 0))
        out, _ = trainer.communicate(timeout=30)
        self.assertEqual(trainer.returncode, 2, out)
        self.assertIn("this task is ps 0: run ferry-ps there", out)

    def test_a_malformed_tf_config_is_refused_saying_where(self):
        ps = self.start([PS_BIN], '{"cluster": {"ps": ["a"], "worker": ["b:1"]}, "task": {"type": "ps", "index": 0}}')
        out, _ = ps.communicate(timeout=30)
        self.assertEqual(ps.returncode, 2, out)
        self.assertIn("TF_CONFIG: cluster.ps[0]: 'a' has no port", out)
        # Flags win: with --bind the same broken TF_CONFIG is not read.
        ok = self.start([PS_BIN, "--bind", "tcp://127.0.0.1:0"], "{broken")
        line = ok.stdout.readline()
        self.assertRegex(line, r"listening on tcp://127\.0\.0\.1:\d+")


if __name__ == "__main__":
    unittest.main()
