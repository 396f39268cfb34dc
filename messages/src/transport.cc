#include "ferry/messages/transport.h"

#include <malloc.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FERRY_SANITIZER_ALLOCATOR 1
#include <sanitizer/allocator_interface.h>
#endif
#endif

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define FERRY_TSAN 1
#endif
#ifdef FERRY_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace ferry::transport {
namespace {

// ZeroMQ hands a message from the thread that sends it to the one that receives it through
// lock-free queues inside libzmq, which ThreadSanitizer does not see (Debian's libzmq is not
// instrumented), so it would call every such hand-off a data race. Under TSan every send
// releases, and every receipt acquires, this one object: a send is then ordered before every
// later receipt (coarser than ZeroMQ's real order, never finer). Outside TSan builds: nothing.
[[maybe_unused]] char zmq_handoff;
inline void HandoffSend() {
#ifdef FERRY_TSAN
  __tsan_release(&zmq_handoff);
#endif
}
inline void HandoffReceived() {
#ifdef FERRY_TSAN
  __tsan_acquire(&zmq_handoff);
#endif
}

// Called by ZeroMQ (on its own I/O thread, for tcp and ipc) once it no longer needs a lent frame.
void ReleaseBorrowed(void* /*data*/, void* hint) {
  HandoffReceived();  // the frame and its hint came from the sending thread through ZeroMQ
  auto* lender = static_cast<std::shared_ptr<Lender>*>(hint);
  (*lender)->Release();
  delete lender;
}

Status FromZmq(const zmq::error_t& e, const char* what) {
  return UnavailableError(std::string(what) + ": " + e.what());
}

}  // namespace

void internal::HandoffReceived() { transport::HandoffReceived(); }
void internal::HandoffDone() { transport::HandoffSend(); }

void Lender::Release() {
  if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    MutexLock lock(&mu_);
    cv_.SignalAll();
  }
}

bool Lender::WaitReturned(std::chrono::steady_clock::time_point deadline) {
  MutexLock lock(&mu_);
  while (outstanding() != 0) {
    if (!cv_.WaitUntil(&mu_, deadline) && outstanding() != 0) return false;
  }
  return true;
}

zmq::message_t Borrow(const void* data, size_t size, const std::shared_ptr<Lender>& lender) {
  lender->Lend();
  // ZeroMQ never writes through the pointer of a message it sends.
  return zmq::message_t(const_cast<void*>(data), size, &ReleaseBorrowed, new std::shared_ptr<Lender>(lender));
}

StatusOr<zmq::socket_t> MakeSocket(zmq::context_t& ctx, zmq::socket_type type, int hwm) {
  try {
    zmq::socket_t s(ctx, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, hwm);
    s.set(zmq::sockopt::rcvhwm, hwm);
    return s;
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "creating a socket");
  }
}

Status Send(zmq::socket_t& socket, Frames& frames, bool dontwait) {
  try {
    for (size_t i = 0; i < frames.size(); ++i) {
      auto flags = i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      if (dontwait) flags = flags | zmq::send_flags::dontwait;
      HandoffSend();
      if (!socket.send(frames[i], flags)) {
        return ResourceExhaustedError("send timed out: the peer's queue stayed full");
      }
    }
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "send");
  }
  frames.clear();
  return Status::Ok();
}

namespace {

// One whole message: the first frame as `first` says (waiting or not), the rest at once.
// With `interrupted`, a first receive interrupted by a signal (EINTR) sets it and returns OK with
// nothing received, for the caller to retry; otherwise it is a failed receive like any other.
Status RecvMessage(zmq::socket_t& socket, zmq::recv_flags first, Frames* frames, bool* got, size_t max_frames,
                   bool* truncated, bool* interrupted = nullptr) {
  frames->clear();
  *got = false;
  *truncated = false;
  try {
    zmq::message_t msg;
    bool received = false;
    try {
      received = socket.recv(msg, first).has_value();
    } catch (const zmq::error_t& e) {
      if (interrupted == nullptr || e.num() != EINTR) return FromZmq(e, "recv");
      *interrupted = true;
      return Status::Ok();
    }
    if (!received) return Status::Ok();
    HandoffReceived();
    *got = true;
    bool more = msg.more();
    frames->push_back(std::move(msg));
    while (more) {
      zmq::message_t part;
      // The remaining frames of a message are already here: a blocking read cannot wait.
      (void)socket.recv(part, zmq::recv_flags::none);
      more = part.more();
      if (frames->size() < max_frames) {
        frames->push_back(std::move(part));
      } else {
        *truncated = true;
      }
    }
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "recv");
  }
  return Status::Ok();
}

}  // namespace

Status RecvNonBlocking(zmq::socket_t& socket, Frames* frames, bool* got, size_t max_frames, bool* truncated) {
  return RecvMessage(socket, zmq::recv_flags::dontwait, frames, got, max_frames, truncated);
}

Status Recv(zmq::socket_t& socket, Frames* frames, size_t max_frames) {
  // A signal (a profiler's, a fuzzer's timer) interrupts a blocking receive with EINTR: receive
  // again while the socket's timeout has not passed since the first try (so at most twice it).
  int timeout_ms = -1;
  try {
    timeout_ms = socket.get(zmq::sockopt::rcvtimeo);
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "recv");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  for (;;) {
    bool got = false, truncated = false, interrupted = false;
    FERRY_RETURN_IF_ERROR(
        RecvMessage(socket, zmq::recv_flags::none, frames, &got, max_frames, &truncated, &interrupted));
    if (got) return Status::Ok();
    if (interrupted && (timeout_ms < 0 || std::chrono::steady_clock::now() < deadline)) continue;
    return DeadlineExceededError("no message within the socket's receive timeout");
  }
}

bool AllocatorTuningWanted(const char* ferry_malloc_tuning, const char* glibc_tunables) {
  if (ferry_malloc_tuning != nullptr) {
    const std::string_view v = ferry_malloc_tuning;
    if (v == "off" || v == "0" || v == "no" || v == "false") return false;
  }
  return glibc_tunables == nullptr || std::string_view(glibc_tunables).find("glibc.malloc.") == std::string_view::npos;
}

bool TuneAllocatorForLargeMessages() {
  static const bool tuned = [] {
    if (!AllocatorTuningWanted(std::getenv("FERRY_MALLOC_TUNING"), std::getenv("GLIBC_TUNABLES"))) return false;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest allowed value on 64-bit
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    return true;
  }();
  return tuned;
}

int64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long pages = 0, resident = -1;
  if (std::fscanf(f, "%lld %lld", &pages, &resident) != 2) resident = -1;
  std::fclose(f);
  return resident < 0 ? -1 : resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t HeapInUseBytes() {
#ifdef FERRY_SANITIZER_ALLOCATOR
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
#endif
}

int64_t GiveFreeMemoryBack() {
  const int64_t before = ResidentBytes();
  malloc_trim(0);
  const int64_t after = ResidentBytes();
  return before < 0 || after < 0 ? 0 : std::max<int64_t>(before - after, 0);
}

std::string LastEndpoint(zmq::socket_t& socket) {
  try {
    return socket.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t&) {
    return "?";
  }
}

StatusOr<zmq::socket_t> Watch(zmq::context_t& ctx, zmq::socket_t& socket, int events) {
  FERRY_ASSIGN_OR_RETURN(zmq::socket_t monitor, MakeSocket(ctx, zmq::socket_type::pair));
  static std::atomic<uint64_t> next{0};
  const std::string at = "inproc://ferry-monitor-" + std::to_string(next.fetch_add(1));
  try {
    if (zmq_socket_monitor(socket.handle(), at.c_str(), events) != 0) throw zmq::error_t();
    monitor.connect(at);
  } catch (const zmq::error_t& e) {
    return FromZmq(e, "watching a socket");
  }
  return monitor;
}

std::optional<MonitorEvent> ReadMonitorEvent(const Frames& frames) {
  MonitorEvent e;
  if (frames.empty() || frames[0].size() < sizeof e.event + sizeof e.value) return std::nullopt;
  std::memcpy(&e.event, frames[0].data(), sizeof e.event);
  std::memcpy(&e.value, frames[0].data<char>() + sizeof e.event, sizeof e.value);
  return e;
}

}  // namespace ferry::transport

#include <sys/eventfd.h>
#include <unistd.h>

namespace ferry::transport {

Waker::Waker() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
Waker::~Waker() {
  if (fd_ >= 0) close(fd_);
}
void Waker::Notify() {
  const uint64_t one = 1;
  [[maybe_unused]] auto n = write(fd_, &one, sizeof one);  // EAGAIN only if already signalled
}
void Waker::Drain() {
  uint64_t value;
  [[maybe_unused]] auto n = read(fd_, &value, sizeof value);
}

}  // namespace ferry::transport
