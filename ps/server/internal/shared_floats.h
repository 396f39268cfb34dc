// ps/server/internal/shared_floats.h — a dense chunk's values, shared with the reply frames that
// send them, so that a pull is answered without copying the values (copy-on-write).
//
// A pull's reply frame refers to the chunk's buffer (Frame) instead of holding a copy; ZeroMQ
// drops that reference once it has sent the frame. An update writes in place while the chunk
// alone holds its buffer, which is the case in a steady run: a worker's next push comes after
// its pull's reply has gone. Only when a reply still holds the buffer does the update move the
// chunk to a new one (PrepareWrite), and the frames in flight keep sending the values they were
// made from. Either way the update does the same one pass over the values: a copy happens only
// in that second case, in the update's own loop.
//
// Thread-safety: one thread owns a SharedFloats and calls everything on it (the server's I/O
// thread; compute threads may write disjoint ranges of data() while it waits for them). Frames
// may be released on any thread (ZeroMQ's I/O thread): the reference count is atomic, and a
// release happens before the owner's next Unique() that sees it.
#pragma once

#include <atomic>
#include <cstddef>
#include <span>
#include <utility>

#include <zmq.hpp>

namespace ferry::ps {

class SharedFloats {
 public:
  SharedFloats() = default;
  // n floats, uninitialised. std::bad_alloc if there is no memory.
  explicit SharedFloats(size_t n);
  SharedFloats(SharedFloats&& o) noexcept : block_(std::exchange(o.block_, nullptr)) {}
  SharedFloats& operator=(SharedFloats&& o) noexcept {
    std::swap(block_, o.block_);
    return *this;
  }
  SharedFloats(const SharedFloats&) = delete;
  SharedFloats& operator=(const SharedFloats&) = delete;
  ~SharedFloats() { Release(block_); }

  size_t size() const { return block_ == nullptr ? 0 : block_->n; }
  bool empty() const { return size() == 0; }
  // 64-byte aligned. Write only after PrepareWrite (or while Unique()).
  float* data() { return block_ == nullptr ? nullptr : block_->data(); }
  const float* data() const { return block_ == nullptr ? nullptr : block_->data(); }
  float& operator[](size_t i) { return data()[i]; }
  float operator[](size_t i) const { return data()[i]; }
  float* begin() { return data(); }
  float* end() { return data() + size(); }
  const float* begin() const { return data(); }
  const float* end() const { return data() + size(); }
  std::span<const float> span() const { return {data(), size()}; }

  // Whether no frame refers to the buffer: the owner may write it in place.
  bool Unique() const { return block_ == nullptr || block_->refs.load(std::memory_order_acquire) == 1; }

  // A frame that sends the values as they are now, without copying them: it holds the buffer
  // until ZeroMQ has sent it (or the frame is dropped).
  zmq::message_t Frame() const;

  // Makes the values writable. When frames still hold the buffer, the chunk moves to a new one
  // (uninitialised) and the old buffer is returned: the caller fills the new one from it (in the
  // same pass as its update) and then drops it. Otherwise returns an empty SharedFloats: write in
  // place. std::bad_alloc if the new buffer cannot be had (the values are then unchanged).
  [[nodiscard]] SharedFloats PrepareWrite();

  // Replaces the values with `v` (a restore): in place when unique, in a new buffer otherwise.
  void Assign(std::span<const float> v);

  friend bool operator==(const SharedFloats& a, const SharedFloats& b);

 private:
  struct alignas(64) Block {
    std::atomic<int> refs{1};
    size_t n = 0;
    float* data() { return reinterpret_cast<float*>(this + 1); }
  };
  static void Release(Block* b);
  static void ReleaseFrame(void* data, void* hint);

  Block* block_ = nullptr;
};

}  // namespace ferry::ps
