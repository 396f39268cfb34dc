// ferry-keys: writes a new CURVE key folder for a job (ferry/curve.h says what is in it).
//
//   ferry-keys DIR --workers N [--readers M]
//
// Then: ferry-ps --curve-keys DIR ...; ferry-trainer --curve-keys DIR ... (or ferry-launch --curve,
// which runs this for you). Every file is owner-only; copy each host only what it runs.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ferry/curve.h"

namespace {

void Usage(std::FILE* out) {
  std::fputs(
      "usage: ferry-keys DIR --workers N [--readers M]\n"
      "  Writes a new CURVE key folder for a job of N workers into DIR (created, mode 0700; existing\n"
      "  keys are never overwritten): server.key and server.pub (the servers' keypair and its public\n"
      "  half), worker-R.key for each worker R, and workers.pub (the keys the servers accept).\n"
      "  Servers need server.key and workers.pub; worker R needs server.pub and worker-R.key.\n"
      "  --readers M also writes reader-R.key for M readers and readers.pub: keys the servers let\n"
      "  read (the change feed, ferry/feed.h; Stats) and nothing else. A reader needs server.pub and\n"
      "  its reader-R.key; servers given readers.pub beside workers.pub accept them.\n",
      out);
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  long long workers = 0;
  long long readers = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    }
    // A count flag's value: false (said why) when missing or outside [low, 65536].
    auto count = [&](long long low, long long* out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ferry-keys: %s needs a value\n", argv[i]);
        return false;
      }
      char* end = nullptr;
      *out = std::strtoll(argv[i + 1], &end, 10);
      if (end == argv[i + 1] || *end != '\0' || *out < low || *out > 65536) {
        std::fprintf(stderr, "ferry-keys: %s expects an integer in [%lld, 65536], got '%s'\n", argv[i], low,
                     argv[i + 1]);
        return false;
      }
      ++i;
      return true;
    };
    if (arg == "--workers") {
      if (!count(1, &workers)) return 2;
    } else if (arg == "--readers") {
      if (!count(0, &readers)) return 2;
    } else if (arg.starts_with("-")) {
      std::fprintf(stderr, "ferry-keys: unknown flag %s\n", argv[i]);
      Usage(stderr);
      return 2;
    } else if (dir.empty()) {
      dir = argv[i];
    } else {
      std::fprintf(stderr, "ferry-keys: one folder, please (got '%s' and '%s')\n", dir.c_str(), argv[i]);
      return 2;
    }
  }
  if (dir.empty() || workers == 0) {
    Usage(stderr);
    return 2;
  }
  const ferry::Status s = ferry::curve::WriteJobKeys(dir, static_cast<int>(workers), static_cast<int>(readers));
  if (!s.ok()) {
    std::fprintf(stderr, "ferry-keys: %s\n", s.message().c_str());
    return 2;
  }
  std::printf("ferry-keys: wrote the keys of a job of %lld worker(s) and %lld reader(s) to %s\n", workers, readers,
              dir.c_str());
  return 0;
}
