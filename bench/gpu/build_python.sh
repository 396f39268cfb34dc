#!/usr/bin/env bash
# bench/gpu/build_python.sh PACK — builds ferry's Python package for this machine's python3 from
# a folder made by bench/gpu/pack.sh (on a machine without this project's build dependencies,
# such as a lent GPU machine whose python3 holds its own PyTorch): PACK/build/python/ferry with
# ferry._ferry, ferry._data and the package's .py files from this tree, for
# PYTHONPATH=PACK/build/python. Needs g++ with C++20, and pybind11 for that python3
# (`python3 -m pybind11 --includes`). PYTHON names another interpreter, CXX another compiler.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PACK=$(cd "$1" && pwd)
PY=${PYTHON:-python3}
CXX=${CXX:-g++}
PKG=$PACK/build/python/ferry
mkdir -p "$PKG"
rm -f "$PKG"/_ferry.*so "$PKG"/_data.*so
cp -r "$REPO"/ps/client/python/ferry/. "$PKG"/
EXT=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
# pip's pybind11 names its headers and Python's; without it, Python's and the system's pybind11.
if ! INCLUDES=$("$PY" -m pybind11 --includes 2> /dev/null); then
  INCLUDES=-I$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
fi
read -r -a PYINC <<< "$INCLUDES"
FLAGS=(-O2 -std=c++20 -fPIC -shared -fvisibility=hidden -DNDEBUG "${PYINC[@]}" -I"$REPO/ps/client/python"
       -I"$REPO/messages/base/include" -isystem "$PACK/include")
# Each extension exports its PyInit_ alone: built by another g++ than the libraries it loads, its
# own copies of the C++ library's templates must not take the place of theirs (on an H200
# machine's g++ 13, libzmq's I/O thread, built by Debian's g++ 12, called the extension's copy of
# std::ostream::_M_insert<long> and crashed).
VERSIONS=$PACK/build/python/exports.map
echo '{ global: PyInit_*; local: *; };' > "$VERSIONS"
LINK=(-L"$PACK/pylink" -L"$PACK/lib" -Wl,-rpath,"$PACK/lib" -Wl,--version-script="$VERSIONS")
ABSL=()
for lib in "$PACK"/lib/libabsl_*.so; do ABSL+=("-l:$(basename "$lib")"); done
"$CXX" "${FLAGS[@]}" -I"$REPO/ps/client/include" -I"$REPO/messages/include" -I"$PACK/include/gen" \
  -I"$REPO/messages/metrics/include" "$REPO/ps/client/python/ferry_module.cc" -o "$PKG/_ferry$EXT" "${LINK[@]}" \
  -Wl,--start-group -lferry_client -lferry_bags -lferry_metrics -lferry_messages -lferry_base -lflatbuffers \
  -Wl,--end-group "${ABSL[@]}" -lzmq -lprometheus-cpp-core -lmicrohttpd -latomic
"$CXX" "${FLAGS[@]}" -I"$REPO/trainer/data/include" "$REPO/trainer/data/python/data_module.cc" \
  -o "$PKG/_data$EXT" "${LINK[@]}" -Wl,--start-group -lferry_data -lferry_base -Wl,--end-group -lz -latomic
PYTHONPATH=$PACK/build/python "$PY" -c "import ferry, ferry._data; print('ferry package built:', ferry.__file__)"
