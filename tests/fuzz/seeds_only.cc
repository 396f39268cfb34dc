// fuzz-seeds: replay_main.cc with a target that does nothing, so that `fuzz-seeds --write-seeds
// DIR` writes the seed corpus in builds whose fuzz targets link libFuzzer's own main().
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }
