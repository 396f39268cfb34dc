"""`pip install .` of the source tree into a virtual environment: the `ferry` package, its
extensions built by CMake through setup.py for the venv's interpreter, imported from outside the
source tree and used for a pull and a push against this build's ferry-ps on 127.0.0.1.

The venv is Debian's python3 with --system-site-packages (numpy and setuptools come from Debian)
and pip runs with --no-build-isolation --no-deps --no-index: nothing is downloaded. CMake's build
of the extensions goes to FERRY_BUILD_DIR/pip-test (FERRY_PIP_BUILD_DIR) and is kept, so only the
first run compiles the client libraries (minutes on a small machine; later runs take seconds).

Needs FERRY_BUILD_DIR (the CMake build dir; ctest sets it).
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_DIR = os.path.abspath(os.environ.get("FERRY_BUILD_DIR", os.path.join(SOURCE, "build")))
sys.path.insert(0, os.path.join(SOURCE, "tests", "e2e"))
from test_sync_cluster import Servers  # noqa: E402  (ferry-ps processes on 127.0.0.1, stopped at the end)

SYSTEM_PYTHON = "/usr/bin/python3"

# Run by the venv's python from a folder outside the source tree: where ferry comes from, a dense
# pull and push, a sparse push and pull, and the data readers' extension.
USE = """\
import sys, numpy as np, ferry, ferry._data
c = ferry.Client(sys.argv[1:], rank=0, num_workers=1, request_timeout=60)
c.declare_dense("pip_w", (3,), optimizer="sgd", lr=1.0)
c.declare_sparse("pip_emb", 2, optimizer="sgd", lr=1.0)
w = np.empty(3, np.float32)
c.pull_dense("pip_w", w).wait()
c.push_dense("pip_w", np.ones(3, np.float32)).wait()
c.pull_dense("pip_w", w).wait()
c.push_sparse("pip_emb", np.array([5, 9]), np.full((2, 2), 0.5, np.float32)).wait()
rows = c.pull_sparse("pip_emb", np.array([9, 5, 1])).wait()
c.finish()
c.close()
print("ferry:", ferry.__file__, ferry._data.__file__)
print("dense:", w.tolist(), "sparse:", rows.tolist())
"""


def run(argv, timeout, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r.stdout


def untracked_files():
    """The source tree's untracked files (None outside a git checkout)."""
    r = subprocess.run(["git", "-C", SOURCE, "status", "--porcelain", "--untracked-files=all"],
                       capture_output=True, text=True, timeout=60)
    return sorted(line for line in r.stdout.splitlines() if line.startswith("??")) if r.returncode == 0 else None


@unittest.skipUnless(os.access(SYSTEM_PYTHON, os.X_OK), f"{SYSTEM_PYTHON} (Debian's python3) is not here")
class PipInstallTest(unittest.TestCase):
    def test_pip_installs_the_package_into_a_venv(self):
        with tempfile.TemporaryDirectory(prefix="ferry-pip-test-") as tmp:
            venv = os.path.join(tmp, "venv")
            run([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv], timeout=120)
            python = os.path.join(venv, "bin", "python")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            env.update(FERRY_PIP_BUILD_DIR=os.path.join(BUILD_DIR, "pip-test"), PIP_DISABLE_PIP_VERSION_CHECK="1")
            before = untracked_files()
            run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", SOURCE],
                timeout=1200, env=env)
            # The build went to FERRY_PIP_BUILD_DIR: nothing new in the source tree.
            self.assertEqual(untracked_files(), before)

            site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], timeout=60,
                       env=env).strip()
            self.assertTrue(site.startswith(venv), site)
            script = os.path.join(tmp, "use.py")
            with open(script, "w") as f:
                f.write(USE)
            with Servers(1) as s:
                out = run([python, script] + s.endpoints, timeout=120, cwd=tmp, env=env)
            package = os.path.join(site, "ferry")
            self.assertIn(f"ferry: {os.path.join(package, '__init__.py')} {package}{os.sep}_data.", out)
            self.assertIn("dense: [-1.0, -1.0, -1.0] sparse: [[-0.5, -0.5], [-0.5, -0.5], [0.0, 0.0]]", out)
            # pip knows it, with the project's version.
            with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
                version = re.search(r"project\(ferry VERSION ([0-9.]+)", f.read()).group(1)
            self.assertIn(f"Version: {version}\n", run([python, "-m", "pip", "show", "ferry"], timeout=60, env=env))

if __name__ == "__main__":
    unittest.main()
