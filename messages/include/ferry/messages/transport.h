// ferry/messages/transport.h — the ZeroMQ adapter. Every cppzmq call that can throw is made
// here and its exception becomes a Status; nothing above this layer sees zmq::error_t.
// Thread-safety: a zmq socket belongs to one thread; these helpers add no sharing.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "ferry/context.h"
#include "ferry/mutex.h"
#include "ferry/status.h"

namespace ferry {

struct Context::Impl {
  explicit Impl(int io_threads) : zmq(io_threads) {}
  zmq::context_t zmq;
};

namespace transport {

using Frames = std::vector<zmq::message_t>;

inline zmq::context_t& Zmq(Context& c) { return c.impl().zmq; }

// Counts frames lent to ZeroMQ without copying (see Borrow). `outstanding` reaches zero once
// ZeroMQ has released every one of them: only then may the owner reuse or free the memory.
class Lender {
 public:
  void Lend() { outstanding_.fetch_add(1, std::memory_order_acq_rel); }
  void Release();
  // Waits until every lent frame is released or `deadline` passes; true when all are back.
  bool WaitReturned(std::chrono::steady_clock::time_point deadline);
  int64_t outstanding() const { return outstanding_.load(std::memory_order_acquire); }

 private:
  std::atomic<int64_t> outstanding_{0};
  Mutex mu_;
  CondVar cv_;  // signalled (under mu_) when outstanding_ reaches zero
};

// A frame that points at `data` instead of copying it. The caller keeps `data` alive and
// unchanged until `lender->outstanding()` is back to zero (ZeroMQ may hold a frame after send()
// returns, and longer still if the peer is unreachable).
zmq::message_t Borrow(const void* data, size_t size, const std::shared_ptr<Lender>& lender);

namespace internal {
// Under ThreadSanitizer: orders what the sending thread did before every later receipt (see
// transport.cc); nothing otherwise. For free functions that ZeroMQ calls on its own thread.
void HandoffReceived();
// Under ThreadSanitizer: orders what this thread did with a received frame before the free of a
// frame whose content another thread shares (zmq_msg_copy: libzmq's reference count, which TSan
// cannot see), when that free may come before this thread's next send; nothing otherwise.
void HandoffDone();
template <typename T>
void FreeAdopted(void* /*data*/, void* hint) {
  HandoffReceived();  // the vector came from the sending thread through ZeroMQ
  delete static_cast<std::vector<T>*>(hint);
}
}  // namespace internal

// A frame that takes `v` over without copying it; ZeroMQ frees it (maybe on its own I/O thread)
// once it no longer needs it.
template <typename T>
zmq::message_t Adopt(std::vector<T>&& v) {
  auto* held = new std::vector<T>(std::move(v));
  return zmq::message_t(held->data(), held->size() * sizeof(T), &internal::FreeAdopted<T>, held);
}

// A new socket with linger 0 and the given high-water marks; errors as Status.
StatusOr<zmq::socket_t> MakeSocket(zmq::context_t& ctx, zmq::socket_type type, int hwm = 1000);

// Sends every frame of `frames` as one multipart message (consumes them). With `dontwait`, a
// full queue returns ResourceExhausted at once instead of blocking (a multipart message is
// accepted or refused whole).
Status Send(zmq::socket_t& socket, Frames& frames, bool dontwait = false);

// Receives one whole multipart message without blocking. Returns false in `*got` when nothing
// is waiting. At most `max_frames` frames are kept; further frames of the same message are read
// and dropped, and `*truncated` is set, so a hostile peer cannot grow memory without bound.
Status RecvNonBlocking(zmq::socket_t& socket, Frames* frames, bool* got, size_t max_frames, bool* truncated);
// Waits for one whole multipart message, bounded by the socket's ZMQ_RCVTIMEO (DEADLINE_EXCEEDED
// when none came in time); frames past `max_frames` are dropped. For tests and tools.
Status Recv(zmq::socket_t& socket, Frames* frames, size_t max_frames = 4097);

// Process-wide malloc tuning for programs that move large messages: freed buffers up to 32 MiB
// stay in the heap instead of going back to the kernel (glibc's mmap threshold), so the next
// message reuses warm pages rather than faulting in fresh ones (on small VMs a first touch costs
// ~10 us a page: bench/RESULTS.md), and at most 128 MiB of free memory stays at the top of the
// heap (the trim threshold: what one large message left is given back). Client::Connect and
// Server::Start apply it, once per process, so a program on Ferry's libraries is fast without
// knowing to; a program opts out with FERRY_MALLOC_TUNING=off in its environment, and one whose
// GLIBC_TUNABLES sets a glibc.malloc tunable keeps its own settings. Returns whether the tuning
// is in effect (applied now or before).
bool TuneAllocatorForLargeMessages();
// The decision above, from the two environment values (null: unset): false for
// FERRY_MALLOC_TUNING "off", "0", "no" or "false", or a GLIBC_TUNABLES naming glibc.malloc.
bool AllocatorTuningWanted(const char* ferry_malloc_tuning, const char* glibc_tunables);

// Gives the heap's free memory back to the system (malloc_trim on every arena) and returns the
// resident bytes that went back. ZeroMQ allocates every received frame on its own, and glibc keeps
// freed chunks below its mmap threshold for reuse however many there are, trimming only the top of
// a heap: a refused message of 100,000 frames of 8 KiB left a server 590 MB larger for good. Not
// free: it walks every free chunk (100 ms for a heap of 100,000 free chunks on VM-C, a build beside it), so
// a server calls it after a refused large message, not on a schedule. The top of a thread's arena
// below the trim threshold (at most 64 MiB an arena) stays.
int64_t GiveFreeMemoryBack();
// This process's resident memory in bytes (/proc/self/statm); -1 if unknown.
int64_t ResidentBytes();
// The bytes this process's heap has handed out and not had back (glibc's mallinfo2: in its arenas
// and mapped apart; under a sanitizer, its allocator's count): unlike ResidentBytes, not what the
// allocator keeps after a free.
int64_t HeapInUseBytes();

// A routing-id-free description of a zmq endpoint for error messages.
std::string LastEndpoint(zmq::socket_t& socket);

// A PAIR socket that receives `socket`'s monitor events (the ZMQ_EVENT_* bits of `events`),
// under an inproc name unique in the process (sockets share contexts, and a closed monitor's name
// may linger). Watch before connect or bind, so that no event is missed.
StatusOr<zmq::socket_t> Watch(zmq::context_t& ctx, zmq::socket_t& socket, int events);

// One event a monitor received: [u16 event][u32 value: a descriptor, an error][endpoint];
// nullopt for frames that are not one.
struct MonitorEvent {
  uint16_t event = 0;
  uint32_t value = 0;
};
std::optional<MonitorEvent> ReadMonitorEvent(const Frames& frames);

}  // namespace transport
}  // namespace ferry

namespace ferry::transport {

// An eventfd that wakes a zmq_poll loop from another thread (pollable as a plain fd).
class Waker {
 public:
  Waker();
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void Notify();  // any thread
  void Drain();   // the polling thread, when fd() is readable

 private:
  int fd_ = -1;
};

}  // namespace ferry::transport
