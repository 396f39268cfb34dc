// ferry/messages/placement.h — which server holds what. Both sides compute it; the server
// checks every chunk and id it receives against it, so a client with a different cluster view is
// refused instead of silently writing to the wrong shard.
#pragma once

#include <cstdint>

namespace ferry::placement {

// A strong 64-bit mix (splitmix64 finaliser): stable across processes, builds and platforms.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Dense chunk -> server: a stable hash of the table picks where chunk 0 lives, the following
// chunks go round-robin from there. Stable, and balanced to within one chunk per server (a pure
// per-chunk hash would pile the two chunks of a small table onto one server half the time).
inline int ChunkServer(uint64_t table_id, int64_t chunk, int num_servers) {
  const uint64_t first = Mix64(table_id) % static_cast<uint64_t>(num_servers);
  return static_cast<int>((first + static_cast<uint64_t>(chunk)) % static_cast<uint64_t>(num_servers));
}

// Sparse id -> server: a stable hash of the id (independent of the table, so a row keeps its
// server whatever else is declared).
inline int IdServer(int64_t id, int num_servers) {
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(num_servers));
}

}  // namespace ferry::placement
