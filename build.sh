#!/usr/bin/env bash
# Ferry's one entry point on a fresh machine: installs what is missing (Debian packages),
# configures and builds with CMake + Ninja, then runs the main job or the tests.
#
#   ./build.sh demo    install, build, run a local cluster (2 ferry-ps + 2 workers) that trains
#   ./build.sh test    install, check line lengths (format), build, run every test (ctest), the
#                      timing-sensitive ones again under load (busy), then the suite built by clang
#                      under AddressSanitizer + UndefinedBehaviorSanitizer with the thread-safety
#                      analysis, and the in-process cluster tests under ThreadSanitizer
#   ./build.sh format  no C++ line over the column limit of .clang-format (.ci/check-format)
#   ./build.sh busy    the tests labelled `timing` (ctest -L timing) with every core kept busy by
#                      stress-ng, as a user's loaded machine would: they must pass there too
#   ./build.sh thread-safety   the clang -Wthread-safety build of the libraries and programs alone
#   ./build.sh sanitize  the test suite built with clang under AddressSanitizer and
#                      UndefinedBehaviorSanitizer (build-sanitize/), the thread-safety analysis on
#                      (a violation fails the build); any finding fails its test; then the
#                      libFuzzer targets of tests/fuzz, FUZZ_SECONDS (45) each
#   ./build.sh tsan    the in-process cluster tests (servers, clients and trainers as threads)
#                      under ThreadSanitizer (build-tsan/)
#   ./build.sh build   install and build only
#   ./build.sh bench   install, build, run the micro-benchmarks
#   ./build.sh matrix [ARGS]  install, build, run bench/ferry-matrix (sync vs async vs ssp on
#                      local clusters; ARGS go to it, e.g. --preset small --straggler x2)
#
# Environment: BUILD_DIR (default build), JOBS (default: cores), TEST_JOBS (tests of the plain
# build run at once, default: twice the cores), FERRY_CMAKE_ARGS (extra args).
set -euo pipefail
cd "$(dirname "$0")"

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# Tests at once in the plain build: many of them wait more than they compute (processes
# starting, heartbeats, deadlines), so twice the cores keeps the CPUs busy: the plain suite took
# 315 s at -j 2 and 217 s at -j 4 on 2 cores (stop 58), the CPUs 92% busy; 191 s with launch_test
# split by class. Each test must pass on a loaded machine anyway (the busy stage loads every
# core). The sanitizer stage runs one test per core: at -j 4 two training tests had gone past their
# 120 s; at 2 per core with those counted as two (ctest PROCESSORS) it took 598 s against 660 s,
# and an async job's restore lost 4 of 240 examples (a checkpoint cut between a step's dense and
# sparse pushes to one server: CheckpointRequests.DISABLED_AStepACheckpointCut..., stop 67).
TEST_JOBS=${TEST_JOBS:-$((JOBS * 2))}
T0=$SECONDS
# What a stage took, and the whole run so far: where CI's time goes.
took() { say "$1 took $(( SECONDS - $2 )) s ($(( (SECONDS - T0) / 60 )) min since the start)"; }
PACKAGES=(cmake ninja-build g++ pkg-config
          libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler
          libabsl-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev zlib1g-dev librocksdb-dev libmicrohttpd-dev prometheus-cpp-dev prometheus
          dataset-fashion-mnist python3 python3-dev python3-numpy python3-torch pybind11-dev
          python3-setuptools python3-wheel python3-pip python3-venv gnuplot-nox clang libclang-rt-dev lld
          stress-ng)

say() { printf '\033[1m[ferry]\033[0m %s\n' "$*"; }

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "all build dependencies are installed"
    return
  fi
  say "installing: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

build() {
  local t0=$SECONDS
  say "configuring ($BUILD_DIR)"
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD_DIR" -G Ninja ${FERRY_CMAKE_ARGS:-}
  say "building with $JOBS jobs"
  cmake --build "$BUILD_DIR" -j "$JOBS"
  took "the build" "$t0"
}

# After a ctest run in $1 that failed, begun at $2 (seconds since the epoch): for each failed test,
# the last lines of its output (from ctest's LastTest.log), so that the end of a long log, which is
# what CI shows, says why. (ctest rewrites its list of failed tests only when one fails: an older
# list is not this run's.)
failed_tests_report() {
  local dir=$1 since=$2 log failed name
  log=$dir/Testing/Temporary/LastTest.log
  failed=$dir/Testing/Temporary/LastTestsFailed.log
  [ -f "$failed" ] && [ -f "$log" ] && [ "$(stat -c %Y "$failed")" -ge "$since" ] || return 0
  while IFS= read -r name; do
    name=${name#*:}
    say "why $name failed (the end of its output; all of it in $log):"
    awk -v name="$name" '
      $0 ~ "^[0-9]+/[0-9]+ Testing: " && $3 == name { on = 1; n = 0; next }
      on && /^<end of output>$/ { on = 0 }
      on { buf[n++ % 40] = $0 }
      END { for (i = (n > 40 ? n - 40 : 0); i < n; i++) print buf[i % 40] }' "$log"
  done < "$failed"
}

run_tests() {
  local t0=$SECONDS rc=0 since
  since=$(date +%s)
  say "running the tests ($TEST_JOBS at once)"
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$TEST_JOBS" --timeout 300 || rc=$?
  [ $rc = 0 ] || failed_tests_report "$BUILD_DIR" "$since"
  took "the tests" "$t0"
  return $rc
}

# The tests whose assertions involve time (heartbeats, deadlines, held and expired requests,
# processes stopped and restarted: ctest label `timing`, see tests/CMakeLists.txt) once more, with
# every core kept busy by a stress-ng CPU worker beside them: users run the suite on loaded
# machines, where a thread may wait hundreds of milliseconds for the CPU. About 2 minutes on 2
# cores. BUSY_CPUS (default: cores) sets the load. The load is stopped however this ends; its own
# --timeout bounds it even if this script is killed outright.
run_busy() {
  local cpus=${BUSY_CPUS:-$(nproc)} load rc=0 t0=$SECONDS since
  since=$(date +%s)
  say "the timing-sensitive tests (ctest -L timing) beside stress-ng --cpu $cpus"
  stress-ng --cpu "$cpus" --timeout 900s --quiet &
  load=$!
  # shellcheck disable=SC2064  # $load is expanded now, on purpose
  trap "kill $load 2>/dev/null || true" EXIT
  # shellcheck disable=SC2064
  trap "kill $load 2>/dev/null || true; exit 130" INT TERM
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 300 -L timing || rc=$?
  [ $rc = 0 ] || failed_tests_report "$BUILD_DIR" "$since"
  kill "$load" 2>/dev/null || true
  wait "$load" 2>/dev/null || true
  trap - EXIT INT TERM
  say "timing-sensitive tests under load: $([ $rc = 0 ] && echo passed || echo FAILED) in $((SECONDS - t0)) s"
  return $rc
}

# Clang's thread-safety analysis: every lock-guarded member is annotated (ABSL_GUARDED_BY), and a
# violation fails the build. ./build.sh test runs it within the sanitizer build (every target,
# tests included), which clang compiles anyway; ./build.sh thread-safety builds the libraries and
# programs alone. tsa_probe first shows the check is live: a snippet that reads a guarded member
# without its lock must be refused.
TSA_FLAGS="-Wthread-safety -Werror=thread-safety"
tsa_probe() {
  local probe rc=0
  probe=$(mktemp -d)
  printf '%s\n' '#include <absl/base/thread_annotations.h>' '#include <absl/synchronization/mutex.h>' \
    'struct S { absl::Mutex mu; int x ABSL_GUARDED_BY(mu) = 0; int Get() { return x; } };' \
    'int main() { S s; return s.Get(); }' > "$probe/probe.cc"
  if clang++ -std=c++20 $TSA_FLAGS -fsyntax-only "$probe/probe.cc" 2>/dev/null; then
    say "error: clang accepted an unguarded read: the thread-safety analysis is not running"
    rc=1
  fi
  rm -rf "$probe"
  return $rc
}
thread_safety_check() {
  local dir=${BUILD_DIR}-thread-safety
  say "clang -Wthread-safety build ($dir)"
  tsa_probe || return 1
  cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only -DCMAKE_CXX_FLAGS="$TSA_FLAGS" -DFERRY_ENABLE_CUDA=OFF \
    -DFERRY_BUILD_TESTS=OFF -DFERRY_BUILD_BENCH=OFF
  cmake --build "$dir" -j "$JOBS"
}

# Compiles the program on stdin with clang -fsanitize=$2 and runs it: it must abort (the
# sanitizer caught what it holds); if it runs to its end the sanitizer is not working, and this
# says so, naming probe $1, and fails.
# A sanitizer that is live catches the probe at once; up to 3 runs are given, since once in a
# CI run (stop 26) the thread probe ran to its end, and what it printed was not kept: a probe that
# runs to its end 3 times fails, showing the last run's output.
must_catch() {
  local name=$1 flags=$2 probe rc=1 try
  probe=$(mktemp -d)
  cat > "$probe/$name.cc"
  clang++ -O1 -g -fsanitize="$flags" -fno-sanitize-recover=all "$probe/$name.cc" -o "$probe/$name"
  for try in 1 2 3; do
    if ! TSAN_OPTIONS=halt_on_error=1 "$probe/$name" > "$probe/out" 2>&1; then
      rc=0
      break
    fi
    say "the $name probe ran to its end (run $try of 3)"
  done
  if [ $rc != 0 ]; then
    say "error: -fsanitize=$flags is not catching anything; the probe's last output:"
    tail -n 20 "$probe/out"
  fi
  rm -rf "$probe"
  return $rc
}

# Configures a clang build of this tree in $1 with -fsanitize=$2 (-O1, no CUDA, no benchmarks) and
# the C++ flags $3 besides; further arguments go to cmake. Line tables only for debug information:
# a finding's stack still names files and lines, and the build takes about a third less time.
configure_clang() {
  local dir=$1 sanitize=$2 cxx_flags=$3
  shift 3
  cmake -S . -B "$dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only -DCMAKE_C_FLAGS_DEBUG=-gline-tables-only \
    -DCMAKE_CXX_FLAGS="-O1 $cxx_flags" -DCMAKE_C_FLAGS=-O1 -DFERRY_SANITIZE="$sanitize" -DFERRY_ENABLE_CUDA=OFF \
    -DFERRY_BUILD_BENCH=OFF "$@"
}

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer (clang, -O1, every target; a
# finding aborts its program, so the test fails). Left out: the Python module's and the install
# test (an instrumented extension cannot load into Debian's uninstrumented python3, and the
# install test builds an outside project against these libraries), and the tests of the launcher's
# and the benchmark scripts' own logic, whose programs run the paths other tests run (Slurm's and
# ssh's backends, network namespaces, the bench matrix: 107 s of the stage's 1,272 s, at stop 67),
# or stand-ins for ferry-ps and ferry-trainer (a server's replacement, the curve's matrix, usage
# errors, GPU assignment: 66 s more, at stop 70). Left out too, for CI's time: the long scenarios
# of the launcher and of processes killed (a move, a recovery, a job's life, workers joining and
# leaving, a worker killed: 468 of the stage's 1,333 test-seconds at stop 70). What they assert is
# the launcher's and the jobs' (the plain and busy stages run them); the servers' and trainers'
# code they drive runs under the sanitizers in the in-process cluster tests (moves, restarts,
# recoveries, replicas) and in the scenarios kept here (launch_test.ReplicationTest kills a
# server, sync_cluster_test runs a job of processes).
SANITIZE_SKIP="python_module_test|install_test|bench_matrix_test|worker_death_test|launch_test\.(SlurmTest|\
SshBackendTest|NetnsTest|ServerReplacementTest|CurveTest|UsageErrorTest|GpuAssignmentTest|SlotMoveTest|RecoveryTest|\
LaunchTest|WorkerJoinTest|WorkerLeaveTest)"
sanitize_check() {
  local dir=${BUILD_DIR}-sanitize
  say "clang AddressSanitizer + UndefinedBehaviorSanitizer build (with -Wthread-safety) and tests ($dir)"
  tsa_probe || return 1
  # First show the sanitizers are live: an out-of-bounds read and a signed overflow must abort.
  must_catch oob address,undefined <<'EOF_PROBE' || return 1
#include <cstdlib>
int main(int argc, char**) { int* p = static_cast<int*>(std::malloc(4 * sizeof(int)));
  volatile int v = p[argc + 3]; (void)v; std::free(p); return 0; }
EOF_PROBE
  must_catch overflow address,undefined <<'EOF_PROBE' || return 1
#include <climits>
int main(int argc, char**) { int x = INT_MAX - 1 + argc; volatile int y = x + argc; (void)y; return 0; }
EOF_PROBE
  local t0=$SECONDS
  configure_clang "$dir" address,undefined,fuzzer-no-link "$TSA_FLAGS" -DFERRY_FUZZ=ON
  cmake --build "$dir" -j "$JOBS"
  took "the sanitizer build" "$t0"
  t0=$SECONDS
  local since
  since=$(date +%s)
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir "$dir" --output-on-failure -j "$JOBS" --timeout 600 -E "$SANITIZE_SKIP" ||
    { failed_tests_report "$dir" "$since"; return 1; }
  took "the tests under the sanitizers" "$t0"
  t0=$SECONDS
  fuzz_runs "$dir"
  took "the fuzz runs" "$t0"
}

# The libFuzzer targets of tests/fuzz (built by sanitize_check), each for a bounded time from the
# seed corpus (valid messages of every kind) plus what earlier runs in this build folder found.
# FUZZ_SECONDS (default 45) per target; the targets run at once (each is one process on one core).
# A crash, sanitizer finding or hang fails the run; the input that did it is kept in the build
# folder and its log's tail printed.
FUZZ_TARGETS=(fuzz_wire fuzz_server)
fuzz_runs() {
  local dir corpus t failed=0
  dir=$(cd "$1" && pwd)  # absolute: the targets run from inside it
  corpus=$dir/fuzz-corpus
  "$dir/tests/fuzz/fuzz-seeds" --write-seeds "$corpus/seeds" >/dev/null
  for t in "${FUZZ_TARGETS[@]}"; do
    mkdir -p "$corpus/$t"
    rm -f "$dir/$t.failed"
    say "libFuzzer: $t for ${FUZZ_SECONDS:-45} s (log: $dir/$t.log)"
    (cd "$dir" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
       timeout $(( ${FUZZ_SECONDS:-45} + 120 )) "tests/fuzz/$t" -max_total_time="${FUZZ_SECONDS:-45}" \
       -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 "$corpus/$t" "$corpus/seeds" >"$dir/$t.log" 2>&1 ||
       touch "$dir/$t.failed") &
  done
  wait
  for t in "${FUZZ_TARGETS[@]}"; do
    if [ -e "$dir/$t.failed" ]; then
      grep -v '^ferry-ps' "$dir/$t.log" | tail -n 40
      say "error: $t found a crash or hang (input saved in $dir, log $dir/$t.log)"
      failed=1
    else
      say "libFuzzer: $t"
      grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' "$dir/$t.log"
    fi
  done
  return $failed
}

# The multi-threaded in-process cluster tests under ThreadSanitizer. libzmq (Debian's, not
# instrumented) is suppressed (tests/tsan.supp); Ferry's hand-offs through it are annotated
# (messages/src/transport.cc). OpenBLAS (Debian's, not instrumented either) runs each GEMM on the
# calling thread (OPENBLAS_NUM_THREADS=1): its own worker threads hand off by spinning, which TSan
# cannot see, and on the caller's thread its writes stay visible to TSan against Ferry's threads.
TSAN_TESTS=(cluster_test checkpoint_request_test liveness_test event_loop_test server_parts_test
            trainer_sync_equivalence_test trainer_ctr_test trainer_backup_workers_test trainer_resume_test
            metrics_test sparse_tables_test trainer_pipeline_test client_io_test dense_view_test feed_test
            disk_tier_cluster_test placement_versions_test replicas_test)
tsan_check() {
  local dir=${BUILD_DIR}-tsan
  say "clang ThreadSanitizer build of the in-process cluster tests ($dir)"
  must_catch race thread <<'EOF_PROBE' || return 1
#include <thread>
int n = 0;
int main() { std::thread t([] { for (int i = 0; i < 100000; ++i) ++n; }); for (int i = 0; i < 100000; ++i) ++n; t.join(); return 0; }
EOF_PROBE
  local t0=$SECONDS
  configure_clang "$dir" thread ""
  cmake --build "$dir" -j "$JOBS" --target "${TSAN_TESTS[@]}"
  took "the ThreadSanitizer build" "$t0"
  t0=$SECONDS
  # $JOBS test programs at once (each mostly waits on its own threads' hand-offs), each into its
  # own log; a failure shows its log's tail.
  local t bin failed=0 logs=$dir/tsan-logs
  rm -rf "$logs"
  mkdir -p "$logs"
  for t in "${TSAN_TESTS[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    bin=$(find "$dir/tests" -type f -name "$t" -perm -u+x | head -n 1)
    say "ThreadSanitizer: $t"
    ( OPENBLAS_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 suppressions=$PWD/tests/tsan.supp" \
        timeout 900 "$bin" --gtest_brief=1 > "$logs/$t.log" 2>&1 || touch "$logs/$t.failed" ) &
  done
  wait
  for t in "${TSAN_TESTS[@]}"; do
    if [ -e "$logs/$t.failed" ]; then
      tail -n 60 "$logs/$t.log"
      say "error: $t failed under ThreadSanitizer (log: $logs/$t.log)"
      failed=1
    fi
  done
  took "the ThreadSanitizer tests" "$t0"
  return $failed
}

run_demo() {
  # A local cluster started and supervised by launch/ferry-launch: 2 ferry-ps and 2
  # ferry-trainer processes, an MLP on Fashion-MNIST in sync mode.
  say "launching 2 servers + 2 workers: MLP on Fashion-MNIST (sync, ${DEMO_EPOCHS:-10} epochs)"
  python3 launch/ferry-launch --num-ps 2 --num-workers 2 --bin-dir "$BUILD_DIR" --base-port 0 -- \
    --model mlp --hidden 256,128 --optimizer adam --lr 0.001 --batch 64 --consistency sync \
    --epochs "${DEMO_EPOCHS:-10}" --log-every 500
}

# No line of the C++ sources over its .clang-format's column limit (120; 100 in kernels/).
format_check() {
  say "checking line lengths (.ci/check-format)"
  /usr/bin/python3 .ci/check-format
}

case "${1:-}" in
  demo) install_deps; build; run_demo ;;
  test) install_deps; format_check; build; run_tests; run_busy; sanitize_check; tsan_check ;;
  format) format_check ;;
  busy) install_deps; build; run_busy ;;
  thread-safety) install_deps; thread_safety_check ;;
  sanitize) install_deps; sanitize_check ;;
  tsan) install_deps; tsan_check ;;
  build) install_deps; build ;;
  bench) install_deps; build; "$BUILD_DIR/bench/ferry-bench" ;;
  matrix) shift; install_deps; build; python3 bench/ferry-matrix --bin-dir "$BUILD_DIR" "$@" ;;
  *) echo "usage: $0 demo|test|build|format|busy|thread-safety|sanitize|tsan|bench|matrix [ferry-matrix flags]" >&2; exit 2 ;;
esac
