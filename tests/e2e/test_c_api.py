"""The C ABI from a C program (tests/c/c_api_test.c) against two real ferry-ps processes on
127.0.0.1. Needs FERRY_BUILD_DIR (the CMake build dir); ctest sets it."""

import os
import subprocess
import unittest

from build_paths import BUILD_DIR
from test_sync_cluster import Servers

C_API_TEST = os.path.join(BUILD_DIR, "tests", "c_api_test")


@unittest.skipUnless(os.path.exists(C_API_TEST), "tests/c_api_test not built")
class CApiTest(unittest.TestCase):
    def test_the_c_program_passes_against_two_servers(self):
        with Servers(2) as s:
            run = subprocess.run([C_API_TEST] + s.endpoints, capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("c_api_test: OK", run.stdout)


if __name__ == "__main__":
    unittest.main()
