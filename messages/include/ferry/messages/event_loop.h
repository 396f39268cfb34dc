// ferry/messages/event_loop.h — the one poll loop of a Ferry I/O thread, shared by the server
// and the client: it waits on ZeroMQ sockets and a Waker with a deadline, and hands each event to
// its owner. What a message means, and which requests are in flight or held, stay with the owner;
// when to wake for them (the next deadline), how many messages a socket may deliver before the
// deadlines are looked at again, and what a failed poll means are decided here, once.
//
// Thread-safety: Run and everything it calls happen on the calling thread (the I/O thread, which
// owns the sockets). Only the Waker is touched from other threads (Notify), and the stop flag.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>

#include <zmq.hpp>

#include "ferry/messages/transport.h"
#include "ferry/status.h"

namespace ferry::transport {

class EventLoop {
 public:
  using Clock = std::chrono::steady_clock;

  // A socket delivers at most this many messages in a row before the loop looks at its
  // deadlines again (and at the other sockets), so a flood cannot starve expiry.
  static constexpr int kBatch = 256;

  struct Handlers {
    // The waker fired (another thread queued work): after the waker is drained.
    std::function<void()> on_wake;
    // One whole message from sockets[socket]; `truncated`: frames past max_frames were dropped.
    // Required; the other handlers may be left empty.
    std::function<void(size_t socket, Frames& frames, bool truncated)> on_message;
    // The earliest time something must happen without a message (a request's deadline), if any.
    std::function<std::optional<Clock::time_point>()> next_deadline;
    // After every wake-up (a message, the waker or the deadline): expire what is due.
    std::function<void()> on_tick;
  };

  // Polls `sockets` and `waker` until `stopping` is true. Returns Ok then; an error when the poll
  // itself fails (not EINTR, which is retried). At most `max_frames` frames of a message are kept.
  static Status Run(std::span<zmq::socket_t> sockets, Waker& waker, const std::atomic<bool>& stopping,
                    size_t max_frames, const Handlers& handlers);
};

}  // namespace ferry::transport
