#include "test_files.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cstdio>
#include <fstream>

namespace ferry::data::testing {

TempFile::TempFile(std::string_view suffix) {
  static std::atomic<int> counter{0};
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr ? std::string(info->test_suite_name()) + "." + info->name() : "none";
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  path_ = ::testing::TempDir() + "ferry_data_" + name + "_" + std::to_string(::getpid()) + "_" +
          std::to_string(counter++) + std::string(suffix);
}

TempFile::~TempFile() { std::remove(path_.c_str()); }

void WritePlain(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

std::string Gzip(std::string_view bytes) {
  z_stream zs{};
  // windowBits 15 + 16: a gzip wrapper rather than zlib's.
  EXPECT_EQ(deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, static_cast<uLong>(bytes.size())) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = static_cast<uInt>(bytes.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

void WriteGzip(const std::string& path, std::string_view bytes) { WritePlain(path, Gzip(bytes)); }

std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims, std::string_view data) {
  std::string out;
  auto put32 = [&out](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xff));
  };
  put32(magic);
  for (uint32_t d : dims) put32(d);
  out.append(data);
  return out;
}

}  // namespace ferry::data::testing
