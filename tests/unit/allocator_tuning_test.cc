// The allocator tuning Ferry's client and server apply (transport.h): wanted unless the program
// opts out (FERRY_MALLOC_TUNING=off) or set glibc's malloc tunables itself, applied once, and in
// effect: a freed 16 MiB buffer stays in the heap for the next message (glibc's default would
// have mapped it apart and unmapped it at free), while free memory above 128 MiB at the top of
// the heap goes back to the kernel.
#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include <gtest/gtest.h>

#include "ferry/messages/transport.h"

// Sanitizers replace malloc: glibc's settings do not apply there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FERRY_OWN_MALLOC 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define FERRY_OWN_MALLOC 1
#endif
#endif

namespace ferry::transport {
namespace {

TEST(AllocatorTuning, WantedUnlessTheProgramOptsOutOrTunesMallocItself) {
  EXPECT_TRUE(AllocatorTuningWanted(nullptr, nullptr));
  EXPECT_TRUE(AllocatorTuningWanted("on", nullptr));
  for (const char* off : {"off", "0", "no", "false"}) EXPECT_FALSE(AllocatorTuningWanted(off, nullptr)) << off;
  EXPECT_TRUE(AllocatorTuningWanted(nullptr, "glibc.pthread.rseq=0"));
  EXPECT_FALSE(AllocatorTuningWanted(nullptr, "glibc.malloc.mmap_threshold=65536"));
  EXPECT_FALSE(AllocatorTuningWanted(nullptr, "glibc.pthread.rseq=0:glibc.malloc.trim_threshold=1"));
}

TEST(AllocatorTuning, AFreedLargeBufferStaysInTheHeapAndAHugeOneGoesBack) {
  if (!AllocatorTuningWanted(std::getenv("FERRY_MALLOC_TUNING"), std::getenv("GLIBC_TUNABLES"))) {
    GTEST_SKIP() << "this environment opts out of the tuning (FERRY_MALLOC_TUNING / GLIBC_TUNABLES)";
  }
#ifdef FERRY_OWN_MALLOC
  GTEST_SKIP() << "a sanitizer build: its malloc is not glibc's, whose settings this checks";
#else
  ASSERT_TRUE(TuneAllocatorForLargeMessages());
  ASSERT_TRUE(TuneAllocatorForLargeMessages()) << "once per process, then in effect";
  constexpr size_t kMessage = size_t{16} << 20;
  void* p = std::malloc(kMessage);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, kMessage);
  const size_t mapped_before_free = mallinfo2().hblkhd;
  std::free(p);
  // Below the 32 MiB mmap threshold: it came from the heap, and its bytes stay free there.
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before_free) << "a 16 MiB buffer was mapped apart";
  EXPECT_GE(mallinfo2().fordblks, kMessage) << "the freed 16 MiB did not stay in the heap";
  // Above the mmap threshold: mapped apart, and unmapped at once when freed.
  constexpr size_t kHuge = size_t{64} << 20;
  void* q = std::malloc(kHuge);
  ASSERT_NE(q, nullptr);
  EXPECT_GE(mallinfo2().hblkhd, mapped_before_free + kHuge);
  std::free(q);
  EXPECT_LT(mallinfo2().hblkhd, mapped_before_free + kHuge);
#endif
}

}  // namespace
}  // namespace ferry::transport
