// A live ferry-ps process under attack over real sockets on 127.0.0.1, while a real worker trains
// against it the whole time: random bytes, random multipart messages, mutated copies of valid
// messages of every kind (tests/fuzz seeds), and messages over the size and frame limits.
// Bounded: a fixed seed, a fixed number of messages, every wait with a deadline.
//
// What must hold: the server stays up and keeps serving; every message whose header cannot be
// read gets exactly one Error reply (id 0); every reply verifies and its error text is valid
// UTF-8 (wire::Printable leaves it unchanged); the worker's tables hold exactly what its own
// pushes made of them; and the server's memory comes back to within a bound of where it was.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/client.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "fuzz_input.h"
#include "fuzz_tables.h"
#include "support/ps_process.h"
#include "support/raw_zmtp.h"

#if defined(__SANITIZE_ADDRESS__)
#define FERRY_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_ASAN 1
#endif
#endif

namespace ferry::test {
namespace {

using namespace std::chrono_literals;
using transport::Frames;

constexpr int64_t kMaxMessageMb = 4;

// Worker 0: an async dense table and an async sparse one, plain SGD, pushed and pulled in a loop
// until told to stop; after every pull the values must be exactly what its own pushes made.
class Trainer {
 public:
  explicit Trainer(const std::string& endpoint) : endpoint_(endpoint) {}

  Status Setup() {
    ClientOptions o;
    o.servers = {endpoint_};
    o.rank = 0;
    o.num_workers = fuzz::kWorkers;
    o.request_timeout = 20s;
    FERRY_ASSIGN_OR_RETURN(client_, Client::Connect(o));
    TableSpec dense;
    dense.name = "model_w";
    dense.shape = {1 << 16};
    dense.consistency = Consistency::kAsync;
    dense.optimizer.learning_rate = 0.5f;
    FERRY_RETURN_IF_ERROR(client_->Declare(dense));
    TableSpec emb;
    emb.name = "model_emb";
    emb.type = TableType::kSparse;
    emb.dim = 8;
    emb.consistency = Consistency::kAsync;
    emb.optimizer.learning_rate = 0.5f;
    FERRY_RETURN_IF_ERROR(client_->Declare(emb));
    // The attack's mutated seeds address these (fuzz_tables.h); the worker never touches them.
    for (const auto& spec : fuzz::FuzzTables()) FERRY_RETURN_IF_ERROR(client_->Declare(spec));
    return Status::Ok();
  }

  void Run() {
    std::vector<float> w(1 << 16), g(1 << 16, 0.001f), rows(4 * 8), row_grads(4 * 8, 0.01f);
    const std::vector<int64_t> ids = {3, 99, int64_t{1} << 33, 12345};
    float want_w = 0, want_row = 0;  // the same float arithmetic the server does (p -= lr * g)
    while (!stop_.load()) {
      Status s = client_->PullDense("model_w", w, 0).wait();
      if (s.ok()) s = client_->PullSparse("model_emb", ids, rows, 0).wait();
      if (!s.ok()) return Fail(s);
      for (float v : w) {
        if (v != want_w)
          return Fail(InternalError("model_w holds " + std::to_string(v) + ", want " + std::to_string(want_w)));
      }
      for (float v : rows) {
        if (v != want_row)
          return Fail(InternalError("model_emb holds " + std::to_string(v) + ", want " + std::to_string(want_row)));
      }
      s = client_->PushDense("model_w", g, 0).wait();
      if (s.ok()) s = client_->PushSparse("model_emb", ids, row_grads, 0).wait();
      if (!s.ok()) return Fail(s);
      want_w -= 0.5f * 0.001f;
      want_row -= 0.5f * 0.01f;
      steps_.fetch_add(1);
    }
  }

  void Stop() { stop_.store(true); }
  int64_t steps() const { return steps_.load(); }
  const Status& status() const { return status_; }

 private:
  void Fail(const Status& s) { status_ = s; }

  std::string endpoint_;
  std::unique_ptr<Client> client_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> steps_{0};
  Status status_;  // written by Run's thread, read after it joined
};

class NetworkAttack : public testing::Test {
 protected:
  explicit NetworkAttack(int64_t max_message_mb = kMaxMessageMb)
      : ps_(0, 1, {"--num-workers", std::to_string(fuzz::kWorkers), "--max-message-mb", std::to_string(max_message_mb),
                   "--max-wait-s", "2", "--worker-timeout-s", "0"}) {}

  std::unique_ptr<zmq::socket_t> Attacker() {
    auto s = transport::MakeSocket(transport::Zmq(*context_), zmq::socket_type::dealer, 100000);
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return nullptr;
    auto sock = std::make_unique<zmq::socket_t>(std::move(*s));
    sock->set(zmq::sockopt::rcvtimeo, 10000);
    sock->connect(ps_.endpoint());
    return sock;
  }

  // Checks one reply: it verifies, and an Error's text is valid UTF-8. Returns its request id.
  static uint64_t CheckReply(Frames& reply) {
    const wire::Header* h = nullptr;
    EXPECT_FALSE(reply.empty());
    if (reply.empty()) return 0;
    const Status s = wire::VerifyHeader(reply[0], &h);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return 0;
    if (h->kind() == wire::Kind::Error && h->error_message() != nullptr) {
      const std::string text = h->error_message()->str();
      EXPECT_EQ(wire::Printable(text), text) << "not printable UTF-8";
    }
    return h->request_id();
  }

  // A Stats request on `sock`, answered within 10 s (replies to earlier requests are checked and
  // passed over); the server's counters are left in *counters when given.
  void ExpectServing(zmq::socket_t& sock, std::map<std::string, int64_t>* counters = nullptr) {
    static uint64_t next = uint64_t{1} << 60;
    const uint64_t id = next++;
    flatbuffers::FlatBufferBuilder fbb(64);
    wire::HeaderBuilder b(fbb);
    b.add_major(wire::kMajor);
    b.add_minor(wire::kMinor);
    b.add_kind(wire::Kind::Stats);
    b.add_request_id(id);
    b.add_rank(1);
    wire::FinishHeaderBuffer(fbb, b.Finish());
    Frames out;
    out.push_back(wire::ToFrame(fbb));
    ASSERT_TRUE(transport::Send(sock, out).ok());
    for (int i = 0; i < 100000; ++i) {
      Frames reply;
      const Status s = transport::Recv(sock, &reply);
      ASSERT_TRUE(s.ok()) << "the server stopped answering: " << s;
      if (CheckReply(reply) != id) continue;
      const wire::Header* h = nullptr;
      if (counters != nullptr && wire::VerifyHeader(reply[0], &h).ok() && h->counters() != nullptr) {
        for (const auto* c : *h->counters()) (*counters)[c->name()->str()] = c->value();
      }
      return;
    }
    FAIL() << "no Stats reply among 100000 messages";
  }

  PsProcess ps_;
  std::shared_ptr<Context> context_ = Context::Create(1);
  std::mt19937_64 rng_{15};
};

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

TEST_F(NetworkAttack, TheServerKeepsServingARealWorkerAndItsMemoryReturns) {
  ASSERT_FALSE(ps_.endpoint().empty()) << "ferry-ps did not start";
  Trainer trainer(ps_.endpoint());
  ASSERT_TRUE(trainer.Setup().ok());
  std::thread worker([&] { trainer.Run(); });
  while (trainer.steps() < 20 && trainer.status().ok()) std::this_thread::sleep_for(10ms);
  const int64_t rss_before = ps_.RssKiB();
  auto attacker = Attacker();
  ASSERT_TRUE(attacker);

  // 1. Random bytes, one frame each, and random multipart messages (2-40 frames of up to 32 KiB):
  //    no header can be read, so each gets exactly one Error reply with request id 0.
  constexpr int kRandom = 1500, kMultipart = 300, kBatch = 100;
  for (int sent = 0; sent < kRandom + kMultipart; sent += kBatch) {
    for (int i = sent; i < sent + kBatch; ++i) {
      Frames out;
      if (i < kRandom) {
        const std::string bytes = RandomBytes(rng_, 1 + rng_() % 300);
        out.emplace_back(bytes.data(), bytes.size());
      } else {
        const size_t frames = 2 + rng_() % 39;
        for (size_t f = 0; f < frames; ++f) {
          const std::string bytes = RandomBytes(rng_, f == 0 ? 1 + rng_() % 200 : rng_() % 32768);
          out.emplace_back(bytes.data(), bytes.size());
        }
      }
      ASSERT_TRUE(transport::Send(*attacker, out).ok());
    }
    for (int i = 0; i < kBatch; ++i) {
      Frames reply;
      ASSERT_TRUE(transport::Recv(*attacker, &reply).ok()) << "message " << sent + i << " got no reply";
      EXPECT_EQ(CheckReply(reply), 0u);
    }
  }
  ExpectServing(*attacker);

  // 2. Mutated copies of valid messages of every kind: flipped bytes, a cut header, frames
  //    dropped or repeated, other ranks. Some are valid enough to be answered normally, some are
  //    held (and expire after --max-wait-s), a Heartbeat is never answered; every reply that
  //    comes must verify and be printable.
  const auto seeds = fuzz::SeedMessages();
  constexpr int kMutated = 3000;
  for (int i = 0; i < kMutated; ++i) {
    std::vector<std::string> frames = seeds[rng_() % seeds.size()].second;
    std::string& header = frames[0];
    switch (rng_() % 5) {
      case 0:
      case 1:
        for (int k = 1 + static_cast<int>(rng_() % 8); k > 0; --k)
          header[rng_() % header.size()] ^= static_cast<char>(1 + rng_() % 255);
        break;
      case 2: header.resize(rng_() % header.size()); break;
      case 3:
        if (frames.size() > 1) {
          frames.erase(frames.begin() + 1 + static_cast<std::ptrdiff_t>(rng_() % (frames.size() - 1)));
        } else {
          frames.push_back(RandomBytes(rng_, rng_() % 64));
        }
        break;
      case 4: frames.push_back(frames.back()); break;
    }
    Frames out;
    for (const auto& f : frames) out.emplace_back(f.data(), f.size());
    ASSERT_TRUE(transport::Send(*attacker, out).ok());
    // Read what has come so far, without waiting.
    for (;;) {
      Frames reply;
      bool got = false, truncated = false;
      ASSERT_TRUE(transport::RecvNonBlocking(*attacker, &reply, &got, 16, &truncated).ok());
      if (!got) break;
      CheckReply(reply);
    }
  }
  ExpectServing(*attacker);

  // 3. Over the limits: a message above --max-message-mb in all (an error reply), one of 5000
  //    frames (an error reply: more than 4097), and a frame above twice the limit (ZeroMQ drops
  //    that connection: no reply, and nothing of it kept).
  {
    Frames out;
    out.emplace_back(std::string(64, 'h').data(), 64);
    for (int i = 0; i < 5; ++i) out.emplace_back(size_t{1} << 20);
    ASSERT_TRUE(transport::Send(*attacker, out).ok());
    Frames reply;
    ASSERT_TRUE(transport::Recv(*attacker, &reply).ok());
    CheckReply(reply);
  }
  {
    Frames out;
    for (int i = 0; i < 5000; ++i) out.emplace_back(8);
    ASSERT_TRUE(transport::Send(*attacker, out).ok());
    Frames reply;
    ASSERT_TRUE(transport::Recv(*attacker, &reply).ok());
    CheckReply(reply);
  }
  {
    auto doomed = Attacker();
    ASSERT_TRUE(doomed);
    Frames out;
    out.emplace_back(size_t{(2 * kMaxMessageMb + 1) << 20});
    ASSERT_TRUE(transport::Send(*doomed, out).ok());
    doomed->set(zmq::sockopt::rcvtimeo, 1000);
    Frames reply;
    EXPECT_EQ(transport::Recv(*doomed, &reply).code(), StatusCode::kDeadlineExceeded)
        << "a frame over the hard limit was answered";
  }
  ExpectServing(*attacker);

  // The worker trained throughout, and goes on: it takes another step (bounded: 30 s).
  const int64_t steps_during = trainer.steps();
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (trainer.steps() <= steps_during && trainer.status().ok() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  trainer.Stop();
  worker.join();
  EXPECT_TRUE(trainer.status().ok()) << trainer.status();
  EXPECT_GT(trainer.steps(), steps_during);
  std::printf("worker steps: %lld (%lld before the last check)\n", static_cast<long long>(trainer.steps()),
              static_cast<long long>(steps_during));

  // Memory: held requests expired (--max-wait-s 2), refused messages freed.
  std::this_thread::sleep_for(2500ms);
  std::map<std::string, int64_t> counters;
  ExpectServing(*attacker, &counters);
  // The attacker never had more requests in flight than a server queues replies for (8192):
  // however slowly either side ran, none of its replies may have been dropped.
  EXPECT_EQ(counters["replies_dropped"], 0);
  EXPECT_GT(counters["bad_messages"], kRandom + kMultipart - 1);
  const int64_t rss_after = ps_.RssKiB(), peak = ps_.RssKiB("VmHWM:");
  std::printf("ferry-ps memory: %lld KiB before the attack, %lld KiB after, peak %lld KiB\n",
              static_cast<long long>(rss_before), static_cast<long long>(rss_after), static_cast<long long>(peak));
  ASSERT_GT(rss_before, 0);
#ifdef FERRY_ASAN
  // AddressSanitizer keeps freed memory in quarantine (256 MiB by default) and adds shadow
  // memory: this build's ferry-ps cannot show whether memory comes back.
  std::printf("memory bound not checked: AddressSanitizer build\n");
  return;
#endif
  // Within 64 MiB of where it started: a few of the largest messages' worth (4-9 MiB each), which
  // the allocator keeps for reuse (TuneAllocatorForLargeMessages), not what the attack sent in all
  // (over 100 MiB).
  EXPECT_LT(rss_after - rss_before, 64 * 1024) << "KiB";
}

// A message that never ends, from a peer speaking ZMTP itself (no ZeroMQ socket sends one): the
// server closes its connection once ZeroMQ holds more of it than a message may be (9 MiB here,
// twice --max-message-mb 4 and 1 MiB), and gives the memory back. Before, ferry-ps kept the
// connection, and all that came of it, until its idle timeout (120 s): the peer sends up to 256 MiB.
TEST_F(NetworkAttack, AMessageThatNeverEndsIsCutOffAndItsMemoryComesBack) {
  ASSERT_FALSE(ps_.endpoint().empty()) << "ferry-ps did not start";
  auto attacker = Attacker();
  ASSERT_TRUE(attacker);
  ExpectServing(*attacker);
  const int64_t rss_before = ps_.RssKiB();
  ASSERT_GT(rss_before, 0);
  const int fd = RawZmtp(ps_.endpoint());
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const size_t sent = SendUnfinished(fd, size_t{256} << 20);
  EXPECT_TRUE(EndedWithin(fd, 20s)) << "ferry-ps kept the connection after " << sent
                                     << " bytes of a message that does not end";
  ::close(fd);
  std::map<std::string, int64_t> counters;
  ExpectServing(*attacker, &counters);
  EXPECT_EQ(counters["connections_unfinished_closed"], 1);
  const int64_t peak = ps_.RssKiB("VmHWM:");
  std::printf("sent %zu bytes before the close; ferry-ps memory: %lld KiB before, peak %lld KiB\n", sent,
              static_cast<long long>(rss_before), static_cast<long long>(peak));
#ifndef FERRY_ASAN  // (its quarantine keeps freed memory: no bound to check)
  // Back within 64 MiB of the start within 20 s (the server trims a second after the close).
  int64_t rss_after = ps_.RssKiB();
  for (const auto until = std::chrono::steady_clock::now() + 20s;
       rss_after - rss_before >= 64 * 1024 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(100ms);
    rss_after = ps_.RssKiB();
  }
  EXPECT_LT(rss_after - rss_before, 64 * 1024) << "KiB kept after the close";
#endif
}

// Messages of hundreds of MB that the server refuses: ZeroMQ hands a message over only once all
// its frames are in (a multipart message is delivered whole), so the server holds each one until
// it can refuse it. A message larger than a message may be is cut off on its way (the connection
// closed: Connections.AMessageThatNeverEndsIsCutOffAtTheMessageLimit); these are within that
// bound (--max-message-mb 512: 1,025 MiB) and refused when they are in, for their frame count or
// their size. What the server must do then is give the memory back. Before, two messages of
// 100,000 frames of 8 KiB left ferry-ps about 630 MB larger: glibc keeps freed small chunks
// (ZeroMQ allocates a frame each) for reuse unless told to trim.
class LargeMessages : public NetworkAttack {
 protected:
  LargeMessages() : NetworkAttack(512) {}
};

TEST_F(LargeMessages, RefusedMessagesOfHundredsOfMegabytesLeaveNoMemoryBehind) {
#ifdef FERRY_ASAN
  GTEST_SKIP() << "AddressSanitizer keeps freed memory in quarantine: no bound on memory to check";
#endif
  ASSERT_FALSE(ps_.endpoint().empty()) << "ferry-ps did not start";
  auto attacker = Attacker();
  ASSERT_TRUE(attacker);
  ExpectServing(*attacker);
  // 2.3 GB go over loopback before the last refusal: on a loaded 2-core machine the first took
  // more than the attacker's usual 10 s (2 of 2 full parallel suites). Bounded all the same.
  attacker->set(zmq::sockopt::rcvtimeo, 90000);
  const int64_t rss_before = ps_.RssKiB();
  ASSERT_GT(rss_before, 0);
  // Two of 100,000 frames of 8 KiB (781 MiB, past the frame count: refused), and one of 3,000
  // frames of 256 KiB (each frame under the limit, the whole 750 MiB over it: refused for size).
  const std::vector<std::pair<int, size_t>> attacks = {{100000, 8 << 10}, {100000, 8 << 10}, {3000, 256 << 10}};
  for (const auto& [frames, size] : attacks) {
    Frames out;
    out.emplace_back(std::string(64, 'h').data(), 64);
    for (int i = 0; i < frames; ++i) out.emplace_back(size);
    ASSERT_TRUE(transport::Send(*attacker, out).ok());
  }
  for (size_t i = 0; i < attacks.size(); ++i) {
    Frames reply;
    ASSERT_TRUE(transport::Recv(*attacker, &reply).ok()) << "no refusal for message " << i;
    CheckReply(reply);
  }
  ExpectServing(*attacker);
  const int64_t peak = ps_.RssKiB("VmHWM:");
  // The memory comes back within seconds (the server trims a second after a refusal, at most
  // once in 5 s; bounded wait: 20 s). What may stay: the top of the heap of ZeroMQ's thread's
  // arena, which glibc trims only past the trim threshold (128 MiB, more than such a heap holds):
  // up to 64 MiB.
  constexpr int64_t kBoundKiB = 80 * 1024;
  int64_t rss_after = ps_.RssKiB();
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (rss_after - rss_before >= kBoundKiB && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(100ms);
    rss_after = ps_.RssKiB();
  }
  std::printf("ferry-ps memory: %lld KiB before, peak %lld KiB, %lld KiB after\n", static_cast<long long>(rss_before),
              static_cast<long long>(peak), static_cast<long long>(rss_after));
  EXPECT_GT(peak - rss_before, 512 * 1024) << "KiB: the messages were not held (the test measures nothing)";
  EXPECT_LT(rss_after - rss_before, kBoundKiB) << "KiB kept after the refusals";
}

}  // namespace
}  // namespace ferry::test
