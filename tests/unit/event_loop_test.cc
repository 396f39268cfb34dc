// transport::EventLoop: the poll loop the server and the client share.
#include "ferry/messages/event_loop.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <memory>
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

// What every test needs: a context, the loop's sockets (the `in` ends of `pipes`), a waker and
// the stop flag. Senders write to pipes[i].out.
struct Loop {
  explicit Loop(std::initializer_list<const char*> names) : ctx(Context::Create()) {
    for (const char* name : names) {
      pipes.push_back(MakePipe(Zmq(*ctx), name));
      sockets.push_back(std::move(pipes.back().in));
    }
  }
  Status Run(size_t max_frames, const EventLoop::Handlers& h) {
    return EventLoop::Run(sockets, waker, stopping, max_frames, h);
  }
  std::shared_ptr<Context> ctx;
  std::vector<Pipe> pipes;
  std::vector<zmq::socket_t> sockets;
  Waker waker;
  std::atomic<bool> stopping{false};
};

TEST(EventLoop, DeliversEachSocketsMessagesWithItsIndexThenStops) {
  Loop loop({"loop-a", "loop-b"});
  SendText(loop.pipes[0].out, "to a");
  SendText(loop.pipes[1].out, "to b 1");
  SendText(loop.pipes[1].out, "to b 2");
  std::atomic<bool>& stopping = loop.stopping;
  std::vector<std::pair<size_t, std::string>> got;
  EventLoop::Handlers h;
  h.on_message = [&](size_t s, Frames& frames, bool truncated) {
    EXPECT_FALSE(truncated);
    got.emplace_back(s, frames.at(0).to_string());
    if (got.size() == 3) stopping = true;
  };
  ASSERT_TRUE(loop.Run(8, h).ok());
  EXPECT_EQ(got, (std::vector<std::pair<size_t, std::string>>{{0, "to a"}, {1, "to b 1"}, {1, "to b 2"}}));
}

TEST(EventLoop, TheWakerRunsOnWakeOnTheLoopsThread) {
  Loop loop({"loop-wake"});
  std::atomic<bool>& stopping = loop.stopping;
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
  std::thread other([&] { loop.waker.Notify(); });
  ASSERT_TRUE(loop.Run(8, h).ok());
  other.join();
  EXPECT_EQ(woken_on, std::this_thread::get_id());
}

TEST(EventLoop, ADeadlineWakesItWithoutAnyMessage) {
  Loop loop({"loop-deadline"});
  std::atomic<bool>& stopping = loop.stopping;
  const auto deadline = EventLoop::Clock::now() + std::chrono::milliseconds(20);
  int ticks = 0;
  EventLoop::Handlers h;
  h.on_message = [](size_t, Frames&, bool) { ADD_FAILURE() << "no message was sent"; };
  h.next_deadline = [&]() -> std::optional<EventLoop::Clock::time_point> { return deadline; };
  h.on_tick = [&] {
    ++ticks;
    if (EventLoop::Clock::now() >= deadline) stopping = true;
  };
  ASSERT_TRUE(loop.Run(8, h).ok());
  EXPECT_GE(ticks, 1);
  EXPECT_GE(EventLoop::Clock::now(), deadline);
}

TEST(EventLoop, AFloodOfMessagesStillLetsTheDeadlinesBeLookedAt) {
  Loop loop({"loop-flood"});
  zmq::socket_t& out = loop.pipes[0].out;
  constexpr int kMessages = 2 * EventLoop::kBatch + 10;
  for (int i = 0; i < kMessages; ++i) SendText(out, std::to_string(i));
  std::atomic<bool>& stopping = loop.stopping;
  int received = 0, ticks_before_last = 0;
  EventLoop::Handlers h;
  h.on_message = [&](size_t, Frames&, bool) {
    if (++received == kMessages) stopping = true;
  };
  h.on_tick = [&] {
    if (received < kMessages) ++ticks_before_last;
  };
  ASSERT_TRUE(loop.Run(8, h).ok());
  EXPECT_EQ(received, kMessages);
  EXPECT_GE(ticks_before_last, 2);  // after the first and the second batch of kBatch
}

TEST(EventLoop, FramesPastTheLimitAreDroppedAndSaidSo) {
  Loop loop({"loop-frames"});
  zmq::socket_t& out = loop.pipes[0].out;
  Frames many;
  for (int i = 0; i < 5; ++i) many.emplace_back("x", 1);
  ASSERT_TRUE(Send(out, many).ok());
  std::atomic<bool>& stopping = loop.stopping;
  size_t kept = 0;
  bool was_truncated = false;
  EventLoop::Handlers h;
  h.on_message = [&](size_t, Frames& frames, bool truncated) {
    kept = frames.size();
    was_truncated = truncated;
    stopping = true;
  };
  ASSERT_TRUE(loop.Run(3, h).ok());
  EXPECT_EQ(kept, 3u);
  EXPECT_TRUE(was_truncated);
}

// A blocking Recv that a signal interrupts (EINTR: a fuzzer's or profiler's timer) receives on
// instead of failing (found by tests/fuzz/fuzz_server under libFuzzer's -timeout alarm).
TEST(Transport, RecvGoesOnAfterASignalInterruptsIt) {
  struct sigaction quiet {}, old {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = 0;  // no SA_RESTART: the blocking receive returns EINTR
  ASSERT_EQ(sigaction(SIGUSR2, &quiet, &old), 0);
  auto ctx = Context::Create();
  Pipe p = MakePipe(Zmq(*ctx), "recv-eintr");
  p.in.set(zmq::sockopt::rcvtimeo, 5000);
  const pthread_t receiver = pthread_self();
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pthread_kill(receiver, SIGUSR2);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    SendText(p.out, "after the signal");
  });
  Frames got;
  const Status s = Recv(p.in, &got);
  other.join();
  sigaction(SIGUSR2, &old, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].to_string(), "after the signal");
}

}  // namespace
}  // namespace ferry::transport
