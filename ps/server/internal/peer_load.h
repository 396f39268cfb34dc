// ps/server/internal/peer_load.h — how many requests each connection (ZeroMQ routing id) has
// waiting on this server, and how many bytes of payload they hold, so that one peer cannot fill
// the held-request room or the held payloads' bound for everyone (ServerOptions::
// max_held_per_peer; ServerImpl::RoomToHold). A held request carries a Token; the counts go down
// when the request goes, however it goes (answered, expired, failed, forgotten), because the
// Token goes with it.
//
// Thread-safety: none; the server's I/O thread owns it and every Request holding a Token. The
// PeerLoad must outlive every Token (declare it before what holds requests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"

namespace ferry::ps {

class PeerLoad {
 public:
  class Token {
   public:
    Token() = default;
    Token(Token&& o) noexcept
        : load_(std::exchange(o.load_, nullptr)), peer_(std::move(o.peer_)), bytes_(std::exchange(o.bytes_, 0)) {}
    Token& operator=(Token&& o) noexcept {
      if (this != &o) {
        Reset();
        load_ = std::exchange(o.load_, nullptr);
        peer_ = std::move(o.peer_);
        bytes_ = std::exchange(o.bytes_, 0);
      }
      return *this;
    }
    ~Token() { Reset(); }

   private:
    friend class PeerLoad;
    Token(PeerLoad* load, std::string peer, int64_t bytes) : load_(load), peer_(std::move(peer)), bytes_(bytes) {}
    void Reset() {
      if (load_ != nullptr) load_->Release(peer_, bytes_);
      load_ = nullptr;
    }
    PeerLoad* load_ = nullptr;
    std::string peer_;
    int64_t bytes_ = 0;
  };

  // Requests `peer` has waiting, and the bytes of payload they hold.
  size_t held(std::string_view peer) const {
    auto it = held_.find(std::string(peer));  // a routing id: 5 bytes, no allocation
    return it == held_.end() ? 0 : it->second.requests;
  }
  int64_t held_bytes(std::string_view peer) const {
    auto it = held_.find(std::string(peer));
    return it == held_.end() ? 0 : it->second.bytes;
  }
  // Counts one more waiting request of `peer`, holding `bytes`, until the returned Token is
  // destroyed.
  Token Acquire(std::string_view peer, int64_t bytes = 0) {
    std::string key(peer);
    Load& l = held_[key];
    ++l.requests;
    l.bytes += bytes;
    return Token(this, std::move(key), bytes);
  }
  // Peers with something waiting.
  size_t peers() const { return held_.size(); }

 private:
  struct Load {
    size_t requests = 0;
    int64_t bytes = 0;
  };
  void Release(const std::string& peer, int64_t bytes) {
    auto it = held_.find(peer);
    if (it == held_.end()) return;
    it->second.bytes -= bytes;
    if (--it->second.requests == 0) held_.erase(it);
  }

  absl::flat_hash_map<std::string, Load> held_;
};

}  // namespace ferry::ps
