// bench/ferry_bench.cc — Ferry's micro-benchmarks (Google Benchmark; results and how to run them
// are in bench/RESULTS.md).
//
// Groups, registered (and so run) in this order, because later groups print ratios to earlier
// ones measured in the same process:
//   raw/<net>/<size>                 ZeroMQ DEALER -> ROUTER echo round trip, one payload frame:
//                                    the transport's ceiling.
//   raw_chunked/<net>/<size>         the same with the payload cut into the frames a Ferry table
//                                    of that size puts on the wire (chunks of at most 4 MiB).
//   raw_frames/tcp/100x1KiB          the same with 100 frames of 1 KiB (the baseline of small/),
//   raw/tcp/100KiB                   and with those 100 KiB in one frame.
//   ps/<op>/<net>/<size>/<topology>  dense push, pull and push+pull through ferry::Client and
//                                    ferry::Server, with `vs_raw` = bytes/s over raw/<net>/<size>
//                                    and `vs_raw_chunked` over raw_chunked/<net>/<size>.
//   small/<mode>/<servers>           100 tensors of 1 KiB in one call vs one call each.
//   sparse/<op>/dim<d>               sparse pull / push of Zipf-distributed ids, rows/s.
//   criteo_step/<op>/<path>/<n>s1w   a Criteo-shaped step (26 tables, batch 4096, Zipf ids) in one
//                                    message per server, in pipelined messages of ~512 KiB, or one
//                                    request per table, unique rows/s.
//   mem/sparse_row/<opt>/<rows>      heap bytes a sparse row of dim 16 costs a server, vs its raw
//                                    bytes (values, optimizer state, id).
//   mem/<kernel>                     single-thread memory bandwidth (STREAM triad, in-place axpy),
//                                    the cost of touching freshly allocated pages, and the
//                                    server's NaN/Inf check of a gradient against a plain read.
//   opt/<optimizer>                  ps::ApplyUpdate on 16M elements, with `vs_stream` (triad)
//                                    and `vs_axpy`.
//   steps/pushpull/{16MiB,1MiB}      what a dense push+pull does beside the transport (the
//                                    server's check, update and reply, the client's copy), each
//                                    step timed apart.
//   codec/<format>/<n>               gradient compression (issue 17): encoding and decoding n
//                                    floats (fp16, bf16, top-k at a ratio with error feedback),
//                                    each timed beside a memcpy of the same float32 bytes in the
//                                    same iteration (`encode_vs_memcpy`, `decode_vs_memcpy`).
//   wire/pushpull/tcp/<size>/<fmt>   dense push+pull through Ferry (1 server, 1 worker, tcp
//                                    loopback) of a table of each wire format: ms per call and
//                                    the bytes that travelled.
//
// Byte accounting, the same for raw and PS so their ratio compares like with like: only payload
// bytes count (headers do not), once per direction they travel. A raw round trip moves 2 x size;
// a PS push or a pull moves 1 x size, a push+pull 2 x size. Rates are bytes per wall-clock second
// (UseRealTime). With two workers, `bytes_per_second` is the cluster's aggregate (both workers'
// bytes over the average of their times) and `vs_raw` compares it with one raw DEALER/ROUTER pair.
//
// Everything runs in this one process; servers and clients have their own ZeroMQ contexts (as
// separate processes would) and talk over tcp://127.0.0.1 or ipc:// loopback. `faults_per_call`
// counts the process's minor page faults per call: first touches of freshly allocated message
// buffers, which are expensive on virtual machines.
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

#include "ferry/client.h"
#include "ferry/curve.h"
#ifdef FERRY_BENCH_SODIUM
#include <sodium.h>
#endif
#include "ferry/server.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/data/zipf.h"
#include "ferry/messages/codec.h"
#include "ferry/messages/transport.h"
#include "internal/finite.h"
#include "internal/optimizer.h"
#include "internal/table_metrics.h"
#include "internal/tables.h"
#include "support/ps_process.h"

namespace ferry::bench {
namespace {

using SteadyClock = std::chrono::steady_clock;
using transport::Frames;

// Bounds on every wait, so that a broken build fails a benchmark instead of hanging the run.
constexpr auto kRequestTimeout = std::chrono::seconds(60);  // ClientOptions::request_timeout
constexpr auto kWaitTimeout = std::chrono::seconds(90);     // Handle::wait, rendezvous, raw recv

// ---- configuration -----------------------------------------------------------------------------

// tcp_curve: tcp with ZeroMQ CURVE on every connection (authenticated and encrypted, as a job
// run with --curve-keys), to measure what security costs against plain tcp.
enum class Net { kTcp, kIpc, kTcpCurve };

std::string NetName(Net net) {
  switch (net) {
    case Net::kTcp: return "tcp";
    case Net::kIpc: return "ipc";
    case Net::kTcpCurve: return "tcp_curve";
  }
  return "?";
}

// The CURVE keys of every tcp_curve run: the servers' keypair and two workers' (made once).
struct BenchKeys {
  CurveServerKeys server;
  std::vector<CurveClientKeys> workers;
};
const BenchKeys& Keys() {
  static const BenchKeys keys = [] {
    BenchKeys k;
    auto pair = [] {
      auto p = curve::NewKeypair();
      if (!p.ok()) {
        std::fprintf(stderr, "ferry-bench: %s\n", p.status().ToString().c_str());
        std::exit(1);
      }
      return *p;
    };
    k.server.server = pair();
    for (int r = 0; r < 2; ++r) {
      k.workers.push_back({k.server.server.public_key, pair()});
      k.server.workers.push_back(k.workers.back().client.public_key);
    }
    return k;
  }();
  return keys;
}

// Sets a raw socket's CURVE keys: the echo server's (server) or worker 0's (client).
void SetCurve(zmq::socket_t& socket, bool server) {
  const BenchKeys& k = Keys();
  if (server) {
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, k.server.server.secret_key);
  } else {
    socket.set(zmq::sockopt::curve_serverkey, k.server.server.public_key);
    socket.set(zmq::sockopt::curve_publickey, k.workers[0].client.public_key);
    socket.set(zmq::sockopt::curve_secretkey, k.workers[0].client.secret_key);
  }
}

// A payload size and how many timed calls a run of it makes (a few tenths of a second each on a
// 2-core machine, so the whole default run stays within a few minutes).
struct Size {
  int64_t bytes;
  const char* name;
  int iterations;
};
constexpr Size kSizes[] = {
    {int64_t{4} << 10, "4KiB", 2000},
    {int64_t{1} << 20, "1MiB", 200},
    {int64_t{16} << 20, "16MiB", 20},
    {int64_t{64} << 20, "64MiB", 6},
};

// The sizes CURVE's cost is measured at (issue 15): 1 MiB and 16 MiB.
constexpr Size kCurveSizes[] = {kSizes[1], kSizes[2]};
// The sizes measured against ferry-ps processes (issue 17): 4 KiB, 1 MiB and 16 MiB.
constexpr Size kProcessSizes[] = {kSizes[0], kSizes[1], kSizes[2]};

// Elements per chunk of a Ferry dense table of `elems` floats in these benchmarks: at least two
// chunks, at most 1M floats (4 MiB) each, so that with two servers every size spreads over both.
// At most the library's default chunk (TableSpec::chunk_elems), as a user's table has, or
// FERRY_BENCH_CHUNK_ELEMS (experiments with other chunk sizes).
int64_t ChunkElems(int64_t elems) {
  const char* cap = std::getenv("FERRY_BENCH_CHUNK_ELEMS");
  return std::clamp<int64_t>(elems / 2, 1, cap != nullptr ? std::atoll(cap) : TableSpec().chunk_elems);
}

// Untimed calls before a timed loop: connections up, buffers faulted in, caches warm.
int WarmupCalls(const Size& size) { return std::max(2, size.iterations / 10); }

benchmark::TimeUnit UnitFor(int64_t bytes) {
  return bytes < (int64_t{1} << 20) ? benchmark::kMicrosecond : benchmark::kMillisecond;
}

// A fresh address to bind: tcp port 0 (the OS picks), or a per-process ipc path whose socket
// file is removed when this is destroyed (ZeroMQ leaves it behind when the socket closes).
class BindAddress {
 public:
  explicit BindAddress(Net net) {
    static std::atomic<int> next{0};
    if (net != Net::kIpc) {
      address_ = "tcp://127.0.0.1:0";
    } else {
      path_ = "/tmp/ferry-bench-" + std::to_string(getpid()) + "-" + std::to_string(next++);
      address_ = "ipc://" + path_;
    }
  }
  ~BindAddress() {
    if (!path_.empty()) ::unlink(path_.c_str());
  }
  BindAddress(BindAddress&& other) noexcept
      : address_(std::move(other.address_)), path_(std::exchange(other.path_, std::string())) {}
  BindAddress& operator=(BindAddress&&) = delete;

  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::string path_;  // empty for tcp
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Minor page faults of the whole process so far (servers and clients run in this process).
int64_t ProcessMinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Wall-clock time of a timed loop, from the start of its first iteration to the end of its last
// (so a thread's wait at Google Benchmark's start and stop barriers is not counted), and the
// process's page faults from the first iteration to Finish().
class LoopTimer {
 public:
  void IterationStart() {
    if (started_) return;
    started_ = true;
    faults_at_start_ = ProcessMinorFaults();
    start_ = SteadyClock::now();
  }
  void IterationEnd() { end_ = SteadyClock::now(); }
  void Finish() { faults_ = started_ ? ProcessMinorFaults() - faults_at_start_ : 0; }

  double seconds() const { return started_ ? std::chrono::duration<double>(end_ - start_).count() : 0.0; }
  double faults() const { return static_cast<double>(faults_); }

 private:
  bool started_ = false;
  SteadyClock::time_point start_, end_;
  int64_t faults_at_start_ = 0, faults_ = 0;
};

// Reports a failure once (Google Benchmark allows one SkipWithError per thread and run).
void Fail(benchmark::State& state, const Status& s) {
  if (!state.error_occurred()) state.SkipWithError(s.ToString().c_str());
}

// ---- raw ZeroMQ round trip ---------------------------------------------------------------------

// What a raw call moves: the payload there and back (the round trip every raw/ case measures), or
// one way with an empty reply (kUp: what a push moves) or an empty request (kDown: a pull's). A
// one-way call's header frame is kOneWayHeaderBytes: the sequence, then the bytes to send back.
enum class RawShape { kEcho, kUp, kDown };
constexpr size_t kOneWayHeaderBytes = 16;

// The far end of the raw round trip: a ROUTER socket on its own thread that sends every message
// straight back to its sender, frames untouched (ZeroMQ moves them, nothing is copied here).
class EchoServer {
 public:
  static StatusOr<std::unique_ptr<EchoServer>> Start(Net net) {
    std::unique_ptr<EchoServer> server(new EchoServer(net));
    if (!server->waker_.ok()) return InternalError("echo server: cannot create an eventfd");
    FERRY_ASSIGN_OR_RETURN(server->socket_, transport::MakeSocket(server->context_, zmq::socket_type::router));
    try {
      if (net == Net::kTcpCurve) SetCurve(server->socket_, /*server=*/true);
      server->socket_.bind(server->bind_.address());
    } catch (const zmq::error_t& e) {
      return UnavailableError(std::string("echo server: bind: ") + e.what());
    }
    server->endpoint_ = transport::LastEndpoint(server->socket_);
    server->thread_ = std::thread([s = server.get()] { s->Loop(); });
    return server;
  }

  ~EchoServer() {
    stopping_.store(true);
    waker_.Notify();
    if (thread_.joinable()) thread_.join();
  }
  EchoServer(const EchoServer&) = delete;
  EchoServer& operator=(const EchoServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }

 private:
  explicit EchoServer(Net net) : bind_(net) {}

  // [routing id][header] and up to 4096 payload frames, like a Ferry server accepts.
  static constexpr size_t kEchoMaxFrames = 4098;

  void Loop() {
    Frames frames;
    while (!stopping_.load()) {
      zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, waker_.fd(), ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        std::fprintf(stderr, "echo server: poll: %s\n", e.what());
        return;
      }
      if (items[1].revents & ZMQ_POLLIN) waker_.Drain();
      for (;;) {
        bool got = false, truncated = false;
        if (!transport::RecvNonBlocking(socket_, &frames, &got, kEchoMaxFrames, &truncated).ok() || !got) break;
        if (truncated) continue;  // not ours; the client then fails on its timeout
        if (frames.size() >= 2 && frames[1].size() == kOneWayHeaderBytes) {
          ReplyOneWay(frames);
          continue;
        }
        transport::Send(socket_, frames).IgnoreError();  // every frame back as it came
      }
    }
  }

  // A one-way call (RawShape::kUp or kDown): the header frame holds the sequence and how many
  // bytes to send back. The payload that came is dropped; the reply is [routing id][header] and,
  // if asked for, one frame of that many bytes lent from a buffer kept for the size (no copy:
  // what a Ferry server's zero-copy pull reply does).
  void ReplyOneWay(Frames& frames) {
    int64_t reply_bytes = 0;
    std::memcpy(&reply_bytes, static_cast<const std::byte*>(frames[1].data()) + 8, sizeof reply_bytes);
    if (reply_bytes < 0 || reply_bytes > kMaxReplyBytes) return;  // not ours
    frames.resize(2);
    if (reply_bytes > 0) {
      auto& buffer = replies_[reply_bytes];
      if (buffer.empty()) buffer.assign(static_cast<size_t>(reply_bytes), std::byte{0xa5});
      frames.emplace_back(buffer.data(), buffer.size(), nullptr, nullptr);  // constant: never freed by ZeroMQ
    }
    transport::Send(socket_, frames).IgnoreError();
  }

  static constexpr int64_t kMaxReplyBytes = int64_t{64} << 20;

  BindAddress bind_;           // first member: the ipc file goes after the socket closed
  std::map<int64_t, std::vector<std::byte>> replies_;  // by size; outlive the context (lent to it)
  zmq::context_t context_{1};  // outlives the socket
  zmq::socket_t socket_;       // the loop thread's once it runs
  std::string endpoint_;
  transport::Waker waker_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// One raw round-trip configuration: `bytes` of payload cut into frames of `frame_bytes`.
struct RawCase {
  std::string name;
  Net net;
  int64_t bytes;
  int64_t frame_bytes;
  int iterations;
  int warmup;
  bool process = false;  // the echo server in a process of its own (ferry-bench --echo-process)
  RawShape shape = RawShape::kEcho;
};

// Payload bytes a call of `c` moves: twice the payload for a round trip, once one way.
double MovedBytes(const RawCase& c) { return (c.shape == RawShape::kEcho ? 2.0 : 1.0) * static_cast<double>(c.bytes); }

// One payload frame: the transport's own ceiling.
RawCase OneFrame(Net net, const Size& size) {
  return {"raw/" + NetName(net) + "/" + size.name, net, size.bytes, size.bytes, size.iterations, WarmupCalls(size)};
}
// One payload frame to an echo server in another process (tcp): the ceiling of ps_proc/.
RawCase OneFrameProcess(const Size& size) {
  return {std::string("raw_proc/tcp/") + size.name, Net::kTcp, size.bytes, size.bytes, size.iterations,
          WarmupCalls(size), /*process=*/true};
}
// One payload frame one way (kUp: the request carries it, the reply is empty; kDown: the other way
// round) to an echo process: the ceiling of ps_proc/'s pushes and pulls, which move the same bytes.
RawCase OneWayProcess(const Size& size, RawShape shape) {
  return {std::string(shape == RawShape::kUp ? "raw_proc_up/tcp/" : "raw_proc_down/tcp/") + size.name,
          Net::kTcp,
          size.bytes,
          size.bytes,
          size.iterations,
          WarmupCalls(size),
          /*process=*/true,
          shape};
}
// Frames of the chunk size a Ferry table of that many bytes has here: what the PS puts on the wire.
RawCase Chunked(Net net, const Size& size) {
  constexpr int64_t kFloat = sizeof(float);
  const int64_t frame = ChunkElems(size.bytes / kFloat) * kFloat;
  return {"raw_chunked/" + NetName(net) + "/" + size.name, net, size.bytes, frame, size.iterations, WarmupCalls(size)};
}
// 100 frames of 1 KiB: what one push+pull of the 100 small tensors of small/ puts on the wire.
RawCase SmallFrames() { return {"raw_frames/tcp/100x1KiB", Net::kTcp, 100 << 10, 1 << 10, 1000, 100}; }
// The same 100 KiB in one frame: what small/ would cost if small tensors were packed together.
RawCase SmallPacked() { return {"raw/tcp/100KiB", Net::kTcp, 100 << 10, 100 << 10, 1000, 100}; }

// The near end: a DEALER socket that sends [8-byte header][payload frame(s)] and waits for the
// echo. The payload is one preallocated buffer lent to ZeroMQ without copying (transport::Borrow,
// as the Ferry client lends gradients), and like a Ferry Handle a round trip ends only once ZeroMQ
// has handed the buffer back.
class RawRoundTrip {
 public:
  // `process`: the echo server runs in a child process (tcp only), as a ferry-ps would.
  static StatusOr<std::unique_ptr<RawRoundTrip>> Start(Net net, int64_t bytes, int64_t frame_bytes,
                                                       bool process = false, RawShape shape = RawShape::kEcho) {
    std::unique_ptr<RawRoundTrip> rt(new RawRoundTrip(bytes, frame_bytes, shape));
    std::string endpoint;
    if (process) {
      rt->child_ = std::make_unique<test::ChildProcess>("/proc/self/exe",
                                                        std::vector<std::string>{"ferry-bench", "--echo-process"});
      endpoint = rt->child_->endpoint();
      if (endpoint.empty()) return UnavailableError("raw client: the echo process did not start");
    } else {
      FERRY_ASSIGN_OR_RETURN(rt->server_, EchoServer::Start(net));
      endpoint = rt->server_->endpoint();
    }
    FERRY_ASSIGN_OR_RETURN(rt->socket_, transport::MakeSocket(rt->context_, zmq::socket_type::dealer, 100000));
    try {
      rt->socket_.set(zmq::sockopt::rcvtimeo, static_cast<int>(std::chrono::milliseconds(kWaitTimeout).count()));
      if (net == Net::kTcpCurve) SetCurve(rt->socket_, /*server=*/false);
      rt->socket_.connect(endpoint);
    } catch (const zmq::error_t& e) {
      return UnavailableError(std::string("raw client: connect: ") + e.what());
    }
    return rt;
  }

  Status Once() {
    ++sequence_;
    Frames out;
    // A small header frame (copied, like Ferry's): the sequence, and for a one-way call the bytes
    // to send back.
    const int64_t header[2] = {static_cast<int64_t>(sequence_),
                               shape_ == RawShape::kDown ? static_cast<int64_t>(payload_.size()) : 0};
    const size_t header_bytes = shape_ == RawShape::kEcho ? sizeof sequence_ : kOneWayHeaderBytes;
    out.emplace_back(header, header_bytes);
    for (size_t at = 0; shape_ != RawShape::kDown && at < payload_.size(); at += frame_bytes_) {
      out.push_back(transport::Borrow(payload_.data() + at, std::min(frame_bytes_, payload_.size() - at), lender_));
    }
    FERRY_RETURN_IF_ERROR(transport::Send(socket_, out));
    try {
      zmq::message_t reply;
      if (!socket_.recv(reply)) return DeadlineExceededError("raw round trip: no echo in time");
      if (reply.size() != header_bytes || std::memcmp(reply.data(), header, header_bytes) != 0) {
        return DataLossError("raw round trip: the echo's header differs from what was sent");
      }
      size_t received = 0;
      for (bool more = reply.more(); more;) {
        zmq::message_t frame;
        if (!socket_.recv(frame)) return DataLossError("raw round trip: echo cut short");
        received += frame.size();
        more = frame.more();
      }
      if (received != (shape_ == RawShape::kUp ? 0 : payload_.size())) {
        return DataLossError("raw round trip: the echo's payload differs in size");
      }
    } catch (const zmq::error_t& e) {
      return UnavailableError(std::string("raw round trip: recv: ") + e.what());
    }
    if (!lender_->WaitReturned(SteadyClock::now() + kWaitTimeout)) {
      return InternalError("raw round trip: ZeroMQ kept the payload buffer");
    }
    return Status::Ok();
  }

  RawRoundTrip(const RawRoundTrip&) = delete;
  RawRoundTrip& operator=(const RawRoundTrip&) = delete;

 private:
  RawRoundTrip(int64_t bytes, int64_t frame_bytes, RawShape shape)
      : payload_(static_cast<size_t>(bytes), std::byte{0x5a}),
        frame_bytes_(static_cast<size_t>(frame_bytes)),
        shape_(shape) {}

  std::unique_ptr<EchoServer> server_;
  std::unique_ptr<test::ChildProcess> child_;  // or the echo server's process
  std::vector<std::byte> payload_;  // lent to ZeroMQ; declared before context_ so it outlives it
  size_t frame_bytes_;
  RawShape shape_;
  std::shared_ptr<transport::Lender> lender_ = std::make_shared<transport::Lender>();
  zmq::context_t context_{1};  // the client's own, as a separate process would have
  zmq::socket_t socket_;
  uint64_t sequence_ = 0;
};

// Payload bytes per second of `c.iterations` raw round trips (after a warm-up).
StatusOr<double> MeasureRawRate(const RawCase& c) {
  FERRY_ASSIGN_OR_RETURN(auto rt, RawRoundTrip::Start(c.net, c.bytes, c.frame_bytes, c.process, c.shape));
  for (int i = 0; i < c.warmup; ++i) FERRY_RETURN_IF_ERROR(rt->Once());
  const auto start = SteadyClock::now();
  for (int i = 0; i < c.iterations; ++i) FERRY_RETURN_IF_ERROR(rt->Once());
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return MovedBytes(c) * c.iterations / seconds;
}

// ---- memory bandwidth --------------------------------------------------------------------------

// STREAM triad, a = b + s*c: 12 bytes per element as STREAM counts them (the write-allocate read
// of `a` that a cache without streaming stores also does is not counted).
[[gnu::noinline]] void Triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
                             size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// In-place axpy, y += s*x: SGD's access pattern (read two arrays, write one back in place), 12
// bytes per element with no write-allocate traffic.
[[gnu::noinline]] void Axpy(float* __restrict y, const float* __restrict x, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += s * x[i];
}

constexpr size_t kMemElems = size_t{16} << 20;  // 16M floats = 64 MiB per array, far beyond caches
constexpr int kMemIterations = 20;

// Bytes/s of `iterations` triads over kMemElems-element arrays.
double MeasureTriadRate(int iterations) {
  std::vector<float> a(kMemElems, 0.0f), b(kMemElems, 1.0f), c(kMemElems, 2.0f);
  Triad(a.data(), b.data(), c.data(), 0.5f, kMemElems);  // warm-up
  const auto start = SteadyClock::now();
  for (int i = 0; i < iterations; ++i) {
    Triad(a.data(), b.data(), c.data(), 0.5f, kMemElems);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return 12.0 * static_cast<double>(kMemElems) * iterations / seconds;
}

// Bytes/s of `iterations` in-place axpys over kMemElems-element arrays.
double MeasureAxpyRate(int iterations) {
  std::vector<float> y(kMemElems, 0.0f), x(kMemElems, 1.0f);
  Axpy(y.data(), x.data(), 1e-3f, kMemElems);  // warm-up
  const auto start = SteadyClock::now();
  for (int i = 0; i < iterations; ++i) {
    Axpy(y.data(), x.data(), 1e-3f, kMemElems);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return 12.0 * static_cast<double>(kMemElems) * iterations / seconds;
}

// ---- baselines ---------------------------------------------------------------------------------

// Figures that later benchmarks are compared with, taken earlier in the same run; when a filter
// skipped them they are measured on demand (outside any timed loop). Benchmarks run one at a
// time, but the lock keeps this safe from any thread.
class Baselines {
 public:
  void AddRaw(const RawCase& c, double bytes_per_second) {
    std::lock_guard lock(mu_);
    raw_[c.name].push_back(bytes_per_second);
  }
  // The median rate of raw case `c` recorded so far (measured now if none); 0 if it cannot be
  // measured.
  double RawRate(const RawCase& c) {
    std::lock_guard lock(mu_);
    auto& v = raw_[c.name];
    if (v.empty()) {
      auto rate = MeasureRawRate(c);
      if (!rate.ok()) {
        std::fprintf(stderr, "%s baseline: %s\n", c.name.c_str(), rate.status().ToString().c_str());
        return 0.0;
      }
      v.push_back(*rate);
    }
    return Median(v);
  }

  void AddStream(double bytes_per_second) {
    std::lock_guard lock(mu_);
    stream_.push_back(bytes_per_second);
  }
  // The median STREAM triad rate recorded so far (measured now if none).
  double StreamRate() {
    std::lock_guard lock(mu_);
    if (stream_.empty()) stream_.push_back(MeasureTriadRate(kMemIterations));
    return Median(stream_);
  }

  void AddAxpy(double bytes_per_second) {
    std::lock_guard lock(mu_);
    axpy_.push_back(bytes_per_second);
  }
  // The median in-place axpy rate recorded so far (measured now if none).
  double AxpyRate() {
    std::lock_guard lock(mu_);
    if (axpy_.empty()) axpy_.push_back(MeasureAxpyRate(kMemIterations));
    return Median(axpy_);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::vector<double>> raw_;  // guarded by mu_; by RawCase::name
  std::vector<double> stream_;                      // guarded by mu_
  std::vector<double> axpy_;                        // guarded by mu_
};

// Counters: `bytes_per_second` (the payload moved: 2 x size per round trip, size one way),
// `faults_per_call` (page faults of the process per round trip: fresh receive buffers; see
// RESULTS.md for what they cost here).
void BM_Raw(benchmark::State& state, Baselines& baselines, const RawCase& c) {
  auto rt = RawRoundTrip::Start(c.net, c.bytes, c.frame_bytes, c.process, c.shape);
  Status st = rt.status();
  for (int i = 0; st.ok() && i < c.warmup; ++i) st = (*rt)->Once();
  if (!st.ok()) Fail(state, st);
  LoopTimer timer;
  int64_t calls = 0;
  for (auto _ : state) {
    timer.IterationStart();
    if (Status s = (*rt)->Once(); !s.ok()) {
      Fail(state, s);
      break;
    }
    timer.IterationEnd();
    ++calls;
  }
  timer.Finish();
  if (state.error_occurred() || calls == 0) return;
  const double bytes = MovedBytes(c) * static_cast<double>(calls);
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["faults_per_call"] = timer.faults() / static_cast<double>(calls);
  baselines.AddRaw(c, bytes / timer.seconds());
}

// ---- a PS cluster in this process --------------------------------------------------------------

// Servers of one benchmark run, each a ferry::Server with its own Context (as separate ferry-ps
// processes would have) and one compute thread; they stop when this is destroyed.
struct PsCluster {
  Net net = Net::kTcp;
  std::vector<BindAddress> addresses;  // before servers: ipc files are removed after they stop
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::unique_ptr<test::PsProcess>> processes;  // or ferry-ps processes (tcp)
  std::vector<std::string> endpoints;
};

// `processes`: the servers are ferry-ps processes (tcp, one compute thread each), as users run
// them; otherwise ferry::Servers in this process.
StatusOr<std::shared_ptr<const PsCluster>> StartCluster(Net net, int num_servers, bool processes = false) {
  auto cluster = std::make_shared<PsCluster>();
  cluster->net = net;
  if (processes) {
    if (net != Net::kTcp) return InvalidArgumentError("ferry-ps processes are measured over tcp only");
    for (int s = 0; s < num_servers; ++s) {
      auto& p = cluster->processes.emplace_back(std::make_unique<test::PsProcess>(
          s, num_servers, std::vector<std::string>{"--num-workers", std::to_string(num_servers)}));
      if (p->endpoint().empty()) return UnavailableError("ferry-ps " + std::to_string(s) + " did not start");
      cluster->endpoints.push_back(p->endpoint());
    }
    return std::shared_ptr<const PsCluster>(std::move(cluster));
  }
  for (int s = 0; s < num_servers; ++s) {
    const BindAddress& bind = cluster->addresses.emplace_back(net);
    ServerOptions o;
    o.bind = bind.address();
    o.rank = s;
    o.num_servers = num_servers;
    // One helper thread a server, or FERRY_BENCH_COMPUTE_THREADS (0: none; the threading A/B of
    // RESULTS.md runs the binary with each, alternating).
    const char* threads = std::getenv("FERRY_BENCH_COMPUTE_THREADS");
    o.compute_threads = threads != nullptr ? std::atoi(threads) : 1;
    o.max_wait = kRequestTimeout;
    if (net == Net::kTcpCurve) {
      o.curve = Keys().server;
      o.curve->workers.resize(static_cast<size_t>(num_servers));  // these runs have a worker per server
    }
    FERRY_ASSIGN_OR_RETURN(auto server, Server::Start(std::move(o)));
    cluster->endpoints.push_back(server->endpoint());
    cluster->servers.push_back(std::move(server));
  }
  return std::shared_ptr<const PsCluster>(std::move(cluster));
}

StatusOr<std::unique_ptr<Client>> ConnectWorker(const PsCluster& cluster, int rank, int num_workers,
                                                ClientOptions o = {}) {
  o.servers = cluster.endpoints;
  o.rank = rank;
  o.num_workers = num_workers;
  o.request_timeout = kRequestTimeout;
  // FERRY_BENCH_MAX_MESSAGE_BYTES: the client's max_message_bytes (experiments with smaller pieces).
  if (const char* m = std::getenv("FERRY_BENCH_MAX_MESSAGE_BYTES")) o.max_message_bytes = std::atoll(m);
  // FERRY_BENCH_DENSE_MESSAGE_BYTES: the client's dense_message_bytes (the size of a dense call's pieces).
  if (const char* m = std::getenv("FERRY_BENCH_DENSE_MESSAGE_BYTES")) o.dense_message_bytes = std::atoll(m);
  if (cluster.net == Net::kTcpCurve) o.curve = Keys().workers[static_cast<size_t>(rank)];
  return Client::Connect(std::move(o));
}

// `servers` servers over tcp and one connected worker (status: why not). Declare it after the
// buffers its requests use, so that the client is destroyed before them.
struct OneWorker {
  StatusOr<std::shared_ptr<const PsCluster>> cluster;
  std::unique_ptr<Client> client;
  Status status;

  explicit OneWorker(int servers, ClientOptions options = {})
      : cluster(StartCluster(Net::kTcp, servers)), status(cluster.status()) {
    if (!status.ok()) return;
    auto c = ConnectWorker(**cluster, 0, 1, std::move(options));
    status = c.status();
    if (c.ok()) client = std::move(c).value();
  }
};

// What the threads of one multi-worker benchmark share. Google Benchmark starts a registered
// benchmark's threads together and runs its repetitions one after another: thread 0 starts the
// servers before the timed loop while the other threads wait for them, and after the loop every
// thread hands in its payload bytes and seconds, which thread 0 combines.
class SharedRun {
 public:
  struct ThreadResult {
    double bytes = 0;    // payload bytes this thread moved in its timed loop
    double seconds = 0;  // its LoopTimer
    double calls = 0;
    double faults = 0;   // the process's page faults during its loop (thread 0's figure is used)
  };

  explicit SharedRun(int threads) : results_(static_cast<size_t>(threads)), after_loop_(threads) {}

  // Thread 0 starts the cluster and publishes it (or why it failed); the others wait for it.
  StatusOr<std::shared_ptr<const PsCluster>> Enter(const benchmark::State& state, Net net, int num_servers,
                                                    bool processes = false) {
    std::unique_lock lock(mu_);
    if (state.thread_index() == 0) {
      auto cluster = StartCluster(net, num_servers, processes);
      status_ = cluster.status();
      if (cluster.ok()) cluster_ = *cluster;
      published_ = true;
      cv_.notify_all();
      return cluster;
    }
    if (!cv_.wait_for(lock, kWaitTimeout, [&] { return published_; })) {
      return DeadlineExceededError("thread 0 did not start the cluster in time");
    }
    if (!status_.ok()) return status_;
    return cluster_;
  }

  // Every thread calls this once after its timed loop; thread 0 gets every thread's result (the
  // others an empty list) and clears the run for the next repetition.
  std::vector<ThreadResult> Leave(const benchmark::State& state, const ThreadResult& mine) {
    results_[static_cast<size_t>(state.thread_index())] = mine;
    after_loop_.arrive_and_wait();
    if (state.thread_index() != 0) return {};
    std::lock_guard lock(mu_);
    published_ = false;
    cluster_.reset();  // each thread still holds its own reference
    status_ = Status::Ok();
    return results_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool published_ = false;                    // guarded by mu_
  Status status_;                             // guarded by mu_
  std::shared_ptr<const PsCluster> cluster_;  // guarded by mu_
  std::vector<ThreadResult> results_;         // slot i: thread i, written before after_loop_
  std::barrier<> after_loop_;
};

// Thread 0 sets `bytes_per_second` (all threads' payload bytes over the average of their loop
// times, as Google Benchmark averages their real times), `vs_raw` and `vs_raw_chunked` (that rate
// over the raw baselines) and `faults_per_call` (process page faults per call, all workers).
void ReportAggregate(benchmark::State& state, const std::vector<SharedRun::ThreadResult>& results, double raw,
                     double raw_chunked, double raw_same_bytes = 0) {
  double bytes = 0, seconds = 0, calls = 0;
  for (const auto& r : results) bytes += r.bytes, seconds += r.seconds, calls += r.calls;
  seconds /= static_cast<double>(results.size());
  if (bytes <= 0 || seconds <= 0) return;
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  if (raw > 0) state.counters["vs_raw"] = bytes / seconds / raw;
  if (raw_chunked > 0) state.counters["vs_raw_chunked"] = bytes / seconds / raw_chunked;
  if (raw_same_bytes > 0) state.counters["vs_raw_same_bytes"] = bytes / seconds / raw_same_bytes;
  state.counters["faults_per_call"] = results[0].faults / calls;
}

// ---- dense push / pull -------------------------------------------------------------------------

enum class DenseOp { kPush, kPull, kPushPull };

std::string OpName(DenseOp op) {
  switch (op) {
    case DenseOp::kPush: return "push";
    case DenseOp::kPull: return "pull";
    case DenseOp::kPushPull: return "pushpull";
  }
  return "?";
}

// The raw call that moves what `op` moves: a push's tensor one way, a pull's the other, a
// push+pull's both.
RawShape ShapeOf(DenseOp op) {
  return op == DenseOp::kPush ? RawShape::kUp : op == DenseOp::kPull ? RawShape::kDown : RawShape::kEcho;
}

// Payload bytes one call moves: a push or a pull carries the tensor once, a push+pull twice.
double PayloadBytes(DenseOp op, int64_t bytes) {
  return static_cast<double>(op == DenseOp::kPushPull ? 2 * bytes : bytes);
}

constexpr std::string_view kDenseTable = "bench_dense";

// An async SGD table of `elems` floats in chunks of ChunkElems(elems).
TableSpec DenseSpec(int64_t elems) {
  TableSpec spec;
  spec.name = std::string(kDenseTable);
  spec.type = TableType::kDense;
  spec.shape = {elems};
  spec.chunk_elems = ChunkElems(elems);
  spec.optimizer.type = OptimizerType::kSgd;
  spec.optimizer.learning_rate = 0.01f;
  spec.consistency = Consistency::kAsync;  // workers never wait for each other
  return spec;
}

// One worker of the dense benchmarks: its own Client, a gradient to push, a buffer to pull into.
class DenseWorker {
 public:
  Status Start(const PsCluster& cluster, int rank, int num_workers, int64_t bytes) {
    const int64_t elems = bytes / static_cast<int64_t>(sizeof(float));
    grad_.assign(static_cast<size_t>(elems), 1e-3f);
    out_.assign(static_cast<size_t>(elems), 0.0f);
    FERRY_ASSIGN_OR_RETURN(client_, ConnectWorker(cluster, rank, num_workers));
    return client_->Declare(DenseSpec(elems));  // every worker declares; identical specs are accepted
  }

  // fresh_out: the pulled values go into a new vector each call, as a user's program that writes
  // `std::vector<float> out(n); client->PullDense(...)` does (its pages are the allocator's to
  // make warm or cold), instead of one buffer reused.
  Status Call(DenseOp op, int64_t step, bool fresh_out = false) {
    std::vector<float> fresh;
    if (fresh_out) fresh.resize(out_.size());
    const DenseIn in{kDenseTable, grad_};
    const DenseOut out{kDenseTable, fresh_out ? std::span<float>(fresh) : std::span<float>(out_)};
    Handle h;
    switch (op) {
      case DenseOp::kPush: h = client_->PushDense(std::span(&in, 1), step); break;
      case DenseOp::kPull: h = client_->PullDense(std::span(&out, 1), step); break;
      case DenseOp::kPushPull: h = client_->PushPullDense(std::span(&in, 1), std::span(&out, 1), step); break;
    }
    return h.wait(kWaitTimeout);
  }

  // The pull and push+pull with the values left where they arrived (PullDenseView,
  // PushPullDenseView); a push is the same call either way.
  Status CallView(DenseOp op, int64_t step) {
    if (op == DenseOp::kPush) return Call(op, step);
    const std::string_view table = kDenseTable;
    const DenseIn in{kDenseTable, grad_};
    std::shared_ptr<const PulledDense> values;
    Handle h = op == DenseOp::kPull ? client_->PullDenseView(std::span(&table, 1), step, &values)
                                    : client_->PushPullDenseView(std::span(&in, 1), step, &values);
    return h.wait(kWaitTimeout);
  }

 private:
  std::vector<float> grad_, out_;   // declared before client_: outlive what it lent to ZeroMQ
  std::unique_ptr<Client> client_;
};

// One worker per benchmark thread; as many servers as workers (1s1w or 2s2w). `processes`: the
// servers are ferry-ps processes (tcp), measured against raw round trips to another process.
void BM_PsDense(benchmark::State& state, Baselines& baselines, SharedRun& run, DenseOp op, Net net, Size size,
                bool processes = false, bool fresh_out = false) {
  const bool lead = state.thread_index() == 0;
  // Before the servers start, so that they cannot disturb them (no-ops when raw/ ran already).
  const double raw = !lead       ? 0.0
                     : processes ? baselines.RawRate(OneFrameProcess(size))
                                 : baselines.RawRate(OneFrame(net, size));
  const double raw_chunked = lead && !processes ? baselines.RawRate(Chunked(net, size)) : 0.0;
  // Against raw ZeroMQ moving the bytes this call moves: a push's one way, a pull's the other.
  const double raw_same_bytes = !lead || !processes             ? 0.0
                                : op == DenseOp::kPushPull ? raw
                                                           : baselines.RawRate(OneWayProcess(size, ShapeOf(op)));
  auto cluster = run.Enter(state, net, /*num_servers=*/state.threads(), processes);
  DenseWorker worker;
  Status st = cluster.ok() ? worker.Start(**cluster, state.thread_index(), state.threads(), size.bytes)
                           : cluster.status();
  int64_t step = 0;
  for (int i = 0; st.ok() && i < WarmupCalls(size); ++i) st = worker.Call(op, step++, fresh_out);
  if (!st.ok()) Fail(state, st);

  LoopTimer timer;
  int64_t calls = 0;
  for (auto _ : state) {
    timer.IterationStart();
    if (Status s = worker.Call(op, step++, fresh_out); !s.ok()) {
      Fail(state, s);
      break;
    }
    timer.IterationEnd();
    ++calls;
  }
  timer.Finish();
  const auto results = run.Leave(state, {PayloadBytes(op, size.bytes) * static_cast<double>(calls), timer.seconds(),
                                         static_cast<double>(calls), timer.faults()});
  if (lead && !state.error_occurred()) ReportAggregate(state, results, raw, raw_chunked, raw_same_bytes);
}

// Ferry and raw ZeroMQ moving the same bytes, paired call by call (issue 34): one ferry-ps process
// and one echo process, and in each iteration one Ferry call and one raw call of the same shape (a
// push: the tensor one way and an empty reply; a pull: the other way; a push+pull: both), in
// alternating order. On a shared VM whose speed drifts by tens of percent within seconds, pairs
// taken microseconds apart see the same machine, where separate benchmarks do not. Counters: the
// median ms of each (`ferry_ms`, `raw_ms`), `vs_raw_same_bytes` = raw_ms / ferry_ms (the share of
// raw's rate), and the median and quartiles of the per-pair ratio (`pair_*`).
void BM_PsPaired(benchmark::State& state, DenseOp op, Size size, bool view) {
  auto raw = RawRoundTrip::Start(Net::kTcp, size.bytes, size.bytes, /*process=*/true, ShapeOf(op));
  auto cluster = StartCluster(Net::kTcp, /*num_servers=*/1, /*processes=*/true);
  DenseWorker worker;
  Status st = !raw.ok() ? raw.status() : !cluster.ok() ? cluster.status() : worker.Start(**cluster, 0, 1, size.bytes);
  int64_t step = 0;
  auto ferry_call = [&] { return view ? worker.CallView(op, step++) : worker.Call(op, step++); };
  for (int i = 0; st.ok() && i < WarmupCalls(size); ++i) {
    st = ferry_call();
    if (st.ok()) st = (*raw)->Once();
  }
  if (!st.ok()) Fail(state, st);
  std::vector<double> ferry_ms, raw_ms;
  for (auto _ : state) {
    if (state.error_occurred()) break;
    const bool ferry_first = (ferry_ms.size() & 1) == 0;
    double ms[2] = {0, 0};  // ferry, raw
    for (int k = 0; k < 2; ++k) {
      const bool ferry = (k == 0) == ferry_first;
      const auto start = SteadyClock::now();
      Status s = ferry ? ferry_call() : (*raw)->Once();
      ms[ferry ? 0 : 1] = std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
      if (!s.ok()) {
        Fail(state, s);
        break;
      }
    }
    ferry_ms.push_back(ms[0]);
    raw_ms.push_back(ms[1]);
  }
  if (state.error_occurred() || ferry_ms.empty()) return;
  std::vector<double> ratio(ferry_ms.size());
  for (size_t i = 0; i < ratio.size(); ++i) ratio[i] = raw_ms[i] / ferry_ms[i];
  auto quantile = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
  };
  state.counters["ferry_ms"] = quantile(ferry_ms, 0.5);
  state.counters["raw_ms"] = quantile(raw_ms, 0.5);
  state.counters["vs_raw_same_bytes"] = quantile(raw_ms, 0.5) / quantile(ferry_ms, 0.5);
  state.counters["pair_p25"] = quantile(ratio, 0.25);
  state.counters["pair_median"] = quantile(ratio, 0.5);
  state.counters["pair_p75"] = quantile(ratio, 0.75);
}

// ---- many small tensors ------------------------------------------------------------------------

constexpr int kSmallTensors = 100;
constexpr int64_t kSmallElems = 256;  // 1 KiB each

enum class SmallMode {
  kOneCall,   // one PushPullDense carrying all 100 tensors
  kEachCall,  // 100 PushPullDense calls, each waited for before the next
  kEachAsync, // 100 PushPullDense calls issued together, then all waited for
};

std::string SmallModeName(SmallMode m) {
  switch (m) {
    case SmallMode::kOneCall: return "one_call";
    case SmallMode::kEachCall: return "call_each";
    case SmallMode::kEachAsync: return "call_each_in_flight";
  }
  return "?";
}

// One training step's worth of small dense tensors (100 async SGD tables of 1 KiB) pushed and
// pulled over tcp by one worker. The benchmark's time is the time per step. Counters:
// `round_trips_per_step`, the messages the client sent per step (ClientStats::requests);
// `bytes_per_second` (2 x 100 KiB per step) and `vs_raw` over raw_frames/tcp/100x1KiB.
void BM_SmallTensors(benchmark::State& state, Baselines& baselines, SmallMode mode, int num_servers) {
  const double raw = baselines.RawRate(SmallFrames());
  std::vector<std::string> names;
  std::vector<std::vector<float>> grads(kSmallTensors, std::vector<float>(kSmallElems, 1e-3f));
  std::vector<std::vector<float>> outs(kSmallTensors, std::vector<float>(kSmallElems, 0.0f));
  std::vector<DenseIn> ins;
  std::vector<DenseOut> outputs;
  for (int t = 0; t < kSmallTensors; ++t) names.push_back("small_" + std::to_string(t));
  for (int t = 0; t < kSmallTensors; ++t) {
    ins.push_back({names[static_cast<size_t>(t)], grads[static_cast<size_t>(t)]});
    outputs.push_back({names[static_cast<size_t>(t)], outs[static_cast<size_t>(t)]});
  }
  std::vector<Handle> handles(kSmallTensors);

  OneWorker worker(num_servers);  // after the buffers: destroyed before them
  Client* client = worker.client.get();
  Status st = worker.status;
  for (int t = 0; st.ok() && t < kSmallTensors; ++t) {
    TableSpec spec;
    spec.name = names[static_cast<size_t>(t)];
    spec.shape = {kSmallElems};
    spec.consistency = Consistency::kAsync;
    st = client->Declare(spec);
  }
  int64_t step = 0;
  auto one_step = [&]() -> Status {
    switch (mode) {
      case SmallMode::kOneCall: return client->PushPullDense(ins, outputs, step).wait(kWaitTimeout);
      case SmallMode::kEachCall:
        for (int t = 0; t < kSmallTensors; ++t) {
          FERRY_RETURN_IF_ERROR(client->PushPullDense(std::span(&ins[t], 1), std::span(&outputs[t], 1), step)
                                    .wait(kWaitTimeout));
        }
        return Status::Ok();
      case SmallMode::kEachAsync:
        for (int t = 0; t < kSmallTensors; ++t) {
          handles[t] = client->PushPullDense(std::span(&ins[t], 1), std::span(&outputs[t], 1), step);
        }
        for (auto& h : handles) FERRY_RETURN_IF_ERROR(h.wait(kWaitTimeout));
        return Status::Ok();
    }
    return Status::Ok();
  };
  for (int i = 0; st.ok() && i < 20; ++i, ++step) st = one_step();
  if (!st.ok()) Fail(state, st);

  const int64_t requests_before = client ? client->stats().requests : 0;
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    if (Status s = one_step(); !s.ok()) {
      Fail(state, s);
      break;
    }
    timer.IterationEnd();
    ++step;
  }
  timer.Finish();
  if (state.error_occurred()) return;
  state.counters["faults_per_call"] = benchmark::Counter(timer.faults(), benchmark::Counter::kAvgIterations);
  state.counters["round_trips_per_step"] = benchmark::Counter(
      static_cast<double>(client->stats().requests - requests_before), benchmark::Counter::kAvgIterations);
  const double bytes = 2.0 * kSmallTensors * kSmallElems * sizeof(float) * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  if (raw > 0) state.counters["vs_raw"] = bytes / timer.seconds() / raw;
}

// ---- sparse pull / push ------------------------------------------------------------------------


// Batches of Zipf-distributed ids, drawn once (seeded) and shared by the sparse benchmarks.
struct ZipfBatches {
  static constexpr int kBatches = 8;
  static constexpr int64_t kBatchIds = 100'000;
  static constexpr int64_t kIdSpace = 10'000'000;
  static constexpr double kExponent = 1.05;
  static constexpr uint64_t kSeed = 20240601;

  std::vector<std::vector<int64_t>> ids;  // kBatches x kBatchIds, id = Zipf rank - 1
  std::vector<int64_t> unique;            // distinct ids per batch (what the client sends)

  static ZipfBatches Make() {
    ZipfBatches z;
    std::mt19937_64 rng(kSeed);
    const data::ZipfSampler zipf(kIdSpace, kExponent);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int b = 0; b < kBatches; ++b) {
      std::vector<int64_t> batch(kBatchIds);
      for (auto& id : batch) id = zipf.Sample([&] { return unit(rng); }) - 1;
      std::vector<int64_t> sorted = batch;
      std::sort(sorted.begin(), sorted.end());
      z.unique.push_back(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
      z.ids.push_back(std::move(batch));
    }
    return z;
  }
};

// T::Make()'s ids, drawn on first use, so that filtered-out runs do not pay for them.
template <typename T>
class Lazy {
 public:
  const T& Get() {
    std::call_once(once_, [this] { made_ = T::Make(); });
    return made_;
  }

 private:
  std::once_flag once_;
  T made_;
};
using LazyZipf = Lazy<ZipfBatches>;

// The sparse benchmarks' tables: async SGD, rows of `dim` floats starting uniform in +-0.01.
TableSpec BenchEmbedding(std::string name, int64_t dim) {
  TableSpec spec;
  spec.name = std::move(name);
  spec.type = TableType::kSparse;
  spec.dim = dim;
  spec.consistency = Consistency::kAsync;
  spec.init = InitType::kUniform;
  spec.init_scale = 0.01f;
  return spec;
}

// One worker and one server over tcp, an async SGD table of `dim` floats per row, warmed so that
// every row the batches name exists. Each call pulls (or pushes) one batch of 100k ids; the client
// deduplicates them first, so `rows_per_second` counts requested ids and `unique_rows_per_second`
// the distinct rows that actually travel and are looked up (or updated) on the server.
// The per-table hot-ids sketch (ps::HotIds, issue 16's metrics) on what a server sees of a pull:
// the batch's distinct ids, as the client sends them. Its time a call is what the sketch adds to
// serving such a pull (compare sparse/pull/dim16 in the same run).
void BM_HotIds(benchmark::State& state, LazyZipf& zipf) {
  const ZipfBatches& z = zipf.Get();
  std::vector<std::vector<int64_t>> sent;
  for (const auto& batch : z.ids) {
    std::vector<int64_t> u = batch;
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
    sent.push_back(std::move(u));
  }
  ps::HotIds hot;
  size_t b = 0;
  int64_t ids = 0;
  for (auto _ : state) {
    hot.Add(sent[b]);
    ids += static_cast<int64_t>(sent[b].size());
    b = (b + 1) % sent.size();
  }
  benchmark::DoNotOptimize(hot.Top(1));
  state.counters["ids_per_call"] = static_cast<double>(ids) / static_cast<double>(state.iterations());
  state.counters["ids_per_s"] = benchmark::Counter(static_cast<double>(ids), benchmark::Counter::kIsRate);
}

void BM_Sparse(benchmark::State& state, LazyZipf& zipf, bool push, int64_t dim) {
  const ZipfBatches& z = zipf.Get();
  constexpr std::string_view kTable = "bench_sparse";
  std::vector<float> rows(static_cast<size_t>(ZipfBatches::kBatchIds * dim), 0.0f);
  std::vector<float> grads(rows.size(), 1e-3f);
  OneWorker worker(1);  // after the buffers: destroyed before them
  Client* client = worker.client.get();
  Status st = worker.status;
  if (st.ok()) st = client->Declare(BenchEmbedding(std::string(kTable), dim));
  auto call = [&](size_t b, int64_t step) {
    const auto& ids = z.ids[b];
    return push ? client->PushSparse(kTable, ids, grads, step).wait(kWaitTimeout)
                : client->PullSparse(kTable, ids, rows, step).wait(kWaitTimeout);
  };
  // Warm-up: create every row of every batch, then one untimed round of the measured call.
  for (size_t b = 0; st.ok() && b < z.ids.size(); ++b) {
    st = client->PullSparse(kTable, z.ids[b], rows, 0).wait(kWaitTimeout);
  }
  for (size_t b = 0; st.ok() && b < z.ids.size(); ++b) st = call(b, 0);
  if (!st.ok()) Fail(state, st);

  double requested = 0, unique = 0;
  size_t b = 0;
  int64_t step = 1;
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    if (Status s = call(b, step++); !s.ok()) {
      Fail(state, s);
      break;
    }
    timer.IterationEnd();
    requested += static_cast<double>(z.ids[b].size());
    unique += static_cast<double>(z.unique[b]);
    b = (b + 1) % z.ids.size();
  }
  timer.Finish();
  if (state.error_occurred()) return;
  state.counters["faults_per_call"] = benchmark::Counter(timer.faults(), benchmark::Counter::kAvgIterations);
  state.counters["rows_per_second"] = benchmark::Counter(requested, benchmark::Counter::kIsRate);
  state.counters["unique_rows_per_second"] = benchmark::Counter(unique, benchmark::Counter::kIsRate);
  state.counters["unique_per_batch"] = benchmark::Counter(unique, benchmark::Counter::kAvgIterations);
  state.SetLabel("zipf s=1.05 over 10M ids, seed " + std::to_string(ZipfBatches::kSeed));
}

// ---- a Criteo-shaped step: 26 embedding tables -------------------------------------------------

// The sparse side of one training step of a Criteo model: 26 tables (one per categorical field),
// a batch of 4,096 examples, each field's ids Zipf-distributed (s = 1.05 over 10M ids, an
// independent draw per field). Ids are deduplicated per table as the trainer does (ascending
// distinct ids), so what a step sends is every table's distinct ids.
struct CriteoSteps {
  static constexpr int kTables = 26;
  static constexpr int64_t kBatch = 4096;
  static constexpr int kSteps = 8;
  static constexpr int64_t kDim = 16;
  static constexpr uint64_t kSeed = 20261124;

  std::vector<std::vector<std::vector<int64_t>>> ids;  // [step][table]: distinct ids, ascending
  std::vector<std::string> names;                      // the tables' names
  int64_t unique = 0;                                  // distinct rows in all steps together

  static CriteoSteps Make() {
    CriteoSteps c;
    const data::ZipfSampler zipf(ZipfBatches::kIdSpace, ZipfBatches::kExponent);
    std::mt19937_64 rng(kSeed);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int t = 0; t < kTables; ++t) c.names.push_back("criteo/C" + std::to_string(t + 1));
    for (int step = 0; step < kSteps; ++step) {
      auto& tables = c.ids.emplace_back();
      for (int t = 0; t < kTables; ++t) {
        std::vector<int64_t> batch(kBatch);
        for (auto& id : batch) id = zipf.Sample([&] { return unit(rng); }) - 1;
        std::sort(batch.begin(), batch.end());
        batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
        c.unique += static_cast<int64_t>(batch.size());
        tables.push_back(std::move(batch));
      }
    }
    return c;
  }
};

using LazyCriteo = Lazy<CriteoSteps>;

// How a step's 26 tables travel.
enum class StepPath {
  kOneMessage,  // one call naming every table, ids distinct, one message per server (sparse_message_bytes 0)
  kTogether,    // the same call with the default sparse_message_bytes: messages of about 512 KiB, pipelined
  kPerTable,    // before protocol 1.5: one call per table, all in flight, each deduplicating its ids again
};
std::string StepPathName(StepPath p) {
  return p == StepPath::kOneMessage ? "one_message" : p == StepPath::kTogether ? "together" : "per_table";
}

// One worker pulls (or pushes) a step's rows of all 26 tables, dim 16, async SGD, over tcp to
// `servers` servers, warmed so that every row exists, along `path`. kPerTable is what ServerStore
// did before protocol 1.5. Counters: unique_rows_per_second (distinct rows that travel and are
// read or updated), messages_per_step (requests the client sent), process_cpu_ms_per_step and
// caller_cpu_ms_per_step (CPU time a step costs all threads, and the calling thread).
void BM_CriteoStep(benchmark::State& state, LazyCriteo& lazy, bool push, StepPath path, int servers) {
  const CriteoSteps& c = lazy.Get();
  constexpr int T = CriteoSteps::kTables;
  constexpr int64_t dim = CriteoSteps::kDim;
  // Output and gradient buffers per table, sized for the largest step.
  std::vector<std::vector<float>> rows(T), grads(T);
  for (int t = 0; t < T; ++t) {
    size_t most = 0;
    for (const auto& step : c.ids) most = std::max(most, step[static_cast<size_t>(t)].size());
    rows[static_cast<size_t>(t)].assign(most * dim, 0.0f);
    grads[static_cast<size_t>(t)].assign(most * dim, 1e-3f);
  }
  ClientOptions options;
  if (path == StepPath::kOneMessage) options.sparse_message_bytes = 0;
  OneWorker worker(servers, options);  // after the buffers: destroyed before them
  Client* client = worker.client.get();
  Status st = worker.status;
  const bool one_call = path != StepPath::kPerTable;
  for (int t = 0; st.ok() && t < T; ++t) st = client->Declare(BenchEmbedding(c.names[static_cast<size_t>(t)], dim));
  std::vector<SparseOut> outs(T);
  std::vector<SparseIn> ins(T);
  std::vector<Handle> handles;
  auto call = [&](size_t step, bool do_push, bool together) -> Status {
    for (int t = 0; t < T; ++t) {
      const auto ti = static_cast<size_t>(t);
      const std::vector<int64_t>& ids = c.ids[step][ti];
      const size_t n = ids.size() * dim;
      outs[ti] = {c.names[ti], ids, std::span<float>(rows[ti]).first(n)};
      ins[ti] = {c.names[ti], ids, std::span<const float>(grads[ti]).first(n)};
    }
    if (together) {
      return do_push ? client->PushSparse(ins, 0, SparseIds::kDistinct).wait(kWaitTimeout)
                     : client->PullSparse(outs, 0, SparseIds::kDistinct).wait(kWaitTimeout);
    }
    handles.clear();
    for (int t = 0; t < T; ++t) {
      const auto ti = static_cast<size_t>(t);
      handles.push_back(do_push ? client->PushSparse(std::span<const SparseIn>(&ins[ti], 1), 0)
                                : client->PullSparse(std::span<const SparseOut>(&outs[ti], 1), 0));
    }
    Status first;
    for (auto& h : handles) {
      Status s = h.wait(kWaitTimeout);
      if (!s.ok() && first.ok()) first = s;
    }
    return first;
  };
  // Warm-up: create every row, then one untimed round of the measured call.
  for (size_t step = 0; st.ok() && step < c.ids.size(); ++step) st = call(step, false, true);
  for (size_t step = 0; st.ok() && step < c.ids.size(); ++step) st = call(step, push, one_call);
  if (!st.ok()) Fail(state, st);

  double unique = 0;
  const int64_t sent = client ? client->stats().requests : 0;
  size_t step = 0;
  // CPU time of the whole process (the worker's threads and the in-process servers'), and of the
  // calling thread alone (what the trainer's own thread spends issuing and finishing the step).
  auto cpu = [](int who) {
    rusage u{};
    getrusage(who, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  };
  const double process0 = cpu(RUSAGE_SELF), thread0 = cpu(RUSAGE_THREAD);
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    if (Status s = call(step, push, one_call); !s.ok()) {
      Fail(state, s);
      break;
    }
    timer.IterationEnd();
    for (const auto& ids : c.ids[step]) unique += static_cast<double>(ids.size());
    step = (step + 1) % c.ids.size();
  }
  timer.Finish();
  if (state.error_occurred()) return;
  state.counters["unique_rows_per_second"] = benchmark::Counter(unique, benchmark::Counter::kIsRate);
  state.counters["unique_per_step"] = benchmark::Counter(unique, benchmark::Counter::kAvgIterations);
  state.counters["messages_per_step"] =
      benchmark::Counter(static_cast<double>(client->stats().requests - sent), benchmark::Counter::kAvgIterations);
  state.counters["process_cpu_ms_per_step"] =
      benchmark::Counter(1e3 * (cpu(RUSAGE_SELF) - process0), benchmark::Counter::kAvgIterations);
  state.counters["caller_cpu_ms_per_step"] =
      benchmark::Counter(1e3 * (cpu(RUSAGE_THREAD) - thread0), benchmark::Counter::kAvgIterations);
  state.SetLabel("26 tables x batch 4096, zipf s=1.05 over 10M ids, dim 16, seed " +
                 std::to_string(CriteoSteps::kSeed));
}

// What a sparse row costs a server: `rows` rows of dim 16 made in a ps::SparseShard (the
// server's own table), measured as heap bytes in use (glibc mallinfo2: arena + mmapped, so what
// the process holds for the shard, not what it touched before), against the row's raw bytes: its
// values, its optimizer state and its 8-byte id. The id index is a hash table that doubles, so
// the cost per row depends on where `rows` falls between doublings: several counts are measured.
void BM_RowMemory(benchmark::State& state, OptimizerType type, int64_t rows) {
  constexpr int64_t kDim = 16;
  TableSpec spec;
  spec.name = "row_memory";
  spec.type = TableType::kSparse;
  spec.dim = kDim;
  spec.optimizer.type = type;
  auto heap = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<double>(m.uordblks + m.hblkhd);
  };
  double heap_per_row = 0, row_floats = 0;
  for (auto _ : state) {
    const double heap0 = heap();
    auto shard = std::make_unique<ps::SparseShard>(spec, TableId(spec.name), 1);
    for (int64_t id = 0; id < rows; ++id) shard->FindOrCreate(id * 7919);  // spread, as hashed ids are
    heap_per_row = (heap() - heap0) / static_cast<double>(rows);
    row_floats = static_cast<double>(shard->row_floats());
    benchmark::DoNotOptimize(shard->size());
  }
  const double raw = row_floats * 4 + 8;
  state.counters["raw_bytes_per_row"] = raw;
  state.counters["heap_bytes_per_row"] = heap_per_row;
  state.counters["heap_vs_raw"] = heap_per_row / raw;
  state.SetLabel(std::to_string(rows) + " rows of dim 16, " + std::string(OptimizerName(type)));
}

// ---- gradient compression (issue 17) -----------------------------------------------------------

// A table's wire format as the benchmarks name it.
struct WireCase {
  const char* name;
  WireFormat wire;
  float topk;  // 0: off
};
constexpr WireCase kWireCases[] = {
    {"f32", WireFormat::kF32, 0.0f},          {"fp16", WireFormat::kF16, 0.0f},
    {"bf16", WireFormat::kBf16, 0.0f},        {"topk0.1", WireFormat::kF32, 0.1f},
    {"topk0.01", WireFormat::kF32, 0.01f},    {"topk0.001", WireFormat::kF32, 0.001f},
    {"topk0.01_fp16", WireFormat::kF16, 0.01f},
};

// Encoding and decoding `elems` floats (normal(0, 1), so top-k has no ties to lean on) as a
// client and a server do, each beside a memcpy of the same float32 bytes in the same iteration
// (interleaved, so that a neighbour's load hits all three alike). Encode: fp16/bf16 convert;
// top-k adds the gradient into the residual and encodes the frame (error feedback, as
// Client::PushDense does per chunk). Decode: fp16/bf16 convert back; top-k scatters the pairs
// into a zeroed chunk (as the server does). Rates are float32 bytes (4 per element) per second.
void BM_Codec(benchmark::State& state, WireCase c, size_t elems) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> g(elems), copy(elems), residual(elems, 0.0f), back(elems);
  for (auto& x : g) x = normal(rng);
  const int64_t n = static_cast<int64_t>(elems);
  const size_t frame_bytes = static_cast<size_t>(c.topk > 0 ? wire::TopKFrameBytes(c.wire, c.topk, n)
                                                            : n * wire::ValueBytes(c.wire));
  std::vector<unsigned char> frame(frame_bytes);
  std::vector<uint32_t> scratch;
  auto encode = [&] {
    if (c.topk > 0) {
      for (int64_t i = 0; i < n; ++i) residual[static_cast<size_t>(i)] += g[static_cast<size_t>(i)];
      wire::EncodeTopK(c.wire, c.topk, residual.data(), n, frame.data(), &scratch);
    } else {
      wire::EncodeValues(c.wire, g.data(), n, frame.data());
    }
  };
  auto decode = [&] {
    if (c.topk > 0) {
      if (!wire::DecodeTopK(c.wire, c.topk, frame.data(), frame.size(), n, back.data()).ok()) std::abort();
    } else {
      wire::DecodeValues(c.wire, frame.data(), n, back.data());
    }
  };
  encode();  // warm-up: pages touched, scratch sized
  decode();
  double copy_s = 0, encode_s = 0, decode_s = 0;
  for (auto _ : state) {
    const auto t0 = SteadyClock::now();
    std::memcpy(copy.data(), g.data(), elems * sizeof(float));
    benchmark::ClobberMemory();
    const auto t1 = SteadyClock::now();
    encode();
    benchmark::ClobberMemory();
    const auto t2 = SteadyClock::now();
    decode();
    benchmark::ClobberMemory();
    const auto t3 = SteadyClock::now();
    copy_s += std::chrono::duration<double>(t1 - t0).count();
    encode_s += std::chrono::duration<double>(t2 - t1).count();
    decode_s += std::chrono::duration<double>(t3 - t2).count();
  }
  const double bytes = 4.0 * static_cast<double>(elems) * static_cast<double>(state.iterations());
  state.counters["memcpy_bytes_per_second"] = benchmark::Counter(bytes / copy_s);
  state.counters["encode_bytes_per_second"] = benchmark::Counter(bytes / encode_s);
  state.counters["decode_bytes_per_second"] = benchmark::Counter(bytes / decode_s);
  state.counters["encode_vs_memcpy"] = copy_s / encode_s;
  state.counters["decode_vs_memcpy"] = copy_s / decode_s;
  state.counters["encode_ns_per_elem"] =
      encode_s * 1e9 / (static_cast<double>(elems) * static_cast<double>(state.iterations()));
  state.counters["decode_ns_per_elem"] =
      decode_s * 1e9 / (static_cast<double>(elems) * static_cast<double>(state.iterations()));
  state.counters["wire_bytes"] = static_cast<double>(frame_bytes);
}

// A dense push+pull through Ferry of an async SGD table of `size` bytes of float32 in wire format
// `c` (1 server, 1 worker, tcp loopback). Counters: `ms_per_call`; `wire_bytes_per_call`, every
// frame the client sent and received per call (ClientStats); `bytes_per_second`, float32 payload
// (2 x size per call, as ps/pushpull) per second.
void BM_WirePushPull(benchmark::State& state, WireCase c, Size size) {
  const int64_t elems = size.bytes / static_cast<int64_t>(sizeof(float));
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> grad(static_cast<size_t>(elems)), out(static_cast<size_t>(elems));
  for (auto& x : grad) x = normal(rng);
  OneWorker w(1);
  Status st = w.status;
  TableSpec spec = DenseSpec(elems);
  spec.wire = c.wire;
  spec.topk_ratio = c.topk;
  if (st.ok()) st = w.client->Declare(spec);
  const DenseIn in{kDenseTable, grad};
  const DenseOut o{kDenseTable, out};
  int64_t step = 0;
  auto call = [&] { return w.client->PushPullDense(std::span(&in, 1), std::span(&o, 1), step++).wait(kWaitTimeout); };
  for (int i = 0; st.ok() && i < WarmupCalls(size); ++i) st = call();
  if (!st.ok()) Fail(state, st);
  const ClientStats before = st.ok() ? w.client->stats() : ClientStats();
  LoopTimer timer;
  int64_t calls = 0;
  for (auto _ : state) {
    timer.IterationStart();
    if (Status s = call(); !s.ok()) {
      Fail(state, s);
      break;
    }
    timer.IterationEnd();
    ++calls;
  }
  timer.Finish();
  if (state.error_occurred() || calls == 0) return;
  const ClientStats after = w.client->stats();
  const double wire =
      static_cast<double>((after.bytes_sent - before.bytes_sent) + (after.bytes_received - before.bytes_received));
  state.counters["ms_per_call"] = timer.seconds() * 1e3 / static_cast<double>(calls);
  state.counters["wire_bytes_per_call"] = wire / static_cast<double>(calls);
  state.counters["bytes_per_second"] =
      benchmark::Counter(PayloadBytes(DenseOp::kPushPull, size.bytes) * static_cast<double>(calls) / timer.seconds());
}

// ---- memory bandwidth and optimizers -----------------------------------------------------------

void BM_Triad(benchmark::State& state, Baselines& baselines) {
  std::vector<float> a(kMemElems, 0.0f), b(kMemElems, 1.0f), c(kMemElems, 2.0f);
  Triad(a.data(), b.data(), c.data(), 0.5f, kMemElems);  // warm-up
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    Triad(a.data(), b.data(), c.data(), 0.5f, kMemElems);
    benchmark::ClobberMemory();
    timer.IterationEnd();
  }
  const double bytes = 12.0 * static_cast<double>(kMemElems) * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  baselines.AddStream(bytes / timer.seconds());
}

// One read of every float, OR-ing their bits: the read-bandwidth limit of a check over a gradient.
[[gnu::noinline]] uint32_t ReadOr(const float* p, size_t n) {
  uint32_t acc = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof bits);
    acc |= bits;
  }
  return acc;
}

// The server's NaN/Inf check of a pushed gradient (ps::FirstNonFinite, all finite: the common
// case) against one plain read of the same floats, on `elems` floats (16M: from memory; 1M: a
// default 4 MiB chunk, largely from cache). Counters: bytes_per_second (4 per float), vs_read.
void BM_NonFiniteCheck(benchmark::State& state, size_t elems) {
  std::vector<float> g(elems);
  for (size_t i = 0; i < elems; ++i) g[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
  double check_s = 0, read_s = 0;
  for (auto _ : state) {
    const auto t0 = SteadyClock::now();
    benchmark::DoNotOptimize(ReadOr(g.data(), elems));
    const auto t1 = SteadyClock::now();
    benchmark::DoNotOptimize(ps::FirstNonFinite(g));
    const auto t2 = SteadyClock::now();
    read_s += std::chrono::duration<double>(t1 - t0).count();
    check_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double bytes = 4.0 * static_cast<double>(elems) * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(bytes / check_s);
  state.counters["read_bytes_per_second"] = benchmark::Counter(bytes / read_s);
  state.counters["vs_read"] = read_s / check_s;
}

void BM_Axpy(benchmark::State& state, Baselines& baselines) {
  std::vector<float> y(kMemElems, 0.0f), x(kMemElems, 1.0f);
  Axpy(y.data(), x.data(), 1e-3f, kMemElems);  // warm-up
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    Axpy(y.data(), x.data(), 1e-3f, kMemElems);
    benchmark::ClobberMemory();
    timer.IterationEnd();
  }
  const double bytes = 12.0 * static_cast<double>(kMemElems) * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  baselines.AddAxpy(bytes / timer.seconds());
}

// First touch of fresh memory: a 64 MiB allocation (above glibc's largest mmap threshold, so fresh
// pages from the kernel every time) written once per page, then freed. Every freshly allocated
// message buffer pays this per page. Counters: `us_per_page`, `faults_per_call`.
void BM_FirstTouch(benchmark::State& state) {
  constexpr size_t kBytes = size_t{64} << 20;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    auto buffer = std::make_unique_for_overwrite<std::byte[]>(kBytes);
    for (size_t i = 0; i < kBytes; i += page) buffer[i] = std::byte{1};
    benchmark::DoNotOptimize(buffer.get());
    benchmark::ClobberMemory();
    timer.IterationEnd();
  }
  timer.Finish();
  const double iterations = static_cast<double>(state.iterations());
  state.counters["us_per_page"] = timer.seconds() * 1e6 / (iterations * static_cast<double>(kBytes / page));
  state.counters["faults_per_call"] = timer.faults() / iterations;
}

// What a dense push+pull of `bytes` does beside the transport, step by step on one thread, each
// timed apart in every iteration (ms per call): the server's NaN/Inf check of the gradient, its
// SGD update, the reply (a fresh message frame per chunk, ChunkElems, and the values copied
// into it, as the server's pull path does), and the client's copy of the reply into the caller's
// buffer. Their sum against ps_proc/pushpull less raw_proc (bench/results/HISTORY.md, "Where a
// 16 MiB push+pull spends its time") says how much of Ferry's time beyond the transport these
// steps are.
void BM_DenseSteps(benchmark::State& state, int64_t bytes) {
  const size_t elems = static_cast<size_t>(bytes) / sizeof(float);
  const size_t chunk = static_cast<size_t>(ChunkElems(static_cast<int64_t>(elems)));
  OptimizerSpec opt;
  opt.type = OptimizerType::kSgd;
  opt.learning_rate = 0.01f;
  std::vector<float> params(elems, 0.5f), grad(elems, 1e-3f), out(elems, 0.0f);
  double check_s = 0, update_s = 0, reply_s = 0, copy_s = 0, by_chunk_s = 0, one_pass_s = 0;
  int64_t update = 1;
  // As the server does it, a message (one chunk) at a time: the chunk's update, then its reply
  // frame filled from the values the update left in cache (by_chunk); and the same with the
  // update and the copy fused, 4096 floats at a time (one_pass: what a server that fills the
  // reply in the update's own pass would do).
  std::vector<float> chunked(elems, 0.5f), fused(elems, 0.5f);
  constexpr size_t kBlock = 4096;
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    const auto t0 = SteadyClock::now();
    benchmark::DoNotOptimize(ps::FirstNonFinite(grad));
    const auto t1 = SteadyClock::now();
    ps::ApplyUpdate(opt, params.data(), grad.data(), nullptr, elems, elems, update++);
    benchmark::ClobberMemory();
    const auto t2 = SteadyClock::now();
    std::vector<zmq::message_t> frames;
    for (size_t at = 0; at < elems; at += chunk) {
      const size_t n = std::min(chunk, elems - at);
      frames.emplace_back(n * sizeof(float));
      std::memcpy(frames.back().data(), params.data() + at, n * sizeof(float));
    }
    const auto t3 = SteadyClock::now();
    size_t at = 0;
    for (const zmq::message_t& f : frames) {
      std::memcpy(out.data() + at, f.data(), f.size());
      at += f.size() / sizeof(float);
    }
    benchmark::ClobberMemory();
    const auto t4 = SteadyClock::now();
    frames.clear();
    const auto t5 = SteadyClock::now();
    for (size_t at = 0; at < elems; at += chunk) {
      const size_t n = std::min(chunk, elems - at);
      ps::ApplyUpdate(opt, chunked.data() + at, grad.data() + at, nullptr, n, n, update - 1);
      frames.emplace_back(n * sizeof(float));
      std::memcpy(frames.back().data(), chunked.data() + at, n * sizeof(float));
    }
    benchmark::ClobberMemory();
    const auto t6 = SteadyClock::now();
    frames.clear();
    for (size_t at = 0; at < elems; at += chunk) {
      const size_t n = std::min(chunk, elems - at);
      frames.emplace_back(n * sizeof(float));
      auto* reply = static_cast<float*>(frames.back().data());
      for (size_t b = 0; b < n; b += kBlock) {
        const size_t m = std::min(kBlock, n - b);
        ps::ApplyUpdate(opt, fused.data() + at + b, grad.data() + at + b, nullptr, m, n, update - 1);
        std::memcpy(reply + b, fused.data() + at + b, m * sizeof(float));
      }
    }
    benchmark::ClobberMemory();
    const auto t7 = SteadyClock::now();
    frames.clear();
    timer.IterationEnd();
    check_s += std::chrono::duration<double>(t1 - t0).count();
    update_s += std::chrono::duration<double>(t2 - t1).count();
    reply_s += std::chrono::duration<double>(t3 - t2).count();
    copy_s += std::chrono::duration<double>(t4 - t3).count();
    by_chunk_s += std::chrono::duration<double>(t6 - t5).count();
    one_pass_s += std::chrono::duration<double>(t7 - t6).count();
  }
  timer.Finish();
  const double n = static_cast<double>(state.iterations());
  state.counters["check_ms"] = 1e3 * check_s / n;
  state.counters["update_ms"] = 1e3 * update_s / n;
  state.counters["reply_ms"] = 1e3 * reply_s / n;
  state.counters["client_copy_ms"] = 1e3 * copy_s / n;
  state.counters["by_chunk_ms"] = 1e3 * by_chunk_s / n;  // update, then reply, a chunk at a time
  state.counters["one_pass_ms"] = 1e3 * one_pass_s / n;  // the same in one pass
  state.counters["faults_per_call"] = timer.faults() / n;
}

#ifdef FERRY_BENCH_SODIUM
// CURVE's crypto alone, on one core: what libzmq does to every message of a CURVE connection
// (crypto_box_afternm with the connection's precomputed key, into a fresh buffer on the sending
// side; crypto_box_open_afternm on the receiving side). The payload rate of one seal + open is
// the ceiling of one direction of a CURVE connection per core; a round trip does it twice.
void BM_BoxSealOpen(benchmark::State& state, int64_t bytes) {
  if (sodium_init() < 0) return state.SkipWithError("sodium_init failed");
  unsigned char pk[crypto_box_PUBLICKEYBYTES], sk[crypto_box_SECRETKEYBYTES], k[crypto_box_BEFORENMBYTES];
  unsigned char nonce[crypto_box_NONCEBYTES] = {};
  crypto_box_keypair(pk, sk);
  if (crypto_box_beforenm(k, pk, sk) != 0) return state.SkipWithError("crypto_box_beforenm failed");
  std::vector<unsigned char> plain(static_cast<size_t>(bytes), 1), back(static_cast<size_t>(bytes));
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    std::vector<unsigned char> boxed(plain.size() + crypto_box_MACBYTES);  // fresh, as libzmq's is
    crypto_box_easy_afternm(boxed.data(), plain.data(), plain.size(), nonce, k);
    if (crypto_box_open_easy_afternm(back.data(), boxed.data(), boxed.size(), nonce, k) != 0) {
      return state.SkipWithError("crypto_box_open_easy_afternm failed");
    }
    benchmark::DoNotOptimize(back.data());
    timer.IterationEnd();
  }
  timer.Finish();
  state.counters["bytes_per_second"] = benchmark::Counter(
      static_cast<double>(bytes) * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
#endif

// Bytes of memory traffic per element of one update: each array read once and each written array
// written once (p and g read, p written = 12; every state slot adds a read and a write = 8).
double UpdateBytesPerElem(OptimizerType type) { return 12.0 + 8.0 * ps::StateSlots(type); }

// ps::ApplyUpdate over one 16M-element chunk on one thread, as the server applies a dense push.
// Counters: `bytes_per_second` of memory traffic (UpdateBytesPerElem), `vs_stream` (over the
// triad), `vs_axpy` (over the in-place axpy, the same access pattern as sgd).
void BM_Optimizer(benchmark::State& state, Baselines& baselines, OptimizerType type) {
  // Before the arrays below take memory (no-ops when mem/ ran already).
  const double stream = baselines.StreamRate();
  const double axpy = baselines.AxpyRate();
  OptimizerSpec opt;
  opt.type = type;
  std::vector<float> params(kMemElems, 0.5f), grad(kMemElems, 1e-3f);
  std::vector<float> state_slots(kMemElems * static_cast<size_t>(ps::StateSlots(type)));
  ps::InitState(opt, state_slots.data(), kMemElems);
  int64_t update = 1;
  ps::ApplyUpdate(opt, params.data(), grad.data(), state_slots.data(), kMemElems, kMemElems, update++);  // warm-up
  LoopTimer timer;
  for (auto _ : state) {
    timer.IterationStart();
    ps::ApplyUpdate(opt, params.data(), grad.data(), state_slots.data(), kMemElems, kMemElems, update++);
    benchmark::ClobberMemory();
    timer.IterationEnd();
  }
  const double bytes =
      UpdateBytesPerElem(type) * static_cast<double>(kMemElems) * static_cast<double>(state.iterations());
  state.counters["bytes_per_second"] = benchmark::Counter(bytes, benchmark::Counter::kIsRate);
  state.counters["vs_stream"] = bytes / timer.seconds() / stream;
  state.counters["vs_axpy"] = bytes / timer.seconds() / axpy;
}

// ---- registration ------------------------------------------------------------------------------

// Everything the registered benchmarks refer to; lives until the run is over.
struct Fixtures {
  Baselines baselines;
  LazyZipf zipf;
  LazyCriteo criteo;
  std::vector<std::unique_ptr<SharedRun>> runs;
};

void RegisterAll(Fixtures& f) {
  const Net nets[] = {Net::kTcp, Net::kIpc};
  // 1. raw ZeroMQ round trips (the baselines of 2.)
  std::vector<RawCase> raw_cases;
  for (Net net : nets) {
    for (const Size& size : kSizes) raw_cases.push_back(OneFrame(net, size));
  }
  for (Net net : nets) {
    for (const Size& size : kSizes) raw_cases.push_back(Chunked(net, size));
  }
  raw_cases.push_back(SmallFrames());
  raw_cases.push_back(SmallPacked());
  for (const Size& size : kProcessSizes) raw_cases.push_back(OneFrameProcess(size));
  for (RawShape shape : {RawShape::kUp, RawShape::kDown}) {
    for (const Size& size : kProcessSizes) raw_cases.push_back(OneWayProcess(size, shape));
  }
  for (const Size& size : kCurveSizes) raw_cases.push_back(OneFrame(Net::kTcpCurve, size));
  for (const Size& size : kCurveSizes) raw_cases.push_back(Chunked(Net::kTcpCurve, size));
  for (const RawCase& c : raw_cases) {
    benchmark::RegisterBenchmark(c.name.c_str(), [&f, c](benchmark::State& st) { BM_Raw(st, f.baselines, c); })
        ->Iterations(c.iterations)
        ->UseRealTime()
        ->Unit(UnitFor(c.bytes));
  }
  // 2. dense push / pull / push+pull: 1 server + 1 worker, 2 servers + 2 workers
  for (DenseOp op : {DenseOp::kPush, DenseOp::kPull, DenseOp::kPushPull}) {
    for (Net net : nets) {
      for (const Size& size : kSizes) {
        for (int workers : {1, 2}) {
          SharedRun* run = f.runs.emplace_back(std::make_unique<SharedRun>(workers)).get();
          const std::string name = "ps/" + OpName(op) + "/" + NetName(net) + "/" + size.name + "/" +
                                   std::to_string(workers) + "s" + std::to_string(workers) + "w";
          benchmark::RegisterBenchmark(name.c_str(),
                                       [&f, run, op, net, size](benchmark::State& st) {
                                         BM_PsDense(st, f.baselines, *run, op, net, size);
                                       })
              ->Threads(workers)
              ->Iterations(size.iterations)
              ->UseRealTime()
              ->Unit(UnitFor(size.bytes));
        }
      }
    }
  }
  // 2a. the same against a ferry-ps process, as users run it (1 server, 1 worker, tcp), against
  // raw round trips to another process (raw_proc/)
  for (DenseOp op : {DenseOp::kPush, DenseOp::kPull, DenseOp::kPushPull}) {
    for (const Size& size : kProcessSizes) {
      SharedRun* run = f.runs.emplace_back(std::make_unique<SharedRun>(1)).get();
      const std::string name = "ps_proc/" + OpName(op) + "/tcp/" + size.name + "/1s1w";
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&f, run, op, size](benchmark::State& st) {
                                     BM_PsDense(st, f.baselines, *run, op, Net::kTcp, size, /*processes=*/true);
                                   })
          ->Iterations(size.iterations)
          ->UseRealTime()
          ->Unit(UnitFor(size.bytes));
    }
  }
  // 2a+. the same, paired call by call with raw ZeroMQ moving the same bytes (BM_PsPaired)
  for (DenseOp op : {DenseOp::kPush, DenseOp::kPull, DenseOp::kPushPull}) {
    for (const Size& size : kProcessSizes) {
      for (bool view : {false, true}) {
        if (view && op == DenseOp::kPush) continue;
        const std::string name = "ps_paired/" + OpName(op) + (view ? "_view" : "") + "/tcp/" + size.name + "/1s1w";
        // Five times ps_proc/'s calls: the pairs' median needs many.
        benchmark::RegisterBenchmark(name.c_str(),
                                     [op, size, view](benchmark::State& st) { BM_PsPaired(st, op, size, view); })
            ->Iterations(5 * size.iterations)
            ->UseRealTime()
            ->Unit(UnitFor(size.bytes));
      }
    }
  }
  // 2a'. the same pulls and push+pulls into a new output vector each call, as a user's program
  // often writes them (issue 34: what the allocator's settings do to it)
  for (DenseOp op : {DenseOp::kPull, DenseOp::kPushPull}) {
    for (const Size& size : {kSizes[1], kSizes[2]}) {
      SharedRun* run = f.runs.emplace_back(std::make_unique<SharedRun>(1)).get();
      const std::string name = "ps_proc/" + OpName(op) + "_fresh_out/tcp/" + size.name + "/1s1w";
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&f, run, op, size](benchmark::State& st) {
                                     BM_PsDense(st, f.baselines, *run, op, Net::kTcp, size, /*processes=*/true,
                                                /*fresh_out=*/true);
                                   })
          ->Iterations(size.iterations)
          ->UseRealTime()
          ->Unit(UnitFor(size.bytes));
    }
  }
  // 2b. what CURVE costs: push+pull over tcp with CURVE (compare ps/pushpull/tcp/ of the same size)
  for (const Size& size : kCurveSizes) {
    for (int workers : {1, 2}) {
      SharedRun* run = f.runs.emplace_back(std::make_unique<SharedRun>(workers)).get();
      const std::string name = "ps/pushpull/tcp_curve/" + std::string(size.name) + "/" + std::to_string(workers) + "s" +
                               std::to_string(workers) + "w";
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&f, run, size](benchmark::State& st) {
                                     BM_PsDense(st, f.baselines, *run, DenseOp::kPushPull, Net::kTcpCurve, size);
                                   })
          ->Threads(workers)
          ->Iterations(size.iterations)
          ->UseRealTime()
          ->Unit(UnitFor(size.bytes));
    }
  }
  // 3. many small tensors
  for (int servers : {1, 2}) {
    for (SmallMode mode : {SmallMode::kOneCall, SmallMode::kEachCall, SmallMode::kEachAsync}) {
      const std::string name = "small/" + SmallModeName(mode) + "/" + std::to_string(servers) + "s1w";
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&f, mode, servers](benchmark::State& st) {
                                     BM_SmallTensors(st, f.baselines, mode, servers);
                                   })
          ->Iterations(mode == SmallMode::kOneCall ? 1000 : 50)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
  // 4. sparse pull / push
  for (bool push : {false, true}) {
    for (int64_t dim : {16, 64}) {
      const std::string name = std::string("sparse/") + (push ? "push" : "pull") + "/dim" + std::to_string(dim);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [&f, push, dim](benchmark::State& st) { BM_Sparse(st, f.zipf, push, dim); })
          ->Iterations(40)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  // 4b. a Criteo-shaped step: 26 tables in one message per server, or one request per table
  for (bool push : {false, true}) {
    for (int servers : {1, 2}) {
      for (StepPath path : {StepPath::kOneMessage, StepPath::kTogether, StepPath::kPerTable}) {
        const std::string name = std::string("criteo_step/") + (push ? "push" : "pull") + "/" + StepPathName(path) +
                                 "/" + std::to_string(servers) + "s1w";
        benchmark::RegisterBenchmark(name.c_str(), [&f, push, path, servers](benchmark::State& st) {
          BM_CriteoStep(st, f.criteo, push, path, servers);
        })
            ->Iterations(80)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  for (OptimizerType type : {OptimizerType::kSgd, OptimizerType::kAdagrad, OptimizerType::kAdam}) {
    for (int64_t rows : {1'000'000, 1'500'000, 2'000'000, 3'000'000}) {
      benchmark::RegisterBenchmark(
          ("mem/sparse_row/" + std::string(OptimizerName(type)) + "/" + std::to_string(rows)).c_str(),
          [type, rows](benchmark::State& st) { BM_RowMemory(st, type, rows); })
          ->Iterations(1)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RegisterBenchmark("sparse/hot_ids_sketch", [&f](benchmark::State& st) { BM_HotIds(st, f.zipf); })
      ->Iterations(400)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  // 5. memory bandwidth, then the optimizers against it
  benchmark::RegisterBenchmark("mem/triad", [&f](benchmark::State& st) { BM_Triad(st, f.baselines); })
      ->Iterations(kMemIterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("mem/axpy", [&f](benchmark::State& st) { BM_Axpy(st, f.baselines); })
      ->Iterations(kMemIterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (size_t elems : {size_t{1} << 20, kMemElems}) {
    benchmark::RegisterBenchmark(("mem/nonfinite_check/" + std::to_string(elems >> 20) + "M").c_str(),
                                 [elems](benchmark::State& st) { BM_NonFiniteCheck(st, elems); })
        ->Iterations(kMemIterations)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
#ifdef FERRY_BENCH_SODIUM
  for (const Size& size : kCurveSizes) {
    benchmark::RegisterBenchmark(("crypto/box_seal_open/" + std::string(size.name)).c_str(),
                                 [bytes = size.bytes](benchmark::State& st) { BM_BoxSealOpen(st, bytes); })
        ->Iterations(size.iterations)
        ->UseRealTime()
        ->Unit(UnitFor(size.bytes));
  }
#endif
  benchmark::RegisterBenchmark("mem/first_touch_64MiB", BM_FirstTouch)
      ->Iterations(3)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (const OptimizerInfo& info : kOptimizers) {  // every optimizer of the catalogue
    const OptimizerType type = info.type;
    benchmark::RegisterBenchmark(("opt/" + std::string(info.name)).c_str(),
                                 [&f, type](benchmark::State& st) { BM_Optimizer(st, f.baselines, type); })
        ->Iterations(kMemIterations)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("steps/pushpull/16MiB",
                               [](benchmark::State& st) { BM_DenseSteps(st, int64_t{16} << 20); })
      ->Iterations(20)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("steps/pushpull/1MiB", [](benchmark::State& st) { BM_DenseSteps(st, int64_t{1} << 20); })
      ->Iterations(300)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  // 6. gradient compression: the codecs beside memcpy, then push+pull per wire format
  for (size_t elems : {size_t{1} << 20, size_t{16} << 20}) {
    for (const WireCase& c : kWireCases) {
      if (c.wire == WireFormat::kF32 && c.topk == 0.0f) continue;  // memcpy is the baseline in each case
      benchmark::RegisterBenchmark(("codec/" + std::string(c.name) + "/" + std::to_string(elems >> 20) + "M").c_str(),
                                   [c, elems](benchmark::State& st) { BM_Codec(st, c, elems); })
          ->Iterations(elems > (size_t{1} << 20) ? 10 : 100)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const Size& size : kCurveSizes) {  // 1 MiB and 16 MiB
    for (const WireCase& c : kWireCases) {
      if (c.topk == 0.1f || c.topk == 0.001f) continue;
      benchmark::RegisterBenchmark(("wire/pushpull/tcp/" + std::string(size.name) + "/" + c.name).c_str(),
                                   [c, size](benchmark::State& st) { BM_WirePushPull(st, c, size); })
          ->Iterations(size.iterations)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

// ferry-bench --echo-process: the raw baselines' echo server as a process of its own (raw_proc/),
// on tcp loopback; prints its endpoint, then echoes until it is signalled to stop.
int EchoProcessMain() {
  auto server = EchoServer::Start(Net::kTcp);
  if (!server.ok()) {
    std::fprintf(stderr, "echo process: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("ferry-bench echo listening on %s\n", (*server)->endpoint().c_str());
  std::fflush(stdout);
  for (;;) ::pause();  // SIGTERM ends it
}

}  // namespace
}  // namespace ferry::bench

int main(int argc, char** argv) {
  // The servers and clients measured here live in this process, and the raw baselines' sockets
  // too: they get the allocator settings Ferry's libraries give a process (FERRY_MALLOC_TUNING=off:
  // none, as a program without Ferry's client had before the libraries applied them).
  ferry::transport::TuneAllocatorForLargeMessages();
  if (argc == 2 && std::string_view(argv[1]) == "--echo-process") return ferry::bench::EchoProcessMain();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ferry::bench::Fixtures fixtures;
  ferry::bench::RegisterAll(fixtures);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
