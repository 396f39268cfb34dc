// transport::EventLoop: the poll loop the server and the client share.
#include "ferry/messages/event_loop.h"

#include <atomic>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/context.h"

namespace ferry::transport {
namespace {

// A connected PAIR of inproc sockets: `in` is polled by the loop, `out` sends to it.
struct Pipe {
  zmq::socket_t in, out;
};

Pipe MakePipe(zmq::context_t& ctx, const std::string& name) {
  Pipe p{zmq::socket_t(ctx, zmq::socket_type::pair), zmq::socket_t(ctx, zmq::socket_type::pair)};
  p.in.bind("inproc://" + name);
  p.out.connect("inproc://" + name);
  return p;
}

void SendText(zmq::socket_t& s, const std::string& text) {
  Frames frames;
  frames.emplace_back(text.data(), text.size());
  ASSERT_TRUE(Send(s, frames).ok());
}

TEST(EventLoop, DeliversEachSocketsMessagesWithItsIndexThenStops) {
  auto ctx = Context::Create();
  Pipe a = MakePipe(Zmq(*ctx), "loop-a"), b = MakePipe(Zmq(*ctx), "loop-b");
  SendText(a.out, "to a");
  SendText(b.out, "to b 1");
  SendText(b.out, "to b 2");
  std::vector<zmq::socket_t> sockets;
  sockets.push_back(std::move(a.in));
  sockets.push_back(std::move(b.in));
  Waker waker;
  std::atomic<bool> stopping{false};
  std::vector<std::pair<size_t, std::string>> got;
  EventLoop::Handlers h;
  h.on_message = [&](size_t s, Frames& frames, bool truncated) {
    EXPECT_FALSE(truncated);
    got.emplace_back(s, frames.at(0).to_string());
    if (got.size() == 3) stopping = true;
  };
  ASSERT_TRUE(EventLoop::Run(sockets, waker, stopping, 8, h).ok());
  EXPECT_EQ(got, (std::vector<std::pair<size_t, std::string>>{{0, "to a"}, {1, "to b 1"}, {1, "to b 2"}}));
}

TEST(EventLoop, TheWakerRunsOnWakeOnTheLoopsThread) {
  auto ctx = Context::Create();
  Pipe a = MakePipe(Zmq(*ctx), "loop-wake");
  std::vector<zmq::socket_t> sockets;
  sockets.push_back(std::move(a.in));
  Waker waker;
  std::atomic<bool> stopping{false};
  std::thread::id woken_on;
  EventLoop::Handlers h;
  h.on_message = [](size_t, Frames&, bool) { ADD_FAILURE() << "no message was sent"; };
  h.on_wake = [&] {
    woken_on = std::this_thread::get_id();
    stopping = true;
  };
  // Only the waker can end the wait; a deadline 10 s away bounds the test if it never fires.
  const auto give_up = EventLoop::Clock::now() + std::chrono::seconds(10);
  h.next_deadline = [&]() -> std::optional<EventLoop::Clock::time_point> { return give_up; };
  h.on_tick = [&] {
    if (EventLoop::Clock::now() >= give_up && !stopping) {
      ADD_FAILURE() << "the waker did not wake the loop";
      stopping = true;
    }
  };
  std::thread other([&] { waker.Notify(); });
  ASSERT_TRUE(EventLoop::Run(sockets, waker, stopping, 8, h).ok());
  other.join();
  EXPECT_EQ(woken_on, std::this_thread::get_id());
}

TEST(EventLoop, ADeadlineWakesItWithoutAnyMessage) {
  auto ctx = Context::Create();
  Pipe a = MakePipe(Zmq(*ctx), "loop-deadline");
  std::vector<zmq::socket_t> sockets;
  sockets.push_back(std::move(a.in));
  Waker waker;
  std::atomic<bool> stopping{false};
  const auto deadline = EventLoop::Clock::now() + std::chrono::milliseconds(20);
  int ticks = 0;
  EventLoop::Handlers h;
  h.on_message = [](size_t, Frames&, bool) { ADD_FAILURE() << "no message was sent"; };
  h.next_deadline = [&]() -> std::optional<EventLoop::Clock::time_point> { return deadline; };
  h.on_tick = [&] {
    ++ticks;
    if (EventLoop::Clock::now() >= deadline) stopping = true;
  };
  ASSERT_TRUE(EventLoop::Run(sockets, waker, stopping, 8, h).ok());
  EXPECT_GE(ticks, 1);
  EXPECT_GE(EventLoop::Clock::now(), deadline);
}

TEST(EventLoop, AFloodOfMessagesStillLetsTheDeadlinesBeLookedAt) {
  auto ctx = Context::Create();
  Pipe a = MakePipe(Zmq(*ctx), "loop-flood");
  constexpr int kMessages = 2 * EventLoop::kBatch + 10;
  for (int i = 0; i < kMessages; ++i) SendText(a.out, std::to_string(i));
  std::vector<zmq::socket_t> sockets;
  sockets.push_back(std::move(a.in));
  Waker waker;
  std::atomic<bool> stopping{false};
  int received = 0, ticks_before_last = 0;
  EventLoop::Handlers h;
  h.on_message = [&](size_t, Frames&, bool) {
    if (++received == kMessages) stopping = true;
  };
  h.on_tick = [&] {
    if (received < kMessages) ++ticks_before_last;
  };
  ASSERT_TRUE(EventLoop::Run(sockets, waker, stopping, 8, h).ok());
  EXPECT_EQ(received, kMessages);
  EXPECT_GE(ticks_before_last, 2);  // after the first and the second batch of kBatch
}

TEST(EventLoop, FramesPastTheLimitAreDroppedAndSaidSo) {
  auto ctx = Context::Create();
  Pipe a = MakePipe(Zmq(*ctx), "loop-frames");
  Frames many;
  for (int i = 0; i < 5; ++i) many.emplace_back("x", 1);
  ASSERT_TRUE(Send(a.out, many).ok());
  std::vector<zmq::socket_t> sockets;
  sockets.push_back(std::move(a.in));
  Waker waker;
  std::atomic<bool> stopping{false};
  size_t kept = 0;
  bool was_truncated = false;
  EventLoop::Handlers h;
  h.on_message = [&](size_t, Frames& frames, bool truncated) {
    kept = frames.size();
    was_truncated = truncated;
    stopping = true;
  };
  ASSERT_TRUE(EventLoop::Run(sockets, waker, stopping, 3, h).ok());
  EXPECT_EQ(kept, 3u);
  EXPECT_TRUE(was_truncated);
}

}  // namespace
}  // namespace ferry::transport
