"""An installed Ferry, used from outside the tree: `cmake --install` into a temporary prefix,
then a separate project built against it with find_package(Ferry) (a C++ program on ferry::client
and the C ABI test program on ferry::c), the same C++ program built with pkg-config, and the
installed Python module, each run against the installed ferry-ps on 127.0.0.1.

Needs FERRY_BUILD_DIR (the CMake build dir; ctest sets it).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_DIR = os.path.abspath(os.environ.get("FERRY_BUILD_DIR", os.path.join(SOURCE, "build")))
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
from test_sync_cluster import Servers  # noqa: E402  (ferry-ps processes on 127.0.0.1, stopped at the end)


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
                     "lib/libferry_client.a", "lib/libferry_c.so", "bin/ferry-ps"]:
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
        out = run([os.path.join(build, "c_consumer")] + self.endpoints, timeout=60)
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


if __name__ == "__main__":
    unittest.main()
