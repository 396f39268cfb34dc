#include "gz_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

namespace ferry::data::internal {
namespace {

gzFile AsGz(void* handle) { return static_cast<gzFile>(handle); }

}  // namespace

Status StatPath(const std::string& path, struct stat* st) {
  if (::stat(path.c_str(), st) == 0) return Status::Ok();
  const int err = errno;
  std::string what = path + ": " + std::strerror(err);
  if (err == ENOENT || err == ENOTDIR) return NotFoundError(std::move(what));
  if (err == EACCES) return Status(StatusCode::kPermissionDenied, std::move(what));
  return UnavailableError(std::move(what));
}

StatusOr<GzFile> GzFile::Open(const std::string& path) {
  struct stat st;
  FERRY_RETURN_IF_ERROR(StatPath(path, &st));
  if (S_ISDIR(st.st_mode)) return InvalidArgumentError(path + ": is a directory, not a file");
  errno = 0;
  gzFile handle = gzopen(path.c_str(), "rb");
  if (handle == nullptr) {
    const int err = errno;
    std::string what = path + ": cannot open: " + (err != 0 ? std::strerror(err) : "out of memory");
    if (err == EACCES) return Status(StatusCode::kPermissionDenied, std::move(what));
    return UnavailableError(std::move(what));
  }
  gzbuffer(handle, 1 << 17);
  return GzFile(path, handle);
}

GzFile::GzFile(GzFile&& other) noexcept
    : path_(std::move(other.path_)), handle_(std::exchange(other.handle_, nullptr)) {}

GzFile& GzFile::operator=(GzFile&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) gzclose(AsGz(handle_));
    path_ = std::move(other.path_);
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

GzFile::~GzFile() {
  if (handle_ != nullptr) gzclose(AsGz(handle_));
}

StatusOr<int64_t> GzFile::Read(void* dst, int64_t n) {
  char* out = static_cast<char*>(dst);
  int64_t total = 0;
  while (total < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - total, INT_MAX / 2));
    const int got = gzread(AsGz(handle_), out + total, chunk);
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(AsGz(handle_), &errnum);
      if (errnum == Z_ERRNO) msg = std::strerror(errno);
      return DataLossError(path_ + ": read error after " + std::to_string(total) +
                           " bytes of this read: " + msg);
    }
    total += got;
    if (static_cast<unsigned>(got) < chunk) {
      // A short read is the end of the data, or a gzip stream that ended early: gzread reports
      // the latter (Z_BUF_ERROR, "unexpected end of file") only through gzerror.
      int errnum = 0;
      const char* msg = gzerror(AsGz(handle_), &errnum);
      if (errnum != Z_OK) {
        return DataLossError(path_ + ": corrupt or truncated gzip stream: " + msg);
      }
      break;
    }
  }
  return total;
}

Status GzFile::Rewind() {
  if (gzrewind(AsGz(handle_)) != 0) return DataLossError(path_ + ": cannot rewind");
  return Status::Ok();
}

LineReader::LineReader(GzFile file, int64_t buffer_bytes, int64_t max_line_bytes)
    : file_(std::move(file)),
      buffer_(static_cast<size_t>(std::max<int64_t>(buffer_bytes, 1024))),
      max_line_(std::max<int64_t>(max_line_bytes, 1)) {}

Status LineReader::Fill() {
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, static_cast<size_t>(end_ - begin_));
    end_ -= begin_;
    begin_ = 0;
  }
  // A line longer than the buffer (Next stops it at max_line_ bytes, so this stays bounded).
  if (end_ == static_cast<int64_t>(buffer_.size())) buffer_.resize(buffer_.size() * 2);
  FERRY_ASSIGN_OR_RETURN(int64_t got,
                         file_.Read(buffer_.data() + end_, static_cast<int64_t>(buffer_.size()) - end_));
  end_ += got;
  if (got == 0) eof_ = true;
  return Status::Ok();
}

StatusOr<bool> LineReader::Next(std::string_view* line, bool* too_long) {
  *too_long = false;
  int64_t scanned = begin_;  // bytes before `scanned` hold no '\n'
  for (;;) {
    const void* nl = std::memchr(buffer_.data() + scanned, '\n', static_cast<size_t>(end_ - scanned));
    if (nl != nullptr || eof_) {
      const int64_t pos = nl != nullptr ? static_cast<const char*>(nl) - buffer_.data() : end_;
      if (nl == nullptr && begin_ == end_ && !*too_long) return false;
      // Too long whether its end was in the buffer already or not: the same line, the same verdict.
      if (pos - begin_ > max_line_) *too_long = true;
      *line =
          *too_long ? std::string_view() : std::string_view(buffer_.data() + begin_, static_cast<size_t>(pos - begin_));
      const int64_t next = nl != nullptr ? pos + 1 : end_;
      consumed_ += next - begin_;
      begin_ = next;
      return true;
    }
    if (end_ - begin_ > max_line_) {
      // No '\n' in more than max_line_ bytes: drop them and read on to the line's end, but not
      // forever: a file with no line ends (/dev/zero, a binary file) is not text lines.
      if (!*too_long) line_start_ = consumed_;
      *too_long = true;
      consumed_ += end_ - begin_;
      begin_ = end_;
      if (consumed_ - line_start_ > kReadPastLines * max_line_) {
        return InvalidArgumentError(file_.path() + ": no line end in " + std::to_string(consumed_ - line_start_) +
                                    " bytes from byte " + std::to_string(line_start_) + ", over " +
                                    std::to_string(kReadPastLines) + " times the longest line (" +
                                    std::to_string(max_line_) + " bytes): not text lines (a device such as "
                                    "/dev/zero, or a binary file?)");
      }
      FERRY_RETURN_IF_ERROR(Fill());
      scanned = begin_;
      continue;
    }
    const int64_t unread_scanned = end_ - begin_;
    FERRY_RETURN_IF_ERROR(Fill());
    scanned = begin_ + unread_scanned;
  }
}

Status LineReader::Rewind() {
  FERRY_RETURN_IF_ERROR(file_.Rewind());
  begin_ = end_ = consumed_ = 0;
  eof_ = false;
  return Status::Ok();
}

}  // namespace ferry::data::internal
