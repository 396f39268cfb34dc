"""pip install --no-build-isolation . : the `ferry` package for the Python that runs pip.

Its pure-Python part is ps/client/python/ferry (ferry, ferry.torch). Its extensions, ferry._ferry
(ps/client/python/ferry_module.cc) and ferry._data (trainer/data/python), are built by CMake, as
in the main build, but only those two targets and what they link, for this interpreter
(-DPython3_EXECUTABLE=sys.executable; CUDA, kernels, tests and benchmarks off). What CMake needs
is what build.sh installs: cmake, ninja, a C++20 compiler, pybind11-dev, ZeroMQ, FlatBuffers,
Abseil, nlohmann-json; and this Python's headers (python3-dev for Debian's). pip itself needs
setuptools and wheel where it runs (--no-build-isolation: those installed; Debian's
python3-setuptools and python3-wheel in a venv made with --system-site-packages).

Environment:
  FERRY_PIP_BUILD_DIR  where the build goes (default build/pip in the source tree): setuptools'
                       build folders, its egg-info, and CMake's build folder, one per Python
                       installation (cmake-<tag>-<hash of the interpreter's real path>: every
                       venv of one Python shares it), which is kept, so a later `pip install .`
                       compiles only what changed
  FERRY_CMAKE_ARGS     more arguments for CMake's configure step (as for build.sh)
"""

import glob
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

SOURCE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_ROOT = os.path.join("ps", "client", "python")
BUILD_BASE = os.path.abspath(os.environ.get("FERRY_PIP_BUILD_DIR") or os.path.join(SOURCE, "build", "pip"))


def project_version():
    """The version of project(ferry VERSION ...) in CMakeLists.txt, the one version Ferry has."""
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        m = re.search(r"project\(ferry VERSION ([0-9.]+)", f.read())
    if not m:
        raise RuntimeError("CMakeLists.txt: no project(ferry VERSION ...)")
    return m.group(1)


class CMakeExtension(Extension):
    """An extension module of the package that the CMake target `target` builds."""

    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    """Configures CMake in its folder (kept between runs), builds the extensions' targets and
    copies each module where setuptools puts extensions."""

    def run(self):
        python = os.path.realpath(sys.executable)  # a venv's python: the installation's
        tag = f"{sys.implementation.cache_tag}-{hashlib.sha1(python.encode()).hexdigest()[:8]}"
        cmake_dir = os.path.join(BUILD_BASE, f"cmake-{tag}")
        configure = ["cmake", "-S", SOURCE, "-B", cmake_dir, "-G", "Ninja",
                     f"-DPython3_EXECUTABLE={sys.executable}", "-DCMAKE_BUILD_TYPE=Release",
                     "-DFERRY_ENABLE_CUDA=OFF", "-DFERRY_BUILD_KERNELS=OFF", "-DFERRY_BUILD_TESTS=OFF",
                     "-DFERRY_BUILD_BENCH=OFF"] + shlex.split(os.environ.get("FERRY_CMAKE_ARGS", ""))
        subprocess.run(configure, check=True)
        targets = [ext.target for ext in self.extensions]
        subprocess.run(["cmake", "--build", cmake_dir, "-j", str(os.cpu_count() or 1), "--target"] + targets,
                       check=True)
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        for ext in self.extensions:
            package, module = ext.name.rsplit(".", 1)
            built = os.path.join(cmake_dir, "python", *package.split("."), module + suffix)
            if not os.path.exists(built):
                found = glob.glob(os.path.join(cmake_dir, "python", *package.split("."), module + ".*"))
                raise RuntimeError(f"CMake target {ext.target} did not build {built} (found: {found or 'nothing'}); "
                                   f"is it configured for {sys.executable}? See the configure output above.")
            dest = self.get_ext_fullpath(ext.name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(built, dest)


os.makedirs(BUILD_BASE, exist_ok=True)
setup(
    version=project_version(),
    packages=find_packages(PACKAGE_ROOT),
    package_dir={"": PACKAGE_ROOT},
    ext_modules=[CMakeExtension("ferry._ferry", "ferry_python"), CMakeExtension("ferry._data", "ferry_data_python")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}},
    zip_safe=False,
)
