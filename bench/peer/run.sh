#!/bin/bash
# bench/peer/run.sh — Ferry against dmlc/ps-lite on this machine, with the same operations, bytes
# and processes (README.md beside this script). Compiles our adapter, pslite_bench.cc, against a
# ps-lite the user already built by ps-lite's own instructions (nothing here builds ps-lite), then
# runs ROUNDS rounds; each round runs every arm once, their order rotated from round to round:
#   ferry    S ferry-ps + W ferry-client-bench processes (the Ferry build given)
#   LABEL2   the same with a second Ferry build (optional; an older commit, say)
#   pslite   a ps-lite scheduler, S servers and W workers, all pslite_bench
#   raw      ferry-bench's raw_proc/tcp/ benchmarks: raw ZeroMQ round trips of one frame of 4 KiB,
#            1 MiB and 16 MiB between two processes (the limit; always one pair), and
#            raw_proc_up/ and raw_proc_down/: the same frame one way with an empty reply (what a
#            push moves) or after an empty request (what a pull moves)
#
#   bench/peer/run.sh --pslite DIR --ferry-build DIR [--ferry-build2 DIR [--label2 NAME]]
#                     --out DIR [--rounds N] [--min-time S] [--servers S] [--workers W] [--arms A,B]
#
#   --pslite DIR       a ps-lite checkout built by its own instructions: DIR/include/ps/ps.h and
#                      its library (DIR/build/libps.a from its Makefile, or libpslite.a / .so
#                      from its CMake build in DIR/build); needed for the pslite arm only
#   --ferry-build DIR  a Ferry build folder (bin/ferry-ps, bench/ferry-client-bench,
#                      bench/ferry-bench); --ferry-build2 another, named NAME (default ferry2)
#   --out DIR          where the results go: meta.json, ARM-rR-wI.json (Google Benchmark's JSON,
#                      one per worker process), raw-rR.json, logs/ (pslite_bench itself is built
#                      in a temporary folder and removed at the end)
#   --rounds N         default 3;  --min-time S: Google Benchmark's min time per benchmark,
#                      default 0.5;  --servers S, --workers W: default 1 and 1 (at most 4 each)
#   --arms A,B         only these arms (of ferry, LABEL2, pslite, raw; default all)
# Every process it starts listens on 127.0.0.1 only, runs under `timeout`, and is stopped when
# this script exits. Summary: /usr/bin/python3 bench/peer/summarize.py OUT.
set -euo pipefail

die() {
  echo "bench/peer/run.sh: $*" >&2
  exit 1
}

pslite='' ferry='' ferry2='' label2=ferry2 out='' rounds=3 min_time=0.5 servers=1 workers=1 only=''
while [ $# -gt 0 ]; do
  case $1 in
    --pslite|--ferry-build|--ferry-build2|--label2|--out|--rounds|--min-time|--servers|--workers|--arms)
      [ $# -ge 2 ] || die "$1 needs a value"
      case $1 in
        --pslite) pslite=$2 ;;
        --ferry-build) ferry=$2 ;;
        --ferry-build2) ferry2=$2 ;;
        --label2) label2=$2 ;;
        --out) out=$2 ;;
        --rounds) rounds=$2 ;;
        --min-time) min_time=$2 ;;
        --servers) servers=$2 ;;
        --workers) workers=$2 ;;
        --arms) only=$2 ;;
      esac
      shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (--help lists them)" ;;
  esac
done
[ -n "$ferry" ] || die "--ferry-build DIR is required"
[ -n "$out" ] || die "--out DIR is required"
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, not '$rounds'"
[[ $servers =~ ^[1-4]$ ]] || die "--servers must be 1 to 4, not '$servers'"
[[ $workers =~ ^[1-4]$ ]] || die "--workers must be 1 to 4, not '$workers'"
[[ $min_time =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]] || die "--min-time must be seconds, not '$min_time'"
[[ $label2 =~ ^[a-z0-9_]+$ ]] || die "--label2 must be lowercase letters, digits and _, not '$label2'"
case $label2 in ferry|pslite|raw) die "--label2 must differ from the arms ferry, pslite and raw" ;; esac
# The arms, in this order (each round rotates it); --arms keeps some.
arms=(ferry ${ferry2:+"$label2"} pslite raw)
if [ -n "$only" ]; then
  kept=()
  for a in "${arms[@]}"; do [[ ",$only," == *",$a,"* ]] && kept+=("$a"); done
  for a in ${only//,/ }; do [[ " ${arms[*]} " == *" $a "* ]] || die "--arms: no arm '$a' (there are: ${arms[*]})"; done
  [ ${#kept[@]} -gt 0 ] || die "--arms keeps no arm"
  arms=("${kept[@]}")
fi
has_arm() { [[ " ${arms[*]} " == *" $1 "* ]]; }
if has_arm pslite; then
  [ -n "$pslite" ] || die "--pslite DIR is required for the pslite arm (--arms without pslite runs the rest)"
fi

# Every process this script starts (each a `timeout`, which passes a TERM on to its command) and
# each descriptor it reads a server's first line from; all stopped on exit.
pids=()
# The adapter is built outside --out, and removed at the end: a binary linked with ps-lite's code
# is not to be kept beside results that may be committed.
bindir=$(mktemp -d /tmp/ferry-peer-XXXXXX)
stop_all() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap 'stop_all; rm -rf "$bindir"' EXIT
trap 'exit 130' INT TERM

# One process's wall-clock bound: generous for 11 benchmarks of --min-time each (Google Benchmark
# runs each at most a few times its min time) and the start-up.
limit=$(/usr/bin/python3 -c "import sys; print(int(120 + 40 * float(sys.argv[1])))" "$min_time")

# ---- the builds ----------------------------------------------------------------------------

# A Ferry build's three programs (ferry-ps moved from ps/server/ to bin/ at some point).
ferry_tool() {  # ferry_tool BUILD NAME: prints its path, or fails naming what is missing
  local c
  for c in "$1/bin/$2" "$1/bench/$2" "$1/ps/server/$2"; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  die "no $2 in $1 (looked in bin/, bench/, ps/server/): build it there first"
}
ferry_ps=$(ferry_tool "$ferry" ferry-ps)
ferry_client=$(ferry_tool "$ferry" ferry-client-bench)
ferry_bench=$(ferry_tool "$ferry" ferry-bench)
if [ -n "$ferry2" ]; then
  ferry2_ps=$(ferry_tool "$ferry2" ferry-ps)
  ferry2_client=$(ferry_tool "$ferry2" ferry-client-bench)
fi

# More than one worker: each ferry-client-bench must say its rank (a server refuses a second
# connection of the same rank). Its flags fail as unrecognised on a build without them.
client_takes_rank() {  # client_takes_rank BIN
  local err
  err=$("$1" --rank=0 --num-workers=1 2>&1 >/dev/null) || true
  ! grep -q "unrecognized command-line flag" <<<"$err"
}
if [ "$workers" -gt 1 ]; then
  clients=()
  has_arm ferry && clients+=("$ferry_client")
  [ -n "$ferry2" ] && has_arm "$label2" && clients+=("$ferry2_client")
  for c in "${clients[@]}"; do
    client_takes_rank "$c" ||
      die "$c takes no --rank/--num-workers, which --workers $workers needs (every worker would be rank 0; --arms pslite,raw runs the rest)"
  done
fi
"$ferry_bench" --benchmark_list_tests=true --benchmark_filter='^raw_proc/tcp/' 2>/dev/null | grep -q . ||
  die "$ferry_bench has no raw_proc/tcp/ benchmarks"

mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
pslite_lib=
if has_arm pslite; then
  # ps-lite, as its own Makefile or CMake leaves it; our adapter only is compiled here.
  [ -f "$pslite/include/ps/ps.h" ] ||
    die "no ps-lite headers at $pslite/include/ps/ps.h: --pslite must be a ps-lite checkout; build ps-lite by its own instructions first"
  for c in "$pslite/build/libps.a" "$pslite/build/libpslite.a" "$pslite/build/libpslite.so" \
           "$pslite/lib/libps.a" "$pslite/lib/libpslite.a" "$pslite/lib/libpslite.so"; do
    [ -f "$c" ] && { pslite_lib=$c; break; }
  done
  [ -n "$pslite_lib" ] ||
    die "no built ps-lite library in $pslite (looked for build/libps.a, build/libpslite.{a,so}, lib/libps.a, lib/libpslite.{a,so}): build ps-lite by its own instructions first"
  pkg-config --exists absl_flat_hash_map benchmark ||
    die "pkg-config finds no absl_flat_hash_map or benchmark (libabsl-dev, libbenchmark-dev): pslite_bench needs them"

  # ps-lite's dependencies where its Makefile put them (deps/), else the system's ZeroMQ and protobuf.
  deps=()
  [ -d "$pslite/deps/lib" ] && deps=(-L"$pslite/deps/lib" "-Wl,-rpath,$(cd "$pslite/deps/lib" && pwd)")
  echo "compiling $bindir/pslite_bench against $pslite_lib"
  # shellcheck disable=SC2046  # pkg-config's flags are words
  "${CXX:-c++}" -std=c++20 -O3 -g -DNDEBUG -Wall -Wextra -isystem "$pslite/include" \
    "$here/pslite_bench.cc" -o "$bindir/pslite_bench" "$pslite_lib" "${deps[@]}" \
    $(pkg-config --cflags --libs absl_flat_hash_map benchmark) -lzmq -lprotobuf-lite -pthread \
    > "$out/logs/compile.log" 2>&1 || die "compiling pslite_bench failed: $out/logs/compile.log"
fi

git_head() { git -C "$1" rev-parse HEAD 2>/dev/null || echo unknown; }
ferry_src() { sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$1/CMakeCache.txt" 2>/dev/null || true; }
/usr/bin/python3 - "$out/meta.json" "$(IFS=,; echo "${arms[*]}")" "$rounds" "$min_time" "$servers" "$workers" "$ferry" \
  "$(git_head "$(ferry_src "$ferry")")" "$ferry2" "$pslite" "$([ -n "$pslite" ] && git_head "$pslite")" "$pslite_lib" \
  "$(nproc)" "$([ -n "$ferry2" ] && git_head "$(ferry_src "$ferry2")")" <<'EOF'
import json, sys
(path, arms, rounds, min_time, servers, workers, ferry, ferry_head, ferry2, pslite, pslite_head, pslite_lib,
 cores, ferry2_head) = sys.argv[1:]
json.dump({"arms": arms.split(","), "rounds": int(rounds),
           "min_time_s": float(min_time), "servers": int(servers), "workers": int(workers), "ferry_build": ferry,
           "ferry_source_head": ferry_head, "ferry2_build": ferry2, "pslite": pslite, "pslite_head": pslite_head,
           "pslite_lib": pslite_lib, "host_cores": int(cores), "ferry2_source_head": ferry2_head},
          open(path, "w"), indent=1)
EOF

# ---- the arms ------------------------------------------------------------------------------

bench_flags=(--benchmark_min_time="$min_time" --benchmark_out_format=json)

# Waits for every process in `running` (pids), failing (and so stopping the rest) on the first
# that fails; `what` names them.
wait_all() {  # wait_all WHAT PID...
  local what=$1 p
  shift
  for p in "$@"; do
    wait "$p" || die "$what: a process failed (exit $?); logs in $out/logs/"
  done
}

# ferry ARM PS CLIENT ROUND: S ferry-ps on free loopback ports (each prints its endpoint first),
# then W ferry-client-bench at once; the servers stopped after.
run_ferry() {
  local arm=$1 ps=$2 client=$3 r=$4 i fd line endpoints=() fds=() servers_pids=() workers_pids=()
  local nw=()
  [ "$workers" -gt 1 ] && nw=(--num-workers "$workers")
  for ((i = 0; i < servers; ++i)); do
    exec {fd}< <(exec timeout -k 5 "$limit" "$ps" --bind tcp://127.0.0.1:0 --rank "$i" --num-servers "$servers" \
                 "${nw[@]}" 2>"$out/logs/$arm-r$r-s$i.err")
    pids+=($!)
    servers_pids+=($!)
    fds+=("$fd")  # kept open while it runs: it prints a last line when stopped
    read -r -t 30 -u "$fd" line || die "$arm: ferry-ps $i printed no endpoint in 30 s: $out/logs/$arm-r$r-s$i.err"
    [[ $line =~ (tcp://127\.0\.0\.1:[0-9]+) ]] || die "$arm: ferry-ps $i said '$line', not its endpoint"
    endpoints+=("${BASH_REMATCH[1]}")
  done
  local list
  list=$(IFS=,; echo "${endpoints[*]}")
  for ((i = 0; i < workers; ++i)); do
    local rank=()
    [ "$workers" -gt 1 ] && rank=(--rank="$i" --num-workers="$workers")
    timeout -k 5 "$limit" "$client" --servers="$list" "${rank[@]}" "${bench_flags[@]}" \
      --benchmark_out="$out/$arm-r$r-w$i.json" > "$out/logs/$arm-r$r-w$i.log" 2>&1 &
    pids+=($!)
    workers_pids+=($!)
  done
  wait_all "$arm workers" "${workers_pids[@]}"
  for i in "${servers_pids[@]}"; do kill -TERM "$i" 2>/dev/null || true; done
  for i in "${servers_pids[@]}"; do wait "$i" 2>/dev/null || true; done
  for fd in "${fds[@]}"; do exec {fd}<&-; done
}

# A port free on 127.0.0.1 now, for ps-lite's scheduler (its nodes pick their own).
free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# ps-lite: its scheduler, S servers, W workers; each node reads its role and the cluster from the
# environment (ps-lite's docs/env.md). Every variable that would move a node off 127.0.0.1 or
# change ps-lite's transport is set or removed here.
run_pslite() {
  local r=$1 i port all=() workers_pids=()
  port=$(free_port)
  local env=(env -u PORT -u DMLC_LOCAL -u DMLC_USE_KUBERNETES -u DMLC_PS_VAN_TYPE -u DMLC_RANK -u PS_RESEND
             -u PS_DROP_MSG -u DMLC_PS_WATER_MARK DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT="$port"
             DMLC_NODE_HOST=127.0.0.1 DMLC_INTERFACE=lo DMLC_NUM_SERVER="$servers" DMLC_NUM_WORKER="$workers"
             PS_VERBOSE=0)
  "${env[@]}" DMLC_ROLE=scheduler timeout -k 5 "$limit" "$bindir/pslite_bench" > "$out/logs/pslite-r$r-scheduler.log" 2>&1 &
  pids+=($!)
  all+=($!)
  for ((i = 0; i < servers; ++i)); do
    "${env[@]}" DMLC_ROLE=server timeout -k 5 "$limit" "$bindir/pslite_bench" > "$out/logs/pslite-r$r-s$i.log" 2>&1 &
    pids+=($!)
    all+=($!)
  done
  for ((i = 0; i < workers; ++i)); do
    "${env[@]}" DMLC_ROLE=worker timeout -k 5 "$limit" "$bindir/pslite_bench" "${bench_flags[@]}" \
      --benchmark_out="$out/pslite-r$r-w$i.json" > "$out/logs/pslite-r$r-w$i.log" 2>&1 &
    pids+=($!)
    workers_pids+=($!)
  done
  wait_all "pslite workers" "${workers_pids[@]}"
  wait_all "pslite scheduler and servers (they end with the workers' Finalize)" "${all[@]}"
}

run_raw() {
  local r=$1
  timeout -k 5 "$limit" "$ferry_bench" --benchmark_filter='^raw_proc(_up|_down)?/tcp/' "${bench_flags[@]}" \
    --benchmark_out="$out/raw-r$r.json" > "$out/logs/raw-r$r.log" 2>&1 &
  pids+=($!)
  wait_all raw $!
}

for ((r = 1; r <= rounds; ++r)); do
  order=()
  for ((k = 0; k < ${#arms[@]}; ++k)); do order+=("${arms[(k + r - 1) % ${#arms[@]}]}"); done
  for arm in "${order[@]}"; do
    echo "round $r/$rounds: $arm ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))"
    case $arm in
      ferry) run_ferry ferry "$ferry_ps" "$ferry_client" "$r" ;;
      pslite) run_pslite "$r" ;;
      raw) run_raw "$r" ;;
      *) run_ferry "$arm" "$ferry2_ps" "$ferry2_client" "$r" ;;
    esac
    pids=()  # all ended
  done
done
echo "done: /usr/bin/python3 $here/summarize.py $out"
