// ferry-move: asks a running job to move the servers' slots (protocol 1.24, ferry::AskMove):
// server 0 keeps the ask and hands it to the workers at their next move check (ferry-trainer
// --move-asks-every N), where worker 0 checkpoints and makes server K join (a fair share of the
// slots, taken from the others) or drains it (its slots to the others), as a --move-slots move;
// or (protocol 1.26) where worker W leaves the job after that step, the others reading its share
// of each later step's examples, as a --leave.
//
//   ferry-move --server EP0 join=K|drain=K|leave-worker=W [--curve-keys DIR [--rank R]] [--timeout-s S]
//
// EP0 is server 0's endpoint (tcp://host:port). With CURVE, a worker key of the job's key folder
// (--rank R, default 0): whoever holds one may ask (a reader's may not). The job says when it made
// the move (worker 0's "moved N slots" line, worker W's "left the job" line; server 0's log says it
// handed the ask over). Exit status: 0 server 0 keeps the ask, 1 it refused it (one is kept
// already, the map cannot make that move, the worker has left, ...) or did not answer, 2 bad usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ferry/client.h"
#include "ferry/curve.h"

namespace {

int Usage(const std::string& why, std::FILE* to = stderr) {
  if (!why.empty()) std::fprintf(to, "ferry-move: %s\n", why.c_str());
  std::fputs("usage: ferry-move --server EP0 join=K|drain=K|leave-worker=W [--curve-keys DIR [--rank R]] "
             "[--timeout-s S]\n",
             to);
  return 2;
}

bool ParseInt(std::string_view text, long long low, long long high, long long* out) {
  const std::string s(text);
  char* end = nullptr;
  *out = std::strtoll(s.c_str(), &end, 10);
  return !s.empty() && end == s.c_str() + s.size() && *out >= low && *out <= high;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::AskMoveOptions options;
  std::string keys;
  long long rank = 0, timeout_s = 10, target = -1;
  std::string what;  // join, drain or leave-worker
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--help" || a == "-h") {
      Usage("", stdout);
      return 0;
    } else if (a == "--server" && has_value) {
      options.server0 = argv[++i];
    } else if (a == "--curve-keys" && has_value) {
      keys = argv[++i];
    } else if (a == "--rank" && has_value) {
      if (!ParseInt(argv[++i], 0, 1 << 20, &rank)) return Usage("--rank: '" + std::string(argv[i]) + "' is not a rank");
    } else if (a == "--timeout-s" && has_value) {
      if (!ParseInt(argv[++i], 1, 3600, &timeout_s)) {
        return Usage("--timeout-s: '" + std::string(argv[i]) + "' is not 1 to 3600 seconds");
      }
    } else if (a.starts_with("join=") || a.starts_with("drain=") || a.starts_with("leave-worker=")) {
      if (target >= 0) return Usage("one move at a time: '" + std::string(a) + "' is a second");
      what = std::string(a.substr(0, a.find('=')));
      if (!ParseInt(a.substr(what.size() + 1), 0, 65535, &target)) {
        return Usage("'" + std::string(a) + "': " + (what == "leave-worker" ? "W is a worker" : "K is a server") +
                     " rank (0 to 65535)");
      }
    } else {
      return Usage("unknown or incomplete argument '" + std::string(a) + "'");
    }
  }
  if (options.server0.empty()) return Usage("--server (server 0's endpoint) is required");
  if (target < 0) return Usage("name the move: join=K, drain=K or leave-worker=W");
  (what == "join" ? options.join : what == "drain" ? options.drain : options.leave_worker) = static_cast<int>(target);
  options.rank = static_cast<int>(rank);
  options.timeout = std::chrono::seconds(timeout_s);
  if (!keys.empty()) {
    auto loaded = ferry::curve::LoadClientKeys(keys, options.rank);
    if (!loaded.ok()) {
      std::fprintf(stderr, "ferry-move: %s\n", loaded.status().ToString().c_str());
      return 1;
    }
    options.curve = std::move(*loaded);
  }
  if (const ferry::Status s = ferry::AskMove(options); !s.ok()) {
    std::fprintf(stderr, "ferry-move: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("ferry-move: server 0 keeps the ask (%s %lld); the workers make it at their next move check\n",
              what.c_str(), target);
  return 0;
}
