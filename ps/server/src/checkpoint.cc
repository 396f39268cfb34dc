#include "internal/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ferry/messages/placement.h"
#include "ferry/messages/wire.h"

namespace ferry::ps {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'K', 'P'};
constexpr int64_t kRowsPerBlock = 65536;
// A block's payload is at most this large (a chunk of 2^28 floats with adam's two slots is
// 3 GiB): a corrupt length cannot make the reader allocate more.
constexpr uint64_t kMaxBlockBytes = uint64_t{4} << 30;

enum BlockKind : uint32_t { kEnd = 0, kTable = 1, kDenseChunk = 2, kSparseRows = 3 };

uint32_t Crc(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt piece = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, piece));
    p += piece;
    n -= piece;
  }
  return crc;
}

Status Errno(const std::string& what, const std::string& path) {
  return InternalError(what + " " + path + ": " + std::strerror(errno));
}

// A file written to a temporary name and renamed into place once complete and fsynced.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  Status Open() {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd_ < 0 ? Errno("cannot create", tmp_) : Status::Ok();
  }
  Status Write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    bytes_ += n;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return Errno("cannot write", tmp_);
      p += w;
      n -= static_cast<size_t>(w);
    }
    return Status::Ok();
  }
  // fsync, close, rename, fsync the folder: after this the file is durable under its name.
  // A failure leaves no temporary file behind (a full disk keeps no half-written checkpoint).
  Status Commit() {
    if (::fsync(fd_) != 0) return Errno("cannot fsync", tmp_);
    if (::close(fd_) != 0) {
      fd_ = -1;
      Status s = Errno("cannot close", tmp_);
      ::unlink(tmp_.c_str());
      return s;
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      Status s = Errno("cannot rename into place", path_);
      ::unlink(tmp_.c_str());
      return s;
    }
    const std::string dir = fs::path(path_).parent_path().string();
    const int d = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return Errno("cannot open folder", dir);
    const int rc = ::fsync(d);
    ::close(d);
    return rc == 0 ? Status::Ok() : Errno("cannot fsync folder", dir);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

// A block's checksum covers its kind and length too, so a flipped header byte is caught. From the
// payload's own CRC (the writer has it already: one pass over the payload serves both CRCs).
uint32_t BlockCrc(uint32_t kind, uint64_t len, uint32_t payload_crc) {
  uint32_t head = Crc(0, &kind, sizeof kind);
  head = Crc(head, &len, sizeof len);
  return static_cast<uint32_t>(crc32_combine(head, payload_crc, static_cast<z_off_t>(len)));
}
uint32_t BlockCrc(uint32_t kind, uint64_t len, const void* payload) {
  return BlockCrc(kind, len, Crc(0, payload, static_cast<size_t>(len)));
}

// The checkpoints' manifests in `dir` (MANIFEST-<zero-padded step>), newest first; none if the
// folder cannot be read.
std::vector<std::string> ManifestsNewestFirst(const std::string& dir) {
  std::vector<std::string> manifests;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("MANIFEST-") && !n.ends_with(".tmp")) manifests.push_back(n);
  }
  std::sort(manifests.rbegin(), manifests.rend());  // zero-padded steps: newest first
  return manifests;
}

// Every file of one checkpoint starts with the same prefix (so old ones are removed by it).
std::string StepPrefix(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "step-%020lld-", static_cast<long long>(step));
  return buf;
}

std::string ShardName(int64_t step, int rank, int num_servers) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.ckpt", rank, num_servers);
  return StepPrefix(step) + buf;
}

std::string ManifestName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "MANIFEST-%020lld", static_cast<long long>(step));
  return buf;
}

// Reads a block payload's fields in order; every read is bounds-checked.
class Reader {
 public:
  Reader(std::span<const char> data, std::string where) : data_(data), where_(std::move(where)) {}
  template <typename T>
  Status Get(T* v) {
    if (data_.size() - at_ < sizeof(T)) return Short();
    std::memcpy(v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return Status::Ok();
  }
  template <typename T>
  Status GetArray(std::vector<T>* out, uint64_t n) {
    if (n > (data_.size() - at_) / sizeof(T)) return Short();
    out->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out->data(), data_.data() + at_, static_cast<size_t>(n) * sizeof(T));
    at_ += static_cast<size_t>(n) * sizeof(T);
    return Status::Ok();
  }
  Status Done() const {
    return at_ == data_.size()
               ? Status::Ok()
               : DataLossError(where_ + ": " + std::to_string(data_.size() - at_) + " unexpected bytes");
  }

 private:
  Status Short() const { return DataLossError(where_ + ": the block ends early"); }
  std::span<const char> data_;
  size_t at_ = 0;
  std::string where_;
};

Status ReadShard(const fs::path& path, const ShardFile& listed, CheckpointData* out) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(name + ": cannot open (" + std::strerror(errno) + ")");
  std::vector<char> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() != listed.bytes) {
    return DataLossError(name + ": " + std::to_string(all.size()) + " bytes, the manifest says " +
                         std::to_string(listed.bytes) + " (truncated or overwritten)");
  }
  if (Crc(0, all.data(), all.size()) != listed.crc32)
    return DataLossError(name + ": checksum differs from the manifest's");
  if (all.size() < 16 || std::memcmp(all.data(), kMagic, 8) != 0)
    return DataLossError(name + ": not a Ferry checkpoint shard");
  uint32_t format = 0, reserved = 0;
  std::memcpy(&format, all.data() + 8, 4);
  std::memcpy(&reserved, all.data() + 12, 4);
  if (reserved != 0) return DataLossError(name + ": header bytes 12-15 are not zero");
  if (format != kCheckpointFormat) {
    return FailedPreconditionError(name + ": format " + std::to_string(format) + ", this build reads " +
                                   std::to_string(kCheckpointFormat));
  }
  size_t at = 16;
  int blocks = 0;
  while (true) {
    const std::string where = name + " block " + std::to_string(blocks) + " (byte " + std::to_string(at) + ")";
    if (all.size() - at < 16) return DataLossError(where + ": the file ends inside a block header");
    uint32_t kind = 0, crc = 0;
    uint64_t len = 0;
    std::memcpy(&kind, all.data() + at, 4);
    std::memcpy(&crc, all.data() + at + 4, 4);
    std::memcpy(&len, all.data() + at + 8, 8);
    at += 16;
    if (len > kMaxBlockBytes || len > all.size() - at)
      return DataLossError(where + ": length " + std::to_string(len) + " runs past the file");
    std::span<const char> payload(all.data() + at, static_cast<size_t>(len));
    if (BlockCrc(kind, len, payload.data()) != crc) return DataLossError(where + ": checksum mismatch");
    at += static_cast<size_t>(len);
    ++blocks;
    Reader r(payload, where);
    if (kind == kEnd) {
      int64_t count = 0;
      FERRY_RETURN_IF_ERROR(r.Get(&count));
      if (count != blocks - 1)
        return DataLossError(where + ": the end block counts " + std::to_string(count) + " blocks");
      if (at != all.size()) return DataLossError(where + ": bytes after the end block");
      return r.Done();
    }
    uint64_t table_id = 0;
    FERRY_RETURN_IF_ERROR(r.Get(&table_id));
    auto& t = out->tables[table_id];
    if (kind == kTable) {
      uint64_t n = 0;
      std::vector<char> spec_bytes;
      FERRY_RETURN_IF_ERROR(r.Get(&n));
      FERRY_RETURN_IF_ERROR(r.GetArray(&spec_bytes, n));
      FERRY_RETURN_IF_ERROR(r.Done());
      flatbuffers::Verifier v(reinterpret_cast<const uint8_t*>(spec_bytes.data()), spec_bytes.size());
      if (!v.VerifyBuffer<wire::TableSpec>(nullptr)) return DataLossError(where + ": the table spec does not verify");
      TableSpec spec;
      FERRY_RETURN_IF_ERROR(
          wire::SpecFromWire(flatbuffers::GetRoot<wire::TableSpec>(spec_bytes.data()), &spec).WithContext(where));
      if (TableId(spec.name) != table_id)
        return DataLossError(where + ": table id is not the hash of '" + spec.name + "'");
      if (!t.spec.name.empty() && !(t.spec == spec)) {
        return DataLossError(where + ": table '" + spec.name + "' differs from another shard's declaration");
      }
      t.spec = std::move(spec);
    } else if (kind == kDenseChunk) {
      int64_t chunk = 0, size = 0;
      CheckpointData::Chunk c;
      uint64_t state_floats = 0;
      FERRY_RETURN_IF_ERROR(r.Get(&chunk));
      FERRY_RETURN_IF_ERROR(r.Get(&size));
      FERRY_RETURN_IF_ERROR(r.Get(&c.version));
      FERRY_RETURN_IF_ERROR(r.Get(&state_floats));
      if (size < 0) return DataLossError(where + ": negative chunk size");
      FERRY_RETURN_IF_ERROR(r.GetArray(&c.params, static_cast<uint64_t>(size)));
      FERRY_RETURN_IF_ERROR(r.GetArray(&c.state, state_floats));
      FERRY_RETURN_IF_ERROR(r.Done());
      if (!t.chunks.emplace(chunk, std::move(c)).second)
        return DataLossError(where + ": chunk " + std::to_string(chunk) + " twice");
    } else if (kind == kSparseRows) {
      int64_t version = 0, row_floats = 0;
      uint64_t n = 0;
      std::vector<int64_t> ids, steps;
      std::vector<float> values;
      FERRY_RETURN_IF_ERROR(r.Get(&version));
      FERRY_RETURN_IF_ERROR(r.Get(&row_floats));
      FERRY_RETURN_IF_ERROR(r.Get(&n));
      if (row_floats <= 0) return DataLossError(where + ": rows of " + std::to_string(row_floats) + " floats");
      FERRY_RETURN_IF_ERROR(r.GetArray(&ids, n));
      FERRY_RETURN_IF_ERROR(r.GetArray(&steps, n));
      if (n > len / static_cast<uint64_t>(row_floats)) return DataLossError(where + ": the block ends early");
      FERRY_RETURN_IF_ERROR(r.GetArray(&values, n * static_cast<uint64_t>(row_floats)));
      FERRY_RETURN_IF_ERROR(r.Done());
      t.sparse_version = std::max(t.sparse_version, version);
      for (uint64_t i = 0; i < n; ++i) {
        CheckpointData::Row row;
        row.steps = steps[i];
        row.values.assign(values.begin() + static_cast<std::ptrdiff_t>(i * row_floats),
                          values.begin() + static_cast<std::ptrdiff_t>((i + 1) * row_floats));
        if (!t.rows.emplace(ids[i], std::move(row)).second)
          return DataLossError(where + ": id " + std::to_string(ids[i]) + " twice");
      }
    } else {
      return DataLossError(where + ": unknown block kind " + std::to_string(kind));
    }
  }
}

// Reads and verifies one manifest and every shard it names.
StatusOr<CheckpointData> ReadManifest(const fs::path& dir, const std::string& manifest) {
  const std::string name = (dir / manifest).string();
  std::ifstream in(dir / manifest);
  if (!in) return NotFoundError(name + ": cannot open");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(name + ": not JSON (" + e.what() + ")");
  }
  CheckpointData out;
  std::vector<ShardFile> shards;
  try {
    if (j.at("format").get<uint32_t>() != kCheckpointFormat) {
      return FailedPreconditionError(name + ": format " + j.at("format").dump() + ", this build reads " +
                                     std::to_string(kCheckpointFormat));
    }
    out.step = j.at("step").get<int64_t>();
    out.meaning = j.at("meaning").get<std::string>();
    if (j.contains("worker_steps")) {
      const auto& steps = j.at("worker_steps");
      if (!steps.is_array()) return DataLossError(name + ": worker_steps is not a list");
      for (const auto& w : steps) {
        if (!w.is_number_integer() || w.get<int64_t>() < -1 || w.get<int64_t>() > (int64_t{1} << 62)) {
          return DataLossError(name + ": worker_steps holds " + w.dump() + ", not an integer in [-1, 2^62]");
        }
        out.worker_steps.push_back(w.get<int64_t>());
      }
    }
    for (const auto& s : j.at("shards")) {
      shards.push_back({s.at("file").get<std::string>(), s.at("bytes").get<uint64_t>(), s.at("crc32").get<uint32_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(name + ": " + e.what());
  }
  if (shards.empty()) return DataLossError(name + ": lists no shard");
  out.num_servers = static_cast<int>(shards.size());
  out.manifest = manifest;
  for (const auto& s : shards) {
    if (s.name.find('/') != std::string::npos) return DataLossError(name + ": shard name '" + s.name + "' is a path");
    FERRY_RETURN_IF_ERROR(ReadShard(dir / s.name, s, &out));
  }
  for (const auto& [id, t] : out.tables) {
    if (t.spec.name.empty()) return DataLossError(name + ": table id " + std::to_string(id) + " has data but no spec");
  }
  return out;
}

}  // namespace

ShardImage SnapshotShard(const TableRegistry& tables) {
  ShardImage image;
  // Sizes first, so the image is allocated once (a large shard is copied at memory speed).
  size_t total = 16 + 16 + sizeof(int64_t);
  tables.ForEach([&](const Table& t) {
    total += 16 + 2 * sizeof(uint64_t) + 512 + t.spec.name.size();
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (const DenseChunk* c = t.dense->chunk(i))
          total += 16 + 40 + (c->params.size() + c->state.size()) * sizeof(float);
      }
    } else {
      const size_t n = t.sparse->size();
      total += (n / kRowsPerBlock + 1) * (16 + 32) +
               n * (2 * sizeof(int64_t) + static_cast<size_t>(t.sparse->row_floats()) * sizeof(float));
    }
  });
  auto& out = image.bytes;
  out.reserve(total);
  auto put = [&](const void* p, size_t n) {
    const size_t at = out.size();
    out.resize(at + n);
    if (n > 0) std::memcpy(out.data() + at, p, n);
  };
  auto put64 = [&](auto v) { put(&v, sizeof v); };
  // A block's header (kind, crc, length) is filled in once its payload is in place; the crc is
  // left to WriteShardImage, off the server's I/O thread.
  auto begin_block = [&](uint32_t kind) {
    image.blocks.push_back(out.size());
    const uint32_t header[4] = {kind, 0, 0, 0};
    put(header, sizeof header);
  };
  auto end_block = [&] {
    const uint64_t len = out.size() - image.blocks.back() - 16;
    std::memcpy(out.data() + image.blocks.back() + 8, &len, sizeof len);
  };
  const uint32_t header[2] = {kCheckpointFormat, 0};
  put(kMagic, sizeof kMagic);
  put(header, sizeof header);
  tables.ForEach([&](const Table& t) {
    flatbuffers::FlatBufferBuilder fbb(256);
    fbb.Finish(wire::SpecToWire(fbb, t.spec));
    begin_block(kTable);
    put64(uint64_t{t.id});
    put64(uint64_t{fbb.GetSize()});
    put(fbb.GetBufferPointer(), fbb.GetSize());
    end_block();
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        const DenseChunk* c = t.dense->chunk(i);
        if (c == nullptr) continue;
        begin_block(kDenseChunk);
        put64(uint64_t{t.id});
        put64(int64_t{i});
        put64(int64_t{c->size});
        put64(int64_t{c->version});
        put64(uint64_t{c->state.size()});
        put(c->params.data(), c->params.size() * sizeof(float));
        put(c->state.data(), c->state.size() * sizeof(float));
        end_block();
      }
      return;
    }
    const SparseShard& s = *t.sparse;
    std::vector<std::pair<int64_t, RowIndex>> rows;
    rows.reserve(s.size());
    // Rows never updated are left out: they hold their initial values, which a pull makes again
    // bit for bit. So a sync checkpoint of step t holds the same rows whichever workers had
    // pulled step t's new ids (creating them) when it was taken.
    s.ForEachRow([&](int64_t id, RowIndex r) {
      if (s.steps(r) > 0) rows.emplace_back(id, r);
    });
    std::sort(rows.begin(), rows.end());  // the same rows give the same file
    const size_t row_bytes = static_cast<size_t>(s.row_floats()) * sizeof(float);
    for (size_t b = 0; b < rows.size() || b == 0; b += kRowsPerBlock) {
      const size_t e = std::min(rows.size(), b + kRowsPerBlock);
      begin_block(kSparseRows);
      put64(uint64_t{t.id});
      put64(int64_t{s.version});
      put64(int64_t{s.row_floats()});
      put64(uint64_t{e - b});
      for (size_t i = b; i < e; ++i) put64(int64_t{rows[i].first});
      for (size_t i = b; i < e; ++i) put64(int64_t{s.steps(rows[i].second)});
      for (size_t i = b; i < e; ++i) put(s.row(rows[i].second), row_bytes);
      end_block();
      if (rows.empty()) break;
    }
  });
  const int64_t blocks = static_cast<int64_t>(image.blocks.size());
  begin_block(kEnd);
  put64(blocks);
  end_block();
  return image;
}

StatusOr<ShardFile> WriteShardImage(const std::string& dir, int rank, int num_servers, int64_t step, ShardImage image) {
  auto& bytes = image.bytes;
  // One CRC pass over each payload gives both its block's CRC (over kind, length, payload) and
  // the whole file's (over every byte, block headers included), joined with crc32_combine.
  size_t covered = image.blocks.empty() ? bytes.size() : image.blocks[0];
  uint32_t file_crc = Crc(0, bytes.data(), covered);
  for (const size_t at : image.blocks) {
    uint32_t kind = 0;
    uint64_t len = 0;
    std::memcpy(&kind, bytes.data() + at, sizeof kind);
    std::memcpy(&len, bytes.data() + at + 8, sizeof len);
    const uint32_t payload = Crc(0, bytes.data() + at + 16, static_cast<size_t>(len));
    const uint32_t crc = BlockCrc(kind, len, payload);
    std::memcpy(bytes.data() + at + 4, &crc, sizeof crc);
    file_crc = Crc(file_crc, bytes.data() + at, 16);
    file_crc = static_cast<uint32_t>(crc32_combine(file_crc, payload, static_cast<z_off_t>(len)));
    covered = at + 16 + static_cast<size_t>(len);
  }
  if (covered != bytes.size()) std::abort();  // SnapshotShard lays the blocks end to end, to the end
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
  ShardFile out{ShardName(step, rank, num_servers), 0, 0};
  AtomicFile f((fs::path(dir) / out.name).string());
  FERRY_RETURN_IF_ERROR(f.Open());
  FERRY_RETURN_IF_ERROR(f.Write(bytes.data(), bytes.size()));
  out.bytes = f.bytes();
  out.crc32 = file_crc;
  FERRY_RETURN_IF_ERROR(f.Commit());
  return out;
}

StatusOr<ShardFile> WriteShard(const std::string& dir, int rank, int num_servers, int64_t step,
                               const TableRegistry& tables) {
  return WriteShardImage(dir, rank, num_servers, step, SnapshotShard(tables));
}

Status CheckShardList(int64_t step, const std::vector<ShardFile>& shards) {
  if (shards.empty()) return InvalidArgumentError("a checkpoint needs at least one shard");
  const int n = static_cast<int>(shards.size());
  for (int r = 0; r < n; ++r) {
    const std::string want = ShardName(step, r, n);
    if (shards[static_cast<size_t>(r)].name != want) {
      return InvalidArgumentError("shard " + std::to_string(r) + " of " + std::to_string(n) + " of step " +
                                  std::to_string(step) + " must be '" + want + "', not '" +
                                  shards[static_cast<size_t>(r)].name + "'");
    }
  }
  return Status::Ok();
}

Status WriteManifest(const std::string& dir, int64_t step, const std::vector<ShardFile>& shards,
                     const std::string& meaning, int keep, const std::vector<int64_t>& worker_steps) {
  nlohmann::ordered_json j;
  j["format"] = kCheckpointFormat;
  j["step"] = step;
  j["meaning"] = meaning;
  if (!worker_steps.empty()) j["worker_steps"] = worker_steps;
  j["shards"] = nlohmann::ordered_json::array();
  for (const auto& s : shards) j["shards"].push_back({{"file", s.name}, {"bytes", s.bytes}, {"crc32", s.crc32}});
  const std::string text = j.dump(1) + "\n";
  const std::string manifest = ManifestName(step);
  AtomicFile m((fs::path(dir) / manifest).string());
  FERRY_RETURN_IF_ERROR(m.Open());
  FERRY_RETURN_IF_ERROR(m.Write(text.data(), text.size()));
  FERRY_RETURN_IF_ERROR(m.Commit());
  AtomicFile current((fs::path(dir) / "CURRENT").string());
  FERRY_RETURN_IF_ERROR(current.Open());
  const std::string line = manifest + "\n";
  FERRY_RETURN_IF_ERROR(current.Write(line.data(), line.size()));
  FERRY_RETURN_IF_ERROR(current.Commit());
  // Keep the newest `keep` manifests and the shard files they name; remove the rest.
  const std::vector<std::string> manifests = ManifestsNewestFirst(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < manifests.size(); ++i) {
    const std::string prefix = "step-" + manifests[i].substr(9) + "-";  // the same zero-padded step
    std::error_code ec;
    fs::remove(fs::path(dir) / manifests[i], ec);
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().filename().string().starts_with(prefix)) fs::remove(e.path(), ec);
    }
  }
  return Status::Ok();
}

std::vector<int64_t> MakeRoom(const std::string& dir, int rank, int keep) {
  std::vector<int64_t> removed;
  if (keep < 2) return removed;
  const std::vector<std::string> manifests = ManifestsNewestFirst(dir);
  char mine[32];
  std::snprintf(mine, sizeof mine, "shard-%05d-of-", rank);
  for (size_t i = static_cast<size_t>(keep - 1); i < manifests.size(); ++i) {
    const std::string prefix = "step-" + manifests[i].substr(9) + "-" + mine;
    std::error_code ec;
    bool any = false;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.path().filename().string().starts_with(prefix)) any = fs::remove(e.path(), ec) || any;
    }
    if (any) removed.push_back(std::strtoll(manifests[i].c_str() + 9, nullptr, 10));
  }
  return removed;
}

StatusOr<CheckpointData> ReadCheckpoint(const std::string& dir, std::vector<std::string>* skipped) {
  std::vector<std::string> tried;
  std::string current;
  {
    std::ifstream in(fs::path(dir) / "CURRENT");
    if (in) std::getline(in, current);
  }
  std::vector<std::string> candidates;
  if (!current.empty()) {
    candidates.push_back(current);
  } else {
    tried.push_back((fs::path(dir) / "CURRENT").string() + ": missing or empty");
  }
  std::vector<std::string> manifests;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("MANIFEST-") && !n.ends_with(".tmp") && n != current) manifests.push_back(n);
  }
  if (ec) return NotFoundError("checkpoint folder " + dir + ": " + ec.message());
  std::sort(manifests.rbegin(), manifests.rend());
  candidates.insert(candidates.end(), manifests.begin(), manifests.end());
  for (const auto& m : candidates) {
    if (m.find('/') != std::string::npos || !m.starts_with("MANIFEST-")) {
      tried.push_back((fs::path(dir) / "CURRENT").string() + ": names '" + m + "', not a manifest");
      continue;
    }
    auto data = ReadManifest(dir, m);
    if (data.ok()) {
      if (skipped) *skipped = tried;
      return data;
    }
    tried.push_back(data.status().message());
  }
  std::string why;
  for (const auto& t : tried) why += "\n  " + t;
  return NotFoundError("no usable checkpoint in " + dir + (why.empty() ? ": no manifest" : ":" + why));
}

StatusOr<KeptCheckpoints> ListCheckpoints(const std::string& dir) {
  KeptCheckpoints kept;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("MANIFEST-") || n.ends_with(".tmp")) continue;
    int64_t step = -1;
    const auto [end, err] = std::from_chars(n.data() + 9, n.data() + n.size(), step);
    if (err == std::errc() && end == n.data() + n.size() && n == ManifestName(step)) kept.steps.push_back(step);
  }
  if (ec) return NotFoundError("checkpoint folder " + dir + ": " + ec.message());
  std::ranges::sort(kept.steps);
  std::string current;
  if (std::ifstream in(fs::path(dir) / "CURRENT"); in) std::getline(in, current);
  for (int64_t s : kept.steps) {
    if (current == ManifestName(s)) kept.current = s;
  }
  return kept;
}

StatusOr<CheckpointData> ReadCheckpointAt(const std::string& dir, int64_t step) {
  FERRY_ASSIGN_OR_RETURN(KeptCheckpoints kept, ListCheckpoints(dir));
  if (std::ranges::find(kept.steps, step) == kept.steps.end()) {
    std::string steps;
    for (int64_t s : kept.steps) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    return NotFoundError("no checkpoint of step " + std::to_string(step) + " in " + dir +
                         (steps.empty() ? " (it keeps none)" : " (it keeps steps " + steps + ")"));
  }
  return ReadManifest(dir, ManifestName(step));
}

Status RestoreShard(const CheckpointData& ckpt, int rank, int num_servers, int num_workers, TableRegistry* tables) {
  for (const auto& [id, t] : ckpt.tables) {
    FERRY_RETURN_IF_ERROR(tables->Create(t.spec, id, num_workers));
    FERRY_ASSIGN_OR_RETURN(Table * restored, tables->Find(id, t.spec.type));
    restored->settings_open = true;
    if (t.spec.type == TableType::kDense) {
      FERRY_ASSIGN_OR_RETURN(Table * table, tables->Find(id, TableType::kDense));
      for (int64_t i = 0; i < table->dense->num_chunks(); ++i) {
        DenseChunk* c = table->dense->chunk(i);
        if (c == nullptr) continue;  // another server's under the new placement
        auto it = t.chunks.find(i);
        if (it == t.chunks.end()) {
          return DataLossError("checkpoint " + ckpt.manifest + ": table '" + t.spec.name + "' lacks chunk " +
                               std::to_string(i));
        }
        if (it->second.params.size() != c->params.size() || it->second.state.size() != c->state.size()) {
          return DataLossError("checkpoint " + ckpt.manifest + ": table '" + t.spec.name + "' chunk " +
                               std::to_string(i) + " has the wrong size");
        }
        c->params.Assign(it->second.params);
        c->state = it->second.state;
        c->version = it->second.version;
        std::fill(c->last_pulled.begin(), c->last_pulled.end(), c->version);
      }
    } else {
      FERRY_ASSIGN_OR_RETURN(Table * table, tables->Find(id, TableType::kSparse));
      SparseShard& s = *table->sparse;
      for (const auto& [row_id, row] : t.rows) {
        if (placement::IdServer(row_id, num_servers) != rank) continue;
        if (static_cast<int64_t>(row.values.size()) != s.row_floats()) {
          return DataLossError("checkpoint " + ckpt.manifest + ": table '" + t.spec.name + "' id " +
                               std::to_string(row_id) + " has the wrong width");
        }
        const RowIndex r = s.FindOrCreate(row_id);
        std::copy(row.values.begin(), row.values.end(), s.row(r));
        s.steps(r) = row.steps;
      }
      s.version = t.sparse_version;
      std::fill(s.last_pulled.begin(), s.last_pulled.end(), s.version);
    }
  }
  return Status::Ok();
}

}  // namespace ferry::ps
