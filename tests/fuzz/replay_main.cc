// A main() for the fuzz targets where libFuzzer is not linked (GCC builds, and the plain test
// suite): runs the built-in seed messages, then every file or folder of files named on the
// command line, through LLVMFuzzerTestOneInput. `--write-seeds DIR` writes the seeds as files
// for libFuzzer's corpus instead.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void RunOne(const std::string& bytes) {
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  const auto seeds = ferry::fuzz::SeedMessages();
  if (argc == 3 && std::string(argv[1]) == "--write-seeds") {
    std::filesystem::create_directories(argv[2]);
    for (const auto& [name, frames] : seeds) {
      std::ofstream(std::filesystem::path(argv[2]) / name, std::ios::binary) << ferry::fuzz::JoinFrames(frames);
    }
    std::printf("wrote %zu seeds to %s\n", seeds.size(), argv[2]);
    return 0;
  }
  size_t runs = 0;
  for (const auto& [name, frames] : seeds) {
    RunOne(ferry::fuzz::JoinFrames(frames));
    ++runs;
  }
  for (int i = 1; i < argc; ++i) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(argv[i])) {
      for (const auto& e : std::filesystem::directory_iterator(argv[i])) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      RunOne(std::string(std::istreambuf_iterator<char>(in), {}));
      ++runs;
    }
  }
  std::printf("ran %zu inputs: no crash\n", runs);
  return 0;
}
