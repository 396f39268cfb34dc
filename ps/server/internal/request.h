// ps/server/internal/request.h — one request as the server holds it (from arrival to its reply,
// however long it waits), and read-only views of its payload frames.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "ferry/messages/transport.h"
#include "ferry/messages/wire.h"
#include "internal/memory_budget.h"
#include "internal/peer_load.h"

namespace ferry::ps {

using Clock = std::chrono::steady_clock;

// A received request: routing id, verified header frame, payloads. The header is read through
// h() on every use: ZeroMQ keeps small frames inline, so moving a Request moves the bytes and a
// stored pointer would dangle.
struct Request {
  zmq::message_t routing;
  int fd = -1;  // its connection's descriptor (ZMQ_SRCFD; -1: inproc), see connections.h
  zmq::message_t header_frame;
  bool verified = false;  // header_frame passed wire::VerifyHeader
  const wire::Header* h() const {
    return verified && header_frame.size() > 0 ? wire::GetHeader(header_frame.data()) : nullptr;
  }
  transport::Frames payload;
  Clock::time_point arrived;  // when the server read it
  // When its pull began to wait: its arrival, or, for PushPullDense, the end of its push (whose
  // own work is not waiting). A held pull reports how long it waited from here.
  Clock::time_point wait_from;
  Clock::time_point deadline;
  // It waited (a held pull, a collective, a declaration of a table being built): from wait_from
  // until `released` (a pull: when it could be served; otherwise its reply). The server's own
  // time on it (server_metrics.h) leaves that out.
  bool held = false;
  Clock::time_point released;
  int64_t pull_step = 0;  // the step/clock the (held) pull is for
  bool read_ahead = false;  // its rows on disk were read ahead (it waited for them; disk_reads.cc)
  wire::ReplyInfo info;   // PushPullDense: what its push did, reported with the pull's reply
  PeerLoad::Token held_by_peer;  // while held: counts against its connection's share
  BudgetCharge held_bytes;       // while held: its payload, charged to the held payloads' bound

  std::string_view peer() const { return {routing.data<char>(), routing.size()}; }

  // Microseconds since wait_from.
  int64_t waited_us() const {
    return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - wait_from).count();
  }
};

// The bytes of a request's payload frames.
inline int64_t PayloadBytes(const transport::Frames& payload) {
  int64_t bytes = 0;
  for (const auto& f : payload) bytes += static_cast<int64_t>(f.size());
  return bytes;
}

// A read-only view of a frame as T[], copying only when the frame is not aligned for T.
template <typename T>
std::span<const T> View(const zmq::message_t& frame, std::vector<T>& scratch) {
  const size_t n = frame.size() / sizeof(T);
  if (reinterpret_cast<uintptr_t>(frame.data()) % alignof(T) == 0) {
    return {static_cast<const T*>(frame.data()), n};
  }
  scratch.resize(n);
  std::memcpy(scratch.data(), frame.data(), n * sizeof(T));
  return {scratch.data(), n};
}

}  // namespace ferry::ps
