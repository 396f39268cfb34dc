"""Where the launcher and this build's binaries are, for launch/tests.

FERRY_BUILD_DIR names the CMake build dir (ctest sets it); default: build/ at the top.
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER = os.path.normpath(os.path.join(HERE, "..", "ferry-launch"))
BUILD_DIR = os.path.abspath(os.environ.get("FERRY_BUILD_DIR", os.path.join(HERE, "..", "..", "build")))
PS_BIN = os.path.join(BUILD_DIR, "bin", "ferry-ps")
TRAINER_BIN = os.path.join(BUILD_DIR, "bin", "ferry-trainer")
KEYS_BIN = os.path.join(BUILD_DIR, "bin", "ferry-keys")
