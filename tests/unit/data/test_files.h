// Fixtures for the data tests: temporary files (plain or gzipped) and IDX byte images.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::data::testing {

// A file path unique to this process and the running test, removed on destruction.
class TempFile {
 public:
  explicit TempFile(std::string_view suffix);
  ~TempFile();
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes `bytes` to `path` as they are, or gzip-compressed with zlib. Fails the test on error.
void WritePlain(const std::string& path, std::string_view bytes);
void WriteGzip(const std::string& path, std::string_view bytes);
// Returns the gzip compression of `bytes` (a complete gzip member).
std::string Gzip(std::string_view bytes);

// An IDX byte image: big-endian `magic`, big-endian `dims`, then `data` as it is.
std::string IdxBytes(uint32_t magic, const std::vector<uint32_t>& dims, std::string_view data);

}  // namespace ferry::data::testing
