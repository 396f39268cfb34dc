#include "ferry/curve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include <zmq.h>

namespace ferry::curve {
namespace {

constexpr size_t kZ85Length = 40;
constexpr size_t kRawLength = 32;

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return std::string(s);
}

// The text of `path`, at most 64 KiB (a key file is well under 1 KiB). With `secret`, a file
// that group or others may read is refused: ZeroMQ's security is only as good as its secret keys.
StatusOr<std::string> ReadSmallFile(const std::string& path, bool secret) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string why = Errno("cannot open " + path);
    return errno == ENOENT ? NotFoundError(why) : UnavailableError(why);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string why = Errno("cannot stat " + path);
    close(fd);
    return UnavailableError(why);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return InvalidArgumentError(path + " is not a regular file");
  }
  if (secret && (st.st_mode & 077) != 0) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return PermissionDeniedError(path + " holds a secret key but group or others may read it (mode " + mode +
                                 "); make it owner-only: chmod 600 " + path);
  }
  if (st.st_size > 65536) {
    close(fd);
    return InvalidArgumentError(path + " is " + std::to_string(st.st_size) + " bytes: too large for a key file");
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? Errno("cannot read " + path) : path + " shrank while being read";
      close(fd);
      return UnavailableError(why);
    }
    got += static_cast<size_t>(n);
  }
  close(fd);
  return text;
}

// Lines of `text` that are neither blank nor comments ('#' first: '#' is also a Z85 character,
// so only a whole-line comment is one), with their 1-based numbers.
std::vector<std::pair<int, std::string>> MeaningfulLines(const std::string& text) {
  std::vector<std::pair<int, std::string>> out;
  int number = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    ++number;
    std::string line = Trim(std::string_view(text).substr(start, end - start));
    if (!line.empty() && line[0] != '#') out.emplace_back(number, std::move(line));
    start = end + 1;
  }
  return out;
}

// A keypair file: "public-key = KEY" and "secret-key = KEY" lines.
StatusOr<CurveKeypair> ReadKeypairFile(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, /*secret=*/true));
  CurveKeypair keys;
  for (const auto& [number, line] : MeaningfulLines(text)) {
    const std::string where = path + ":" + std::to_string(number);
    const size_t eq = line.find('=');  // the first '=' ends the name ('=' may also appear in a key)
    if (eq == std::string::npos) return InvalidArgumentError(where + ": want 'public-key = KEY' or 'secret-key = KEY'");
    const std::string name = Trim(std::string_view(line).substr(0, eq));
    const std::string value = Trim(std::string_view(line).substr(eq + 1));
    std::string* slot = name == "public-key" ? &keys.public_key : name == "secret-key" ? &keys.secret_key : nullptr;
    if (slot == nullptr) return InvalidArgumentError(where + ": unknown field '" + name + "'");
    if (!slot->empty()) return InvalidArgumentError(where + ": " + name + " given twice");
    *slot = value;
  }
  if (keys.public_key.empty() || keys.secret_key.empty()) {
    return InvalidArgumentError(path + ": want both a public-key and a secret-key line");
  }
  FERRY_RETURN_IF_ERROR(CheckKeypair(keys, path));
  return keys;
}

// A public key file: one "public-key = KEY" line.
StatusOr<std::string> ReadPublicFile(const std::string& path) {
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, /*secret=*/false));
  std::string key;
  for (const auto& [number, line] : MeaningfulLines(text)) {
    const std::string where = path + ":" + std::to_string(number);
    const size_t eq = line.find('=');
    if (eq == std::string::npos || Trim(std::string_view(line).substr(0, eq)) != "public-key") {
      return InvalidArgumentError(where + ": want 'public-key = KEY'");
    }
    if (!key.empty()) return InvalidArgumentError(where + ": public-key given twice");
    key = Trim(std::string_view(line).substr(eq + 1));
  }
  if (key.empty()) return InvalidArgumentError(path + ": no public-key line");
  FERRY_RETURN_IF_ERROR(CheckPublicKey(key, path));
  return key;
}

// Writes `text` to dir/name through a temporary file: owner-only, fsynced, renamed into place.
Status WriteKeyFile(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name, tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return UnavailableError(Errno("cannot create " + tmp));
  size_t put = 0;
  while (put < text.size()) {
    const ssize_t n = write(fd, text.data() + put, text.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = Errno("cannot write " + tmp);
      close(fd);
      unlink(tmp.c_str());
      return UnavailableError(why);
    }
    put += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const std::string why = Errno("cannot sync " + tmp);
    unlink(tmp.c_str());
    return UnavailableError(why);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = Errno("cannot rename " + tmp + " to " + path);
    unlink(tmp.c_str());
    return UnavailableError(why);
  }
  return Status::Ok();
}

std::string KeypairText(const std::string& who, const CurveKeypair& keys) {
  return "# Ferry CURVE keypair: " + who +
         " (ZeroMQ Z85). The secret key proves who this is: keep the file owner-only.\n"
         "public-key = " +
         keys.public_key + "\nsecret-key = " + keys.secret_key + "\n";
}

std::string WorkerKeyName(int rank) { return "worker-" + std::to_string(rank) + ".key"; }
std::string ReaderKeyName(int rank) { return "reader-" + std::to_string(rank) + ".key"; }

}  // namespace

bool Available() { return zmq_has("curve") != 0; }

StatusOr<CurveKeypair> NewKeypair() {
  char pub[kZ85Length + 1], sec[kZ85Length + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return UnimplementedError(std::string("cannot make a CURVE keypair: ") + zmq_strerror(zmq_errno()) +
                              " (is libzmq built with CURVE?)");
  }
  return CurveKeypair{pub, sec};
}

Status CheckPublicKey(const std::string& key, const std::string& what) {
  if (key.size() != kZ85Length) {
    return InvalidArgumentError(what + ": a CURVE key is " + std::to_string(kZ85Length) + " Z85 characters, not " +
                                std::to_string(key.size()));
  }
  uint8_t raw[kRawLength];
  if (zmq_z85_decode(raw, key.c_str()) == nullptr) {
    return InvalidArgumentError(what + ": '" + key + "' is not Z85 text");
  }
  return Status::Ok();
}

Status CheckKeypair(const CurveKeypair& keys, const std::string& what) {
  FERRY_RETURN_IF_ERROR(CheckPublicKey(keys.public_key, what + " (public key)"));
  if (keys.secret_key.size() != kZ85Length) {
    return InvalidArgumentError(what + " (secret key): a CURVE key is " + std::to_string(kZ85Length) +
                                " Z85 characters, not " + std::to_string(keys.secret_key.size()));
  }
  char derived[kZ85Length + 1];
  if (zmq_curve_public(derived, keys.secret_key.c_str()) != 0) {
    return InvalidArgumentError(what + " (secret key): not Z85 text");
  }
  if (keys.public_key != derived) {
    return InvalidArgumentError(
        what + ": the public key is not the secret key's (the two lines come from different keypairs)");
  }
  return Status::Ok();
}

std::string Decode(const std::string& z85) {
  std::string raw(kRawLength, '\0');
  if (z85.size() != kZ85Length || zmq_z85_decode(reinterpret_cast<uint8_t*>(raw.data()), z85.c_str()) == nullptr) {
    return {};
  }
  return raw;
}

std::string Encode(const std::string& raw) {
  if (raw.size() != kRawLength) return {};
  char z85[kZ85Length + 1];
  if (zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(raw.data()), raw.size()) == nullptr) return {};
  return z85;
}

Status WriteJobKeys(const std::string& dir, int num_workers, int num_readers) {
  if (num_workers < 1 || num_workers > 65536) {
    return InvalidArgumentError("a job has 1 to 65536 workers, not " + std::to_string(num_workers));
  }
  if (num_readers < 0 || num_readers > 65536) {
    return InvalidArgumentError("a job has 0 to 65536 readers, not " + std::to_string(num_readers));
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return UnavailableError(Errno("cannot create " + dir));
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return InvalidArgumentError(dir + " is not a folder");
  std::vector<std::string> names = {"server.key", "server.pub", "workers.pub"};
  for (int r = 0; r < num_workers; ++r) names.push_back(WorkerKeyName(r));
  if (num_readers > 0) names.push_back("readers.pub");
  for (int r = 0; r < num_readers; ++r) names.push_back(ReaderKeyName(r));
  for (const auto& name : names) {
    if (access((dir + "/" + name).c_str(), F_OK) == 0) {
      return AlreadyExistsError(dir + "/" + name + " exists: keys are never overwritten (use a new folder)");
    }
  }
  FERRY_ASSIGN_OR_RETURN(CurveKeypair server, NewKeypair());
  FERRY_RETURN_IF_ERROR(WriteKeyFile(dir, "server.key", KeypairText("the job's servers", server)));
  FERRY_RETURN_IF_ERROR(WriteKeyFile(
      dir, "server.pub",
      "# Ferry CURVE public key of the job's servers (ZeroMQ Z85).\npublic-key = " + server.public_key + "\n"));
  // `n` keypairs of `who` ("worker", "reader") in files named by `file`, and their public keys
  // listed in `list_name` after `header`.
  auto keypairs = [&](int n, const std::string& who, std::string (*file)(int), const std::string& list_name,
                      const std::string& header) -> Status {
    std::string list = header;
    for (int r = 0; r < n; ++r) {
      FERRY_ASSIGN_OR_RETURN(CurveKeypair keys, NewKeypair());
      FERRY_RETURN_IF_ERROR(WriteKeyFile(dir, file(r), KeypairText(who + " " + std::to_string(r), keys)));
      list += std::to_string(r) + " " + keys.public_key + "\n";
    }
    return WriteKeyFile(dir, list_name, list);
  };
  FERRY_RETURN_IF_ERROR(keypairs(num_workers, "worker", WorkerKeyName, "workers.pub",
                                 "# Ferry CURVE public keys of the job's workers: RANK KEY. Servers accept these "
                                 "alone.\n"));
  if (num_readers > 0) {
    FERRY_RETURN_IF_ERROR(keypairs(num_readers, "reader", ReaderKeyName, "readers.pub",
                                   "# Ferry CURVE public keys of the job's readers: RANK KEY. Servers let these read "
                                   "(the change feed, Stats) and nothing else.\n"));
  }
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return Status::Ok();
}

namespace {

// Reads a "RANK KEY" list (workers.pub, readers.pub) of `who` ("worker", "reader"): ranks 0 to
// n - 1, each once, each key once.
StatusOr<std::vector<std::string>> ReadKeyList(const std::string& path, const std::string& who) {
  FERRY_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, /*secret=*/false));
  std::map<int, std::string> by_rank;
  std::map<std::string, int> by_key;
  for (const auto& [number, line] : MeaningfulLines(text)) {
    const std::string where = path + ":" + std::to_string(number);
    const size_t space = line.find_first_of(" \t");
    if (space == std::string::npos) return InvalidArgumentError(where + ": want 'RANK KEY'");
    const std::string rank_text = line.substr(0, space), key = Trim(std::string_view(line).substr(space + 1));
    int rank = 0;
    for (char c : rank_text) {
      if (c < '0' || c > '9' || rank > 65535)
        return InvalidArgumentError(where + ": rank '" + rank_text + "' is not in [0, 65535]");
      rank = rank * 10 + (c - '0');
    }
    if (rank_text.empty() || rank > 65535)
      return InvalidArgumentError(where + ": rank '" + rank_text + "' is not in [0, 65535]");
    FERRY_RETURN_IF_ERROR(CheckPublicKey(key, where));
    if (by_rank.contains(rank)) return InvalidArgumentError(where + ": " + who + " " + rank_text + " listed twice");
    if (auto it = by_key.find(key); it != by_key.end()) {
      return InvalidArgumentError(where + ": " + who + "s " + std::to_string(it->second) + " and " + rank_text +
                                  " have the same key (a key must name one " + who + ")");
    }
    by_rank[rank] = key;
    by_key[key] = rank;
  }
  if (by_rank.empty()) return InvalidArgumentError(path + ": lists no " + who);
  std::vector<std::string> keys;
  for (int r = 0; r < static_cast<int>(by_rank.size()); ++r) {
    if (!by_rank.contains(r)) {
      return InvalidArgumentError(path + ": lists " + std::to_string(by_rank.size()) + " " + who + "s but not " + who +
                                  " " + std::to_string(r) + " (want ranks 0 to " + std::to_string(by_rank.size() - 1) +
                                  ")");
    }
    keys.push_back(by_rank[r]);
  }
  return keys;
}

}  // namespace

StatusOr<CurveServerKeys> LoadServerKeys(const std::string& dir) {
  CurveServerKeys keys;
  FERRY_ASSIGN_OR_RETURN(keys.server, ReadKeypairFile(dir + "/server.key"));
  const std::string path = dir + "/workers.pub";
  FERRY_ASSIGN_OR_RETURN(keys.workers, ReadKeyList(path, "worker"));
  const std::set<std::string> workers(keys.workers.begin(), keys.workers.end());
  if (workers.contains(keys.server.public_key)) {
    return InvalidArgumentError(path + ": a worker has the servers' key (" + dir + "/server.key)");
  }
  // Readers (optional): keys that may read and nothing else.
  const std::string readers = dir + "/readers.pub";
  if (access(readers.c_str(), F_OK) == 0) {
    FERRY_ASSIGN_OR_RETURN(keys.readers, ReadKeyList(readers, "reader"));
    for (size_t r = 0; r < keys.readers.size(); ++r) {
      if (workers.contains(keys.readers[r]) || keys.readers[r] == keys.server.public_key) {
        return InvalidArgumentError(readers + ": reader " + std::to_string(r) +
                                    " has a worker's or the servers' key (a reader's key must be its own)");
      }
    }
  }
  return keys;
}

StatusOr<CurveClientKeys> LoadClientKeys(const std::string& dir, int rank) {
  if (rank < 0) return InvalidArgumentError("worker rank " + std::to_string(rank) + " is negative");
  CurveClientKeys keys;
  FERRY_ASSIGN_OR_RETURN(keys.server_public, ReadPublicFile(dir + "/server.pub"));
  FERRY_ASSIGN_OR_RETURN(keys.client, ReadKeypairFile(dir + "/" + WorkerKeyName(rank)));
  return keys;
}

Status SetClientKeys(void* zmq_socket, const CurveClientKeys& keys) {
  const std::string server = Decode(keys.server_public);
  const std::string pub = Decode(keys.client.public_key);
  const std::string sec = Decode(keys.client.secret_key);
  if (server.empty() || pub.empty() || sec.empty()) {
    return InvalidArgumentError("a CURVE key does not decode (curve::LoadClientKeys or LoadReaderKeys reads them)");
  }
  for (const auto& [option, key] : {std::pair{ZMQ_CURVE_SERVERKEY, &server}, std::pair{ZMQ_CURVE_PUBLICKEY, &pub},
                                    std::pair{ZMQ_CURVE_SECRETKEY, &sec}}) {
    if (zmq_setsockopt(zmq_socket, option, key->data(), key->size()) != 0) {
      return InternalError(std::string("cannot set the socket's CURVE keys: ") + zmq_strerror(zmq_errno()));
    }
  }
  return Status::Ok();
}

StatusOr<CurveClientKeys> LoadReaderKeys(const std::string& dir, int rank) {
  if (rank < 0) return InvalidArgumentError("reader rank " + std::to_string(rank) + " is negative");
  CurveClientKeys keys;
  FERRY_ASSIGN_OR_RETURN(keys.server_public, ReadPublicFile(dir + "/server.pub"));
  FERRY_ASSIGN_OR_RETURN(keys.client, ReadKeypairFile(dir + "/" + ReaderKeyName(rank)));
  return keys;
}

}  // namespace curve
