#include "ferry/messages/event_loop.h"

#include <algorithm>
#include <string>
#include <vector>

namespace ferry::transport {

Status EventLoop::Run(std::span<zmq::socket_t> sockets, Waker& waker, const std::atomic<bool>& stopping,
                      size_t max_frames, const Handlers& handlers) {
  std::vector<zmq::pollitem_t> items;
  Frames frames;
  while (!stopping.load()) {
    items.clear();
    items.push_back({nullptr, waker.fd(), ZMQ_POLLIN, 0});
    for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
    std::chrono::milliseconds timeout(-1);  // no deadline: wait for a message or the waker
    if (handlers.next_deadline) {
      if (const std::optional<Clock::time_point> next = handlers.next_deadline()) {
        timeout =
            std::max(std::chrono::milliseconds(0), std::chrono::ceil<std::chrono::milliseconds>(*next - Clock::now()));
      }
    }
    try {
      zmq::poll(items.data(), items.size(), timeout);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      return InternalError(std::string("poll failed: ") + e.what());
    }
    if (items[0].revents & ZMQ_POLLIN) {
      waker.Drain();
      if (handlers.on_wake) handlers.on_wake();
    }
    for (size_t s = 0; s < sockets.size() && !stopping.load(); ++s) {
      if (!(items[s + 1].revents & ZMQ_POLLIN)) continue;
      for (int i = 0; i < kBatch && !stopping.load(); ++i) {
        bool got = false, truncated = false;
        if (!RecvNonBlocking(sockets[s], &frames, &got, max_frames, &truncated).ok() || !got) break;
        handlers.on_message(s, frames, truncated);
      }
    }
    if (handlers.on_tick) handlers.on_tick();
  }
  return Status::Ok();
}

}  // namespace ferry::transport
