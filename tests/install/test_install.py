"""An installed Ferry, used from outside the tree: `cmake --install` into a temporary prefix,
then a separate project built against it with find_package(Ferry) (a C++ program on ferry::client
and the C ABI test program on ferry::c), the same C++ program built with pkg-config, and the
installed Python module, each run against the installed ferry-ps on 127.0.0.1; and the installed
launcher (bin/ferry-launch, through a link in another folder) running short jobs of the installed
ferry-ps with the installed ferry-trainer, and with a Python worker program on the installed
module.

Needs FERRY_BUILD_DIR (the CMake build dir; ctest sets it).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_DIR = os.path.abspath(os.environ.get("FERRY_BUILD_DIR", os.path.join(SOURCE, "build")))
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
from test_sync_cluster import Servers  # noqa: E402  (ferry-ps processes on 127.0.0.1, stopped at the end)


# A worker program for the installed launcher: two sync steps of a dense table on the installed
# module (FERRY_SERVERS, FERRY_RANK, FERRY_NUM_WORKERS from the launcher; `ferry` from the
# PYTHONPATH it sets); each step's gradient is 1 everywhere, so w ends at -lr * steps.
LAUNCHED_PROGRAM = textwrap.dedent("""\
    import os, numpy as np, ferry
    rank, n = int(os.environ["FERRY_RANK"]), int(os.environ["FERRY_NUM_WORKERS"])
    w = np.empty(4, np.float32)
    with ferry.Client(os.environ["FERRY_SERVERS"].split(","), rank=rank, num_workers=n,
                      request_timeout=60) as c:
        c.declare_dense("launched_w", (4,), optimizer="sgd", lr=0.5, consistency="sync")
        for step in range(2):
            c.pull_dense("launched_w", w, step=step).wait()
            c.push_dense("launched_w", np.ones(4, np.float32), step=step).wait()
        c.pull_dense("launched_w", w, step=2).wait()
    print(f"program {rank}: {ferry.__file__} {w.tolist()}", flush=True)
    """)


def run(argv, timeout, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


class InstalledFerryTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="ferry-install-test-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        try:
            run(["cmake", "--install", BUILD_DIR, "--prefix", cls.prefix], timeout=60)
            cls.servers = Servers(2, ps_bin=os.path.join(cls.prefix, "bin", "ferry-ps"))  # the installed one
        except Exception:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise
        cls.endpoints = cls.servers.endpoints

    @classmethod
    def tearDownClass(cls):
        cls.servers.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_installed_layout(self):
        for path in ["include/ferry/client.h", "include/ferry/c_api.h", "include/ferry/messages/ferry_generated.h",
                     "lib/cmake/Ferry/FerryConfig.cmake", "lib/cmake/Ferry/FerryConfigVersion.cmake",
                     "lib/cmake/Ferry/FerryTargets.cmake", "lib/pkgconfig/ferry.pc", "lib/pkgconfig/ferry_c.pc",
                     "lib/libferry_client.a", "lib/libferry_c.so", "bin/ferry-ps", "bin/ferry-launch",
                     "lib/python3/dist-packages/ferry_launch/cli.py",
                     "lib/python3/dist-packages/ferry_launch/_installed.py"]:
            self.assertTrue(os.path.exists(os.path.join(self.prefix, path)), path)

    def test_a_separate_project_uses_find_package(self):
        build = os.path.join(self.tmp, "consumer-build")
        # Only what the installed headers and static libraries need is required of the user:
        # nlohmann_json, which Ferry uses privately (header-only), must not be.
        run(["cmake", "-S", os.path.join(HERE, "consumer"), "-B", build, "-G", "Ninja",
             f"-DCMAKE_PREFIX_PATH={self.prefix}", "-DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON",
             f"-DFERRY_C_PROGRAM={os.path.join(SOURCE, 'tests', 'c', 'c_api_test.c')}"], timeout=120)
        run(["cmake", "--build", build], timeout=300)
        out = run([os.path.join(build, "consumer")] + self.endpoints, timeout=60)
        self.assertIn("consumer: OK (2 servers)", out)
        # Servers of its own: c_api_test restarts worker 0 (FERRY_INCARNATION=1), after which these
        # servers refuse its earlier incarnation, 0, which every other program here speaks as.
        c_servers = Servers(2, ps_bin=os.path.join(self.prefix, "bin", "ferry-ps"))
        try:
            out = run([os.path.join(build, "c_consumer")] + c_servers.endpoints, timeout=60)
        finally:
            c_servers.stop()
        self.assertIn("c_api_test: OK", out)
        # The C program runs on the installed libferry_c.so, not the build tree's.
        ldd = run(["ldd", os.path.join(build, "c_consumer")], timeout=30)
        self.assertIn(os.path.join(self.prefix, "lib", "libferry_c.so"), ldd)

    def test_pkg_config_builds_the_same_program(self):
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(self.prefix, "lib", "pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "ferry"], timeout=30, env=env).split()
        exe = os.path.join(self.tmp, "pc-consumer")
        run(["c++", os.path.join(HERE, "consumer", "main.cc"), "-o", exe] + flags, timeout=300)
        self.assertIn("consumer: OK (2 servers)", run([exe] + self.endpoints, timeout=60))

    def test_the_installed_python_module_imports_and_connects(self):
        site = os.path.join(self.prefix, "lib", "python3", "dist-packages")
        if not os.path.isdir(site):
            self.skipTest("the Python module is not built in this configuration (no pybind11)")
        code = ("import ferry, numpy as np; c = ferry.Client(%r); c.declare_dense('py_w', (3,));"
                "print('python:', ferry.__file__, c.pull_dense('py_w', np.ones(3, np.float32)).wait().tolist())"
                % self.endpoints)
        out = run([sys.executable, "-c", code], timeout=60, env=dict(os.environ, PYTHONPATH=site))
        self.assertIn(f"python: {site}", out)
        self.assertIn("[0.0, 0.0, 0.0]", out)
        # The whole package is installed: ferry.torch (python3-torch) and the data readers.
        code = ("import ferry.torch, ferry.torch.data, ferry._data; "
                "print('torch:', ferry.torch.__file__, ferry._data.__file__)")
        out = run([sys.executable, "-c", code], timeout=120, env=dict(os.environ, PYTHONPATH=site))
        self.assertIn(f"torch: {os.path.join(site, 'ferry', 'torch', '__init__.py')} {os.path.join(site, 'ferry')}",
                      out)

    def installed_launcher(self):
        """The installed bin/ferry-launch through a link in another folder (as from ~/bin), its
        common flags (2 servers, 2 workers, free ports), and the folder and environment to run it
        in: there, with nothing of the source or build tree on PYTHONPATH."""
        elsewhere = os.path.join(self.tmp, "elsewhere")
        launcher = os.path.join(elsewhere, "ferry-launch")
        if not os.path.exists(launcher):
            os.makedirs(elsewhere, exist_ok=True)
            os.symlink(os.path.join(self.prefix, "bin", "ferry-launch"), launcher)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        flags = [launcher, "--num-ps", "2", "--num-workers", "2", "--base-port", "0", "--gpus-per-host", "0"]
        return flags, dict(cwd=elsewhere, env=env)

    def test_the_installed_launcher_runs_a_trainer_job(self):
        launch, where = self.installed_launcher()
        trainer = ["--model", "mlp", "--hidden", "16", "--steps", "20", "--batch", "32", "--train-limit", "2000",
                   "--test-limit", "500", "--device", "cpu", "--quiet"]
        # Its programs are the installed ones (default --bin-dir: the prefix's bin/).
        dry = run(launch + ["--dry-run", "--"] + trainer, timeout=60, **where)
        bin_dir = os.path.join(self.prefix, "bin")
        self.assertIn(os.path.join(bin_dir, "ferry-ps") + " --bind", dry)
        self.assertIn(os.path.join(bin_dir, "ferry-trainer") + " --servers", dry)
        # A short sync job to its end.
        out = run(launch + ["--log-dir", os.path.join(self.tmp, "logs-trainer"), "--"] + trainer, timeout=240,
                  **where)
        self.assertIn("ferry-launch: done: 2 workers finished, 2 servers stopped", out)
        for rank in range(2):
            self.assertRegex(out, rf"\[worker {rank}\] done: 20 steps in ")
        self.assertRegex(out, r"\[worker 0\] done: .*; test loss \d+\.\d+, accuracy 0\.\d+")

    def test_the_installed_launcher_runs_a_python_program(self):
        site = os.path.join(self.prefix, "lib", "python3", "dist-packages")
        if not os.path.isdir(os.path.join(site, "ferry")):
            self.skipTest("the Python module is not built in this configuration (no pybind11)")
        launch, where = self.installed_launcher()
        program = os.path.join(self.tmp, "launched.py")
        with open(program, "w") as f:
            f.write(LAUNCHED_PROGRAM)
        # The launcher puts the installed package on the program's PYTHONPATH.
        out = run(launch + ["--log-dir", os.path.join(self.tmp, "logs-program"), "--", sys.executable, program],
                  timeout=120, **where)
        for rank in range(2):
            m = re.search(rf"^\[worker {rank}\] program {rank}: (\S+) (\[.*\])$", out, re.M)
            self.assertTrue(m, out)
            self.assertEqual(m.group(1), os.path.join(site, "ferry", "__init__.py"))
            self.assertEqual(m.group(2), "[-1.0, -1.0, -1.0, -1.0]")

if __name__ == "__main__":
    unittest.main()
