#include "internal/shared_floats.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "ferry/messages/transport.h"

namespace ferry::ps {

SharedFloats::SharedFloats(size_t n) {
  if (n == 0) return;
  void* p = ::operator new(sizeof(Block) + n * sizeof(float), std::align_val_t{alignof(Block)});
  block_ = new (p) Block;
  block_->n = n;
}

void SharedFloats::Release(Block* b) {
  if (b == nullptr) return;
  // acq_rel: the last holder, whichever thread it is on, sees every write made before any release.
  if (b->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  b->~Block();
  ::operator delete(b, std::align_val_t{alignof(Block)});
}

// Called by ZeroMQ once it has sent the frame, on its own I/O thread (tcp, ipc), or by the
// receiver's thread when it drops the message (inproc).
void SharedFloats::ReleaseFrame(void*, void* hint) {
  transport::internal::HandoffReceived();  // under TSan: the block came from the owner through ZeroMQ
  Release(static_cast<Block*>(hint));
}

zmq::message_t SharedFloats::Frame() const {
  if (block_ == nullptr) return zmq::message_t();
  block_->refs.fetch_add(1, std::memory_order_relaxed);
  return zmq::message_t(block_->data(), block_->n * sizeof(float), &ReleaseFrame, block_);
}

SharedFloats SharedFloats::PrepareWrite() {
  if (Unique()) return SharedFloats();
  SharedFloats fresh(size());
  std::swap(block_, fresh.block_);
  return fresh;  // the old buffer
}

void SharedFloats::Assign(std::span<const float> v) {
  if (!Unique() || size() != v.size()) *this = SharedFloats(v.size());
  if (!v.empty()) std::memcpy(data(), v.data(), v.size() * sizeof(float));
}

bool operator==(const SharedFloats& a, const SharedFloats& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace ferry::ps
