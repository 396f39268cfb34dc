// A bounds-checked reader of little-endian fields in a byte span: checkpoint blocks
// (checkpoint.cc) and failover images (recovery.cc).
//
// Thread-safety: none; a Reader is used by one thread.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.h"

namespace ferry::ps {

// Reads a block payload's (or an image's) fields in order; every read is bounds-checked, and one
// past the end is DATA_LOSS naming `where` and `what` ends early.
class Reader {
 public:
  Reader(std::span<const char> data, std::string where, const char* what = "the block")
      : data_(data), where_(std::move(where)), what_(what) {}
  template <typename T>
  Status Get(T* v) {
    if (data_.size() - at_ < sizeof(T)) return Short();
    std::memcpy(v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::Ok();
  }
  template <typename T>
  Status GetArray(std::vector<T>* out, uint64_t n) {
    if (n > (data_.size() - at_) / sizeof(T)) return Short();
    out->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out->data(), data_.data() + at_, static_cast<size_t>(n) * sizeof(T));
    at_ += static_cast<size_t>(n) * sizeof(T);
    return Status::Ok();
  }
  // Passes `n` values of T by.
  template <typename T>
  Status Skip(uint64_t n) {
    if (n > (data_.size() - at_) / sizeof(T)) return Short();
    at_ += static_cast<size_t>(n) * sizeof(T);
    return Status::Ok();
  }
  // The next `n` bytes, in place.
  Status GetBytes(std::span<const char>* out, uint64_t n) {
    if (n > data_.size() - at_) return Short();
    *out = data_.subspan(at_, static_cast<size_t>(n));
    at_ += static_cast<size_t>(n);
    return Status::Ok();
  }
  size_t left() const { return data_.size() - at_; }
  Status Done() const {
    return at_ == data_.size()
               ? Status::Ok()
               : DataLossError(where_ + ": " + std::to_string(data_.size() - at_) + " unexpected bytes");
  }

 private:
  Status Short() const { return DataLossError(where_ + ": " + what_ + " ends early"); }
  std::span<const char> data_;
  size_t at_ = 0;
  std::string where_;
  const char* what_;
};

}  // namespace ferry::ps
