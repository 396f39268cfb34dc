// tests/support/old_server.h — a server of an older protocol minor, for the tests of what a
// client sends one: a bare ROUTER on an inproc endpoint of `context`, on a thread of its own, that
// answers every verified request but heartbeats with a reply header of major 1 and the given minor
// (request id and kind echoed), after letting the test's `answer` shape the reply (its kind,
// counters, payload frames). It counts the kinds it received.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "ferry/client.h"
#include "ferry/context.h"
#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"

namespace ferry::test {

class OldServer {
 public:
  // Shapes the reply to `h` (whose payload frames are in[2...]): sets the header's kind and more
  // through `reply`, and appends payload frames to `out` (which already holds the routing id; the
  // header goes in before them). Default: an empty Reply.
  using Answer = std::function<void(const wire::Header& h, transport::Frames& in, wire::HeaderBuilder& reply,
                                    transport::Frames& payload)>;

  OldServer(const std::shared_ptr<Context>& context, std::string endpoint, int minor, Answer answer = {})
      : context_(context), endpoint_(std::move(endpoint)) {
    auto router = transport::MakeSocket(transport::Zmq(*context), zmq::socket_type::router);
    EXPECT_TRUE(router.ok()) << router.status();
    if (!router.ok()) return;
    router_ = std::move(router).value();
    router_.bind(endpoint_);
    thread_ = std::thread([this, minor, answer = std::move(answer)] {
      while (!stop_.load()) {
        zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
        if (zmq::poll(&item, 1, std::chrono::milliseconds(20)) == 0) continue;
        transport::Frames in;
        if (!transport::Recv(router_, &in).ok() || in.size() < 2) continue;
        const wire::Header* h = nullptr;
        if (!wire::VerifyHeader(in[1], &h).ok()) continue;
        if (h->kind() == wire::Kind::Heartbeat) continue;
        ++kinds_[h->kind()];
        flatbuffers::FlatBufferBuilder fbb;
        wire::HeaderBuilder b(fbb);
        b.add_major(1);
        b.add_minor(minor);
        b.add_request_id(h->request_id());
        b.add_request_kind(h->kind());
        transport::Frames payload;
        if (answer) {
          answer(*h, in, b, payload);
        } else {
          b.add_kind(wire::Kind::Reply);
        }
        wire::FinishHeaderBuffer(fbb, b.Finish());
        transport::Frames out;
        out.push_back(std::move(in[0]));
        out.push_back(wire::ToFrame(fbb));
        for (auto& f : payload) out.push_back(std::move(f));
        transport::Send(router_, out).IgnoreError();
      }
    });
  }
  ~OldServer() { Stop(); }
  OldServer(const OldServer&) = delete;
  OldServer& operator=(const OldServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // A client of worker 0 of 1 connected to it, with 5 s timeouts.
  StatusOr<std::unique_ptr<Client>> Connect() const {
    ClientOptions o;
    o.servers = {endpoint_};
    o.context = context_;
    o.connect_timeout = std::chrono::seconds(5);
    o.request_timeout = std::chrono::seconds(5);
    return Client::Connect(std::move(o));
  }

  // Stops its thread; kinds() may be read after.
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  // How many requests of each kind it received (after Stop()).
  std::map<wire::Kind, int>& kinds() { return kinds_; }

 private:
  std::shared_ptr<Context> context_;
  std::string endpoint_;
  zmq::socket_t router_;
  std::atomic<bool> stop_{false};
  std::map<wire::Kind, int> kinds_;  // its thread's until Stop()
  std::thread thread_;
};

}  // namespace ferry::test
