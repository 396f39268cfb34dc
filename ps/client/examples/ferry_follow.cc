// ferry-follow: keeps a serving copy of one table in sync with a training job through the change
// feed (ferry/feed.h), as a serving process would: every --every-ms it polls the servers for what
// changed, applies it to its copy, and says what the round brought and how long it took.
//
//   ferry-follow --servers tcp://h1:p1,tcp://h2:p2 --table NAME [--every-ms 1000] [--rounds N]
//                [--curve-keys DIR --reader R]
//
// --rounds 0 (the default) follows until interrupted. With --curve-keys, the reader's keys from
// the job's key folder (ferry-keys --readers): the servers let it read and nothing else.
// Exit status: 0 done, 1 a poll failed, 2 bad usage.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ferry/feed.h"

namespace {

int Usage() {
  std::fputs(
      "usage: ferry-follow --servers E1[,E2...] --table NAME [--every-ms MS] [--rounds N]\n"
      "                    [--curve-keys DIR --reader R]\n",
      stderr);
  return 2;
}

bool ParseInt(const char* text, long long low, long long* out) {
  char* end = nullptr;
  *out = std::strtoll(text, &end, 10);
  return end != text && *end == '\0' && *out >= low;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::FeedOptions options;
  std::string table, keys;
  long long every_ms = 1000, rounds = 0, reader = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (i + 1 >= argc) return Usage();
    const char* value = argv[++i];
    bool ok = true;
    if (flag == "--servers") {
      std::string_view list = value;
      while (!list.empty()) {
        const size_t comma = list.find(',');
        options.servers.emplace_back(list.substr(0, comma));
        list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
      }
    } else if (flag == "--table") {
      table = value;
    } else if (flag == "--every-ms") {
      ok = ParseInt(value, 1, &every_ms);
    } else if (flag == "--rounds") {
      ok = ParseInt(value, 0, &rounds);
    } else if (flag == "--curve-keys") {
      keys = value;
    } else if (flag == "--reader") {
      ok = ParseInt(value, 0, &reader);
    } else {
      std::fprintf(stderr, "ferry-follow: unknown flag %s\n", argv[i - 1]);
      return Usage();
    }
    if (!ok) {
      std::fprintf(stderr, "ferry-follow: %s: '%s' is not a valid value\n", argv[i - 1], value);
      return 2;
    }
  }
  if (options.servers.empty() || table.empty() || keys.empty() != (reader < 0)) return Usage();
  if (!keys.empty()) {
    auto k = ferry::curve::LoadReaderKeys(keys, static_cast<int>(reader));
    if (!k.ok()) {
      std::fprintf(stderr, "ferry-follow: %s\n", k.status().message().c_str());
      return 2;
    }
    options.curve = *k;
  }
  auto feed = ferry::ChangeFeed::Connect(options);
  if (!feed.ok()) {
    std::fprintf(stderr, "ferry-follow: %s\n", feed.status().message().c_str());
    return 2;
  }
  ferry::TableCopy copy;
  for (long long round = 1; rounds == 0 || round <= rounds; ++round) {
    const auto start = std::chrono::steady_clock::now();
    ferry::TableChanges changes;
    if (const ferry::Status s = (*feed)->Poll(table, &changes); !s.ok()) {
      std::fprintf(stderr, "ferry-follow: round %lld: %s\n", round, s.message().c_str());
      return 1;
    }
    if (const ferry::Status s = copy.Apply(changes, (*feed)->num_servers()); !s.ok()) {
      std::fprintf(stderr, "ferry-follow: %s\n", s.message().c_str());
      return 1;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (changes.spec.type == ferry::TableType::kSparse) {
      std::printf("round %lld: %zu rows changed, %zu deleted, %zu server(s) sent all; the copy holds %zu rows "
                  "(%.1f ms, %lld pages)\n",
                  round, changes.ids.size(), changes.deleted.size(), changes.full_servers.size(), copy.size(), ms,
                  static_cast<long long>(changes.pages));
    } else {
      size_t elements = 0;
      for (const auto& r : changes.ranges) elements += static_cast<size_t>(r.end - r.begin);
      std::printf("round %lld: %zu chunks (%zu elements) changed of %zu (%.1f ms, %lld pages)\n", round,
                  changes.ranges.size(), elements, copy.dense().size(), ms, static_cast<long long>(changes.pages));
    }
    std::fflush(stdout);
    if (rounds == 0 || round < rounds) std::this_thread::sleep_for(std::chrono::milliseconds(every_ms));
  }
  return 0;
}
