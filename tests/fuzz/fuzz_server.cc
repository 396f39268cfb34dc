// Fuzz target: a whole Ferry server in this process, fed one multipart message per input over a
// real ZeroMQ socket (inproc), after a client declared the tables of fuzz_tables.h. After each
// input a Stats request must be answered within 10 s: the server neither crashed (ASan, UBSan)
// nor stopped serving. Held pulls and collectives expire after 20 ms, checkpoints go to a fresh
// folder, so state stays bounded over millions of inputs.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <zmq.hpp>

#include "ferry/client.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "ferry/server.h"
#include "fuzz_input.h"
#include "fuzz_tables.h"

namespace {

using namespace std::chrono_literals;

struct World {
  std::shared_ptr<ferry::Context> context;
  std::unique_ptr<ferry::Server> server;
  std::unique_ptr<ferry::Client> client;
  zmq::socket_t raw;
  std::string checkpoints;
  uint64_t next_id = 1ull << 62;  // Stats probes; fuzzed requests rarely pick ids this high
};

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "fuzz_server: %s\n", what.c_str());
  std::abort();
}

World* Setup() {
  auto* w = new World;
  char tmpl[] = "/tmp/ferry-fuzz-ckpt-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) Die("mkdtemp failed");
  w->checkpoints = tmpl;
  w->context = ferry::Context::Create(1);
  ferry::ServerOptions so;
  so.bind = "inproc://ferry-fuzz-server";
  so.context = w->context;
  so.compute_threads = 1;
  so.num_workers = ferry::fuzz::kWorkers;
  so.max_wait = 20ms;
  so.worker_timeout = 0ms;
  so.max_message_bytes = 16 << 20;
  so.checkpoint_dir = w->checkpoints;
  so.keep_checkpoints = 1;
  auto server = ferry::Server::Start(so);
  if (!server.ok()) Die(server.status().ToString());
  w->server = std::move(*server);
  ferry::ClientOptions co;
  co.servers = {w->server->endpoint()};
  co.context = w->context;
  co.rank = 0;
  co.num_workers = ferry::fuzz::kWorkers;
  co.heartbeat_timeout = 0ms;
  co.request_timeout = 10s;
  auto client = ferry::Client::Connect(co);
  if (!client.ok()) Die(client.status().ToString());
  w->client = std::move(*client);
  for (const auto& spec : ferry::fuzz::FuzzTables()) {
    if (auto s = w->client->Declare(spec); !s.ok()) Die(s.ToString());
  }
  auto raw = ferry::transport::MakeSocket(ferry::transport::Zmq(*w->context), zmq::socket_type::dealer);
  if (!raw.ok()) Die(raw.status().ToString());
  w->raw = std::move(*raw);
  w->raw.set(zmq::sockopt::rcvtimeo, 10000);
  w->raw.connect(w->server->endpoint());
  return w;
}

// Built once, on the first input, and never destroyed; at exit the server is stopped and its
// checkpoint folder removed.
World& TheWorld() {
  static World* w = [] {
    World* made = Setup();
    std::atexit([] {
      // The server first: a checkpoint it is still writing would race the removal.
      TheWorld().server->Stop();
      std::error_code ec;
      std::filesystem::remove_all(TheWorld().checkpoints, ec);
    });
    return made;
  }();
  return *w;
}

// A Stats request; waits for its reply, dropping the replies to fuzzed requests before it.
void Probe(World& w) {
  const uint64_t id = w.next_id++;
  flatbuffers::FlatBufferBuilder fbb(64);
  ferry::wire::HeaderBuilder b(fbb);
  b.add_major(ferry::wire::kMajor);
  b.add_minor(ferry::wire::kMinor);
  b.add_kind(ferry::wire::Kind::Stats);
  b.add_request_id(id);
  b.add_rank(0);
  ferry::wire::FinishHeaderBuffer(fbb, b.Finish());
  ferry::transport::Frames out;
  out.push_back(ferry::wire::ToFrame(fbb));
  if (!ferry::transport::Send(w.raw, out).ok()) Die("cannot send the Stats probe");
  for (;;) {
    ferry::transport::Frames reply;
    if (auto s = ferry::transport::Recv(w.raw, &reply); !s.ok())
      Die("the server did not answer Stats: " + s.ToString());
    const ferry::wire::Header* h = nullptr;
    if (reply.empty() || !ferry::wire::VerifyHeader(reply[0], &h).ok())
      Die("the server sent a reply that does not verify");
    if (h->request_id() == id) return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = TheWorld();
  const auto frames = ferry::fuzz::SplitFrames(data, size);
  if (frames.empty()) return 0;
  ferry::transport::Frames out;
  for (const auto& f : frames) out.emplace_back(f.data(), f.size());
  if (!ferry::transport::Send(w.raw, out).ok()) Die("cannot send the input");
  Probe(w);
  return 0;
}
