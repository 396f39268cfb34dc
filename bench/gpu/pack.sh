#!/usr/bin/env bash
# bench/gpu/pack.sh [BUILD_DIR] DEST — packs what a GPU machine without this project's build
# dependencies needs to run bench/gpu/run.sh and bench/gpu/torch_front.sh there: the programs
# (stripped) in DEST/build as a build tree lays them out, the shared libraries they load in
# DEST/lib (not the C and C++ runtimes, nor CUDA's: the machine's own are used), and for
# ferry's Python extensions, which bench/gpu/build_python.sh builds there for the machine's own
# python3, the static libraries (DEST/pylink) and the headers outside the source tree
# (DEST/include). Built from a tree made by ./build.sh build (with nvcc); the binaries need a
# glibc at least as new as the build machine's. DEST is made anew; DATA=1 adds Fashion-MNIST.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
if [[ $# -eq 1 ]]; then BUILD=$REPO/build; DEST=$1; else BUILD=$(cd "$1" && pwd); DEST=$2; fi
rm -rf "$DEST"
mkdir -p "$DEST"/{lib,pylink,include}
PROGRAMS=(bin/ferry-ps bin/ferry-trainer bench/ferry-gpu-bench tests/unit/kernels/ferry_kernels_cuda_test
          tests/cluster/trainer/trainer_cuda_train_test tests/trainer_options_test)
for p in "${PROGRAMS[@]}"; do
  [[ -x $BUILD/$p ]] || { echo "pack.sh: $BUILD/$p is missing (./build.sh build with nvcc first)" >&2; exit 1; }
  mkdir -p "$(dirname "$DEST/build/$p")"
  strip -o "$DEST/build/$p" "$BUILD/$p"
done
# The shared libraries the programs and the Python extensions load.
{ for p in "${PROGRAMS[@]}"; do ldd "$BUILD/$p"; done; ldd "$BUILD"/python/ferry/_*.so; } |
  awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
  grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  sort -u | while read -r lib; do cp -L "$lib" "$DEST/lib/"; done
# What the Python extensions link (their link lines in build.ninja, the shared ones from lib/).
cp "$BUILD"/ps/client/libferry_client.a "$BUILD"/ps/client/python/libferry_bags.a \
   "$BUILD"/messages/metrics/libferry_metrics.a "$BUILD"/messages/libferry_messages.a \
   "$BUILD"/messages/base/libferry_base.a "$BUILD"/trainer/data/libferry_data.a \
   /usr/lib/x86_64-linux-gnu/libflatbuffers.a "$DEST/pylink/"
strip --strip-debug "$DEST"/pylink/libferry_*.a
for lib in zmq prometheus-cpp-core microhttpd z; do
  ln -sf "$(cd "$DEST/lib" && ls lib$lib.so.* | head -1)" "$DEST/lib/lib$lib.so"
done
for lib in "$DEST"/lib/libabsl_*.so.*; do ln -sf "$(basename "$lib")" "${lib%%.so.*}.so"; done
cp -r /usr/include/absl "$DEST/include/"
cp -r "$BUILD/messages/gen" "$DEST/include/gen"
if [[ ${DATA:-0} == 1 ]]; then cp -r /usr/share/datasets/fashion-mnist "$DEST/fashion-mnist"; fi
du -sh "$DEST"
