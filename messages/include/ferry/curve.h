// ferry/curve.h — CURVE keys for a Ferry job. With them, every connection between a client and
// a server is authenticated and encrypted (ZeroMQ's CurveZMQ: Curve25519 key exchange,
// XSalsa20-Poly1305 boxes). A server accepts only the job's worker keys, and each key speaks for
// one worker rank. PROTOCOL.md, "Authentication", says what a peer without a key sees.
//
// A job's key folder (ferry-keys writes one; every file owner-only, the folder too):
//   server.key     the servers' keypair (every server of a job holds the same one)
//   server.pub     its public key: what a worker needs to know it talks to the job's servers
//   workers.pub    one line per worker, "RANK PUBLIC-KEY": the keys the servers accept
//   worker-R.key   worker R's keypair
//   readers.pub    (optional: ferry-keys --readers) one line per reader, "RANK PUBLIC-KEY": keys the
//                  servers let read (the change feed, Stats) and nothing else
//   reader-R.key   reader R's keypair
// A server reads server.key and workers.pub; worker R reads server.pub and worker-R.key, so a
// multi-host job copies each host only what it runs. Keys are ZeroMQ's Z85 text (40 characters).
//
// Thread-safety: free functions without shared state.
#pragma once

#include <string>
#include <vector>

#include "ferry/status.h"

namespace ferry {

struct CurveKeypair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters
};

// What a server needs: its own keypair and the public key of each worker (index = rank).
struct CurveServerKeys {
  CurveKeypair server;
  std::vector<std::string> workers;
  std::vector<std::string> readers;  // keys that may only read (index = reader rank); may be empty
};

// What a client (worker `rank`) needs: the servers' public key and its own keypair.
struct CurveClientKeys {
  std::string server_public;
  CurveKeypair client;
};

namespace curve {

// Whether this libzmq was built with CURVE (Debian's is).
bool Available();

// A fresh keypair (libzmq's zmq_curve_keypair).
StatusOr<CurveKeypair> NewKeypair();

// OK when `key` is 40 Z85 characters; otherwise InvalidArgument naming `what`.
Status CheckPublicKey(const std::string& key, const std::string& what);
// OK when both halves are valid and the public key is the secret key's.
Status CheckKeypair(const CurveKeypair& keys, const std::string& what);
// The 32 raw bytes a Z85 key stands for (the key must have passed a check above).
std::string Decode(const std::string& z85);
// A raw 32-byte key as Z85.
std::string Encode(const std::string& raw);

// Writes a new key folder for a job of `num_workers` workers (see above). The folder is created
// (mode 0700; its parent must exist) or must be empty of key files: existing keys are never
// overwritten. Files are written owner-only, fsynced, then renamed into place.
// With `num_readers` > 0, also reader keys (readers.pub, reader-R.key).
Status WriteJobKeys(const std::string& dir, int num_workers, int num_readers = 0);

// Reads a server's keys from a job's key folder. A secret-key file that group or others may read
// is refused (chmod 600 it), as is a malformed line, a key that does not decode, a keypair whose
// halves do not match, and two workers with the same key; each error names the file and line.
StatusOr<CurveServerKeys> LoadServerKeys(const std::string& dir);
// Reads worker `rank`'s keys from a job's key folder, with the same checks.
StatusOr<CurveClientKeys> LoadClientKeys(const std::string& dir, int rank);
// Reads reader `rank`'s keys (server.pub, reader-R.key), for a ChangeFeed (ferry/feed.h).
StatusOr<CurveClientKeys> LoadReaderKeys(const std::string& dir, int rank);

// Makes a ZeroMQ socket (`zmq_socket`: its handle, before it connects) a CURVE client with `keys`:
// the servers' public key and its own keypair. INVALID_ARGUMENT when a key does not decode,
// INTERNAL when libzmq refuses one.
Status SetClientKeys(void* zmq_socket, const CurveClientKeys& keys);

}  // namespace curve
}  // namespace ferry
