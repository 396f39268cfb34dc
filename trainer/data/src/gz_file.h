// Private: a read-only file through zlib's gz* interface (gzipped files are inflated as they
// stream in, plain files pass through), and a line splitter on top of it.
// Thread-safety: neither class is thread-safe; each owns its handle / buffer.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.h"

namespace ferry::data::internal {

// stat(2) of `path`, its failure as a Status naming the path: NOT_FOUND (no such file or folder),
// PERMISSION_DENIED, or UNAVAILABLE.
Status StatPath(const std::string& path, struct stat* st);

class GzFile {
 public:
  // NOT_FOUND if `path` does not exist, PERMISSION_DENIED if it cannot be read, INVALID_ARGUMENT
  // if it is a directory.
  static StatusOr<GzFile> Open(const std::string& path);

  GzFile(GzFile&& other) noexcept;
  GzFile& operator=(GzFile&& other) noexcept;
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  ~GzFile();

  // Reads up to `n` bytes into `dst`; returns how many (fewer than `n` only at the end of the
  // data). DATA_LOSS naming the file on a read error or a corrupt or truncated gzip stream.
  StatusOr<int64_t> Read(void* dst, int64_t n);
  // Back to the first byte.
  Status Rewind();

  const std::string& path() const { return path_; }

 private:
  GzFile(std::string path, void* handle) : path_(std::move(path)), handle_(handle) {}
  std::string path_;
  void* handle_ = nullptr;  // gzFile, owned; void* keeps zlib.h out of this header
};

// Splits a GzFile into lines ('\n'-terminated; the last line may lack it). Memory: the buffer,
// grown for a long line up to twice max_line_bytes at most; a longer line is not held.
class LineReader {
 public:
  LineReader(GzFile file, int64_t buffer_bytes, int64_t max_line_bytes = int64_t{1} << 20);

  // Sets *line to the next line without its '\n' and returns true, or returns false at the end.
  // A line of more than max_line_bytes is read past, not kept: *too_long is set and *line empty;
  // one with no end within kReadPastLines times max_line_bytes is INVALID_ARGUMENT naming the
  // file and the byte it started at (a device such as /dev/zero would be read forever). The view
  // stays valid until the next call. Errors from the file are returned as they are.
  StatusOr<bool> Next(std::string_view* line, bool* too_long);
  static constexpr int64_t kReadPastLines = 64;
  Status Rewind();

  const std::string& path() const { return file_.path(); }
  // Bytes of the (inflated) file consumed by Next since the start or the last Rewind.
  int64_t bytes() const { return consumed_; }

 private:
  Status Fill();  // moves the unread tail to the front and reads more after it

  GzFile file_;
  std::vector<char> buffer_;
  int64_t max_line_;
  int64_t begin_ = 0;  // first unread byte
  int64_t end_ = 0;    // one past the last valid byte
  int64_t consumed_ = 0;
  int64_t line_start_ = 0;  // where the line being read past began
  bool eof_ = false;
};

}  // namespace ferry::data::internal
