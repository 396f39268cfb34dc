// tests/fuzz/fuzz_input.h — how a fuzz input stands for one multipart ZeroMQ message, and the seed
// messages (valid requests of every kind) the fuzzers start from.
//
// Encoding: a sequence of frames, each [u16 little-endian length][that many bytes]; a length
// running past the end takes what is left. At most 4100 frames (the server keeps 4098).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry::fuzz {

std::vector<std::string_view> SplitFrames(const uint8_t* data, size_t size);
std::string JoinFrames(const std::vector<std::string>& frames);

// The tables the server fuzzer declares before fuzzing (one server, two workers): what the seeds
// address. Seeds speak as worker 1 (the declaring client is worker 0).
inline constexpr int kSeedRank = 1;
inline constexpr int kWorkers = 2;

// Named seed messages: [header][payload...] of every request kind, valid for those tables, and a
// few refusals (another major version, a bad shard name).
std::vector<std::pair<std::string, std::vector<std::string>>> SeedMessages();

}  // namespace ferry::fuzz
