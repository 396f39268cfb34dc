// ps/server/internal/peer_load.h — how many requests each connection (ZeroMQ routing id) has
// waiting on this server, so that one peer cannot fill the held-request room for everyone
// (ServerOptions::max_held_per_peer). A held request carries a Token; the count goes down when
// the request goes, however it goes (answered, expired, failed, forgotten), because the Token
// goes with it.
//
// Thread-safety: none; the server's I/O thread owns it and every Request holding a Token. The
// PeerLoad must outlive every Token (declare it before what holds requests).
#pragma once

#include <cstddef>
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
    Token(Token&& o) noexcept : load_(std::exchange(o.load_, nullptr)), peer_(std::move(o.peer_)) {}
    Token& operator=(Token&& o) noexcept {
      if (this != &o) {
        Reset();
        load_ = std::exchange(o.load_, nullptr);
        peer_ = std::move(o.peer_);
      }
      return *this;
    }
    ~Token() { Reset(); }

   private:
    friend class PeerLoad;
    Token(PeerLoad* load, std::string peer) : load_(load), peer_(std::move(peer)) {}
    void Reset() {
      if (load_ != nullptr) load_->Release(peer_);
      load_ = nullptr;
    }
    PeerLoad* load_ = nullptr;
    std::string peer_;
  };

  // Requests `peer` has waiting.
  size_t held(std::string_view peer) const {
    auto it = held_.find(std::string(peer));  // a routing id: 5 bytes, no allocation
    return it == held_.end() ? 0 : it->second;
  }
  // Counts one more waiting request of `peer` until the returned Token is destroyed.
  Token Acquire(std::string_view peer) {
    std::string key(peer);
    ++held_[key];
    return Token(this, std::move(key));
  }
  // Peers with something waiting.
  size_t peers() const { return held_.size(); }

 private:
  void Release(const std::string& peer) {
    auto it = held_.find(peer);
    if (it != held_.end() && --it->second == 0) held_.erase(it);
  }

  absl::flat_hash_map<std::string, size_t> held_;
};

}  // namespace ferry::ps
