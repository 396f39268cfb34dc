#include "internal/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "ferry/messages/placement.h"
#include "ferry/messages/wire.h"
#include "internal/byte_reader.h"
#include "internal/optimizer.h"

namespace ferry::ps {
uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt piece = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(crc32(crc, p, piece));
    p += piece;
    n -= piece;
  }
  return crc;
}

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'F', 'E', 'R', 'R', 'Y', 'C', 'K', 'P'};
constexpr int64_t kRowsPerBlock = 65536;
// A block's payload is at most this large (a chunk of 2^28 floats with adam's two slots is
// 3 GiB): a corrupt length cannot make the reader allocate more.
constexpr uint64_t kMaxBlockBytes = uint64_t{4} << 30;

enum BlockKind : uint32_t {
  kEnd = 0,
  kTable = 1,
  kDenseChunk = 2,
  kSparseRows = 3,
  kPrevious = 4,   // format 2
  kDeleted = 5,    // format 2
  kWhole = 6,      // format 2: a sparse table's rows in this delta replace all of the chain's
  kDiskStore = 7,  // a sparse table with a disk tier: the copy of the store holding its other rows
};
// A disk store block lists at most this many files (a store of a few TB has a few thousand).
constexpr uint64_t kMaxStoreFiles = uint64_t{1} << 20;
// A delta's first block names its predecessor in at most this many bytes (WithChain reads no more).
constexpr uint64_t kMaxPreviousBlock = 4096;


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
  uint32_t head = Crc32(0, &kind, sizeof kind);
  head = Crc32(head, &len, sizeof len);
  return static_cast<uint32_t>(crc32_combine(head, payload_crc, static_cast<z_off_t>(len)));
}
uint32_t BlockCrc(uint32_t kind, uint64_t len, const void* payload) {
  return BlockCrc(kind, len, Crc32(0, payload, static_cast<size_t>(len)));
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

// The folders of a shard's copies of its server's disk tier store begin with the shard file's name
// and ".disk."; each save's copy has a name of its own (a generation after that), so saving a
// step again never touches the copy the committed shard names until the new shard is in place.
std::string DiskFolderPrefix(const std::string& shard) { return shard + ".disk."; }

// The shard file a store copy's folder belongs to ("" for any other name).
std::string ShardOfDiskFolder(const std::string& name) {
  const size_t at = name.find(".ckpt.disk.");
  return at == std::string::npos ? std::string() : name.substr(0, at + 5);
}

// Whether `name` in a checkpoint folder is one of `needed`'s files, or a store copy of one.
bool Needed(const std::set<std::string>& needed, const std::string& name) {
  return needed.contains(name) || needed.contains(ShardOfDiskFolder(name));
}

std::string ManifestName(int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "MANIFEST-%020lld", static_cast<long long>(step));
  return buf;
}


// One shard file read back: its tables, and for a delta what it is a delta of and the ids it
// deletes.
struct FileData {
  CheckpointData data;
  std::optional<DeltaOf> previous;                   // a delta's predecessor (format 2)
  std::map<uint64_t, std::vector<int64_t>> deleted;  // a delta's ids no longer held, by table
  std::set<uint64_t> whole;                          // a delta's sparse tables held whole
  std::set<std::string> verified;                    // the store copies its blocks name, verified
};

// A kDiskStore payload (after the table id): u64 n, n bytes of the folder's name; u64 files;
// per file u64 bytes, u64 m, m bytes of its name. The folder must be the shard's own
// (DiskFolderName), every file in it with the size listed, and RocksDB must find every block's
// checksum right (read whole, once per folder).
Status ParseDiskStore(Reader& r, const fs::path& shard, const std::string& where, FileData* file,
                      std::string* folder_path) {
  uint64_t n = 0, files = 0;
  std::vector<char> folder;
  FERRY_RETURN_IF_ERROR(r.Get(&n));
  FERRY_RETURN_IF_ERROR(r.GetArray(&folder, n));
  FERRY_RETURN_IF_ERROR(r.Get(&files));
  const std::string name(folder.begin(), folder.end());
  const std::string prefix = DiskFolderPrefix(shard.filename().string());
  if (!name.starts_with(prefix) || name.size() == prefix.size() ||
      name.find_first_not_of("0123456789abcdef", prefix.size()) != std::string::npos) {
    return DataLossError(where + ": names the disk tier store '" + name + "', not one of this shard's");
  }
  if (files == 0 || files > kMaxStoreFiles) return DataLossError(where + ": lists " + std::to_string(files) + " files");
  const fs::path dir = shard.parent_path() / name;
  std::vector<std::pair<std::string, uint64_t>> listed;
  for (uint64_t i = 0; i < files; ++i) {
    uint64_t bytes = 0, m = 0;
    std::vector<char> f;
    FERRY_RETURN_IF_ERROR(r.Get(&bytes));
    FERRY_RETURN_IF_ERROR(r.Get(&m));
    FERRY_RETURN_IF_ERROR(r.GetArray(&f, m));
    std::string fname(f.begin(), f.end());
    if (fname.empty() || fname.find('/') != std::string::npos || fname == "." || fname == "..") {
      return DataLossError(where + ": a store file named '" + fname + "'");
    }
    listed.emplace_back(std::move(fname), bytes);
  }
  FERRY_RETURN_IF_ERROR(r.Done());
  *folder_path = dir.string();
  if (file->verified.contains(name)) return Status::Ok();
  for (const auto& [fname, bytes] : listed) {
    std::error_code ec;
    const uint64_t have = fs::file_size(dir / fname, ec);
    if (ec) return DataLossError((dir / fname).string() + ": missing (" + ec.message() + "), the shard lists it");
    if (have != bytes) {
      return DataLossError((dir / fname).string() + ": " + std::to_string(have) + " bytes, the shard lists " +
                           std::to_string(bytes));
    }
  }
  std::unique_ptr<DiskTier> store;
  FERRY_RETURN_IF_ERROR(DiskTier::OpenReadOnly(dir.string(), &store));
  FERRY_RETURN_IF_ERROR(store->VerifyChecksums());
  file->verified.insert(name);
  return Status::Ok();
}

// A kPrevious payload: i64 step, u64 bytes, u32 crc32, u32 zero, u64 n, n bytes of file name.
Status ParsePrevious(Reader& r, const std::string& where, DeltaOf* out) {
  uint64_t n = 0;
  uint32_t zero = 0;
  std::vector<char> name;
  FERRY_RETURN_IF_ERROR(r.Get(&out->step));
  FERRY_RETURN_IF_ERROR(r.Get(&out->file.bytes));
  FERRY_RETURN_IF_ERROR(r.Get(&out->file.crc32));
  FERRY_RETURN_IF_ERROR(r.Get(&zero));
  FERRY_RETURN_IF_ERROR(r.Get(&n));
  FERRY_RETURN_IF_ERROR(r.GetArray(&name, n));
  FERRY_RETURN_IF_ERROR(r.Done());
  out->file.name.assign(name.begin(), name.end());
  if (zero != 0 || out->step < 0 || out->file.name.empty() || out->file.name.find('/') != std::string::npos) {
    return DataLossError(where + ": the predecessor it names is not a shard file of a step");
  }
  return Status::Ok();
}

// Reads one shard file whole and verifies it; keeps what `filter` keeps (all without one). A
// dense chunk's block that the filter drops is not parsed or checked on its own (the file's
// checksum covered it); a rows block is parsed, and only the rows kept are copied.
Status ParseShard(std::span<const char> all, const fs::path& path, const CheckpointFilter* filter, FileData* file);

Status ReadShard(const fs::path& path, const ShardFile& listed, const CheckpointFilter* filter, FileData* file) {
  const std::string name = path.string();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFoundError(name + ": cannot open (" + std::strerror(errno) + ")");
  // One read of the size the file has (a byte at a time through a stream iterator was the
  // larger part of reading a checkpoint); the size must be the manifest's.
  const std::streamoff size = in.tellg();
  if (size < 0) return DataLossError(name + ": cannot tell its size (" + std::strerror(errno) + ")");
  if (static_cast<uint64_t>(size) != listed.bytes) {
    return DataLossError(name + ": " + std::to_string(size) + " bytes, the manifest says " +
                         std::to_string(listed.bytes) + " (truncated or overwritten)");
  }
  std::unique_ptr<char[]> buffer(new char[static_cast<size_t>(size) + 1]);
  in.seekg(0);
  if (!in.read(buffer.get(), size) || in.gcount() != size || in.peek() != std::ifstream::traits_type::eof()) {
    return DataLossError(name + ": not the " + std::to_string(size) + " bytes it had when opened (changed while read)");
  }
  const std::span<const char> all(buffer.get(), static_cast<size_t>(size));
  if (Crc32(0, all.data(), all.size()) != listed.crc32)
    return DataLossError(name + ": checksum differs from the manifest's");
  return ParseShard(all, path, filter, file);
}

// A shard's bytes (`path`: its file, or what names them in errors), its blocks verified; keeps
// what `filter` keeps (all without one).
Status ParseShard(std::span<const char> all, const fs::path& path, const CheckpointFilter* filter, FileData* file) {
  CheckpointData* out = &file->data;
  const std::string name = path.string();
  if (all.size() < 16 || std::memcmp(all.data(), kMagic, 8) != 0)
    return DataLossError(name + ": not a Ferry checkpoint shard");
  uint32_t format = 0, reserved = 0;
  std::memcpy(&format, all.data() + 8, 4);
  std::memcpy(&reserved, all.data() + 12, 4);
  if (reserved != 0) return DataLossError(name + ": header bytes 12-15 are not zero");
  if (format != kCheckpointFormat && format != kCheckpointDeltaFormat) {
    return FailedPreconditionError(name + ": format " + std::to_string(format) + ", this build reads " +
                                   std::to_string(kCheckpointFormat) + " and " +
                                   std::to_string(kCheckpointDeltaFormat));
  }
  const bool delta = format == kCheckpointDeltaFormat;
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
    at += static_cast<size_t>(len);
    ++blocks;
    // A delta's first block, and only it, names its predecessor.
    if (delta && blocks == 1 && kind != kPrevious) {
      return DataLossError(where + ": a delta shard must begin with the block naming its predecessor");
    }
    if (filter != nullptr && kind == kDenseChunk && len >= 16) {  // table id, chunk index first
      uint64_t table_id = 0;
      int64_t chunk = 0;
      std::memcpy(&table_id, payload.data(), 8);
      std::memcpy(&chunk, payload.data() + 8, 8);
      if (chunk >= 0 && !filter->Keeps(placement::ChunkSlot(table_id, chunk))) continue;
    }
    if (BlockCrc(kind, len, payload.data()) != crc) return DataLossError(where + ": checksum mismatch");
    Reader r(payload, where);
    if (kind == kPrevious) {
      if (!delta || blocks != 1) return DataLossError(where + ": a predecessor block outside a delta's first block");
      file->previous.emplace();
      FERRY_RETURN_IF_ERROR(ParsePrevious(r, where, &*file->previous));
      continue;
    }
    if (kind == kEnd) {
      int64_t count = 0;
      FERRY_RETURN_IF_ERROR(r.Get(&count));
      if (count != blocks - 1)
        return DataLossError(where + ": the end block counts " + std::to_string(count) + " blocks");
      if (at != all.size()) return DataLossError(where + ": bytes after the end block");
      for (const auto& [id, t] : out->tables) {
        if (!delta && t.spec.disk_tier && t.disk_stores.empty()) {
          return DataLossError(name + ": table '" + t.spec.name + "' has a disk tier and no copy of its store");
        }
      }
      return r.Done();
    }
    uint64_t table_id = 0;
    FERRY_RETURN_IF_ERROR(r.Get(&table_id));
    auto& t = out->tables[table_id];
    if (kind == kDiskStore) {
      std::string folder;
      FERRY_RETURN_IF_ERROR(ParseDiskStore(r, path, where, file, &folder));
      if (!t.spec.disk_tier) return DataLossError(where + ": a disk tier store for a table without one");
      t.disk_stores.push_back(std::move(folder));
    } else if (kind == kWhole) {
      if (!delta) return DataLossError(where + ": a whole-table block in a full shard");
      FERRY_RETURN_IF_ERROR(r.Done());
      file->whole.insert(table_id);
    } else if (kind == kDeleted) {
      if (!delta) return DataLossError(where + ": a deletion block in a full shard");
      uint64_t n = 0;
      std::vector<int64_t> ids;
      FERRY_RETURN_IF_ERROR(r.Get(&n));
      FERRY_RETURN_IF_ERROR(r.GetArray(&ids, n));
      FERRY_RETURN_IF_ERROR(r.Done());
      auto& deleted = file->deleted[table_id];
      for (const int64_t id : ids) {
        if (!deleted.empty() && id <= deleted.back()) return DataLossError(where + ": deleted ids out of order");
        deleted.push_back(id);
      }
    } else if (kind == kTable) {
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
      if (filter != nullptr && !filter->ValuesOf(placement::ChunkSlot(table_id, chunk))) {
        // The version alone is kept; the sizes are still checked.
        FERRY_RETURN_IF_ERROR(r.Skip<float>(static_cast<uint64_t>(size)));
        FERRY_RETURN_IF_ERROR(r.Skip<float>(state_floats));
      } else {
        FERRY_RETURN_IF_ERROR(r.GetArray(&c.params, static_cast<uint64_t>(size)));
        FERRY_RETURN_IF_ERROR(r.GetArray(&c.state, state_floats));
      }
      FERRY_RETURN_IF_ERROR(r.Done());
      if (!t.chunks.emplace(chunk, std::move(c)).second)
        return DataLossError(where + ": chunk " + std::to_string(chunk) + " twice");
    } else if (kind == kSparseRows) {
      int64_t version = 0, row_floats = 0;
      uint64_t n = 0;
      std::vector<int64_t> ids, steps;
      FERRY_RETURN_IF_ERROR(r.Get(&version));
      FERRY_RETURN_IF_ERROR(r.Get(&row_floats));
      FERRY_RETURN_IF_ERROR(r.Get(&n));
      if (row_floats <= 0) return DataLossError(where + ": rows of " + std::to_string(row_floats) + " floats");
      FERRY_RETURN_IF_ERROR(r.GetArray(&ids, n));
      FERRY_RETURN_IF_ERROR(r.GetArray(&steps, n));
      if (n > len / static_cast<uint64_t>(row_floats)) return DataLossError(where + ": the block ends early");
      const size_t row_bytes = static_cast<size_t>(row_floats) * sizeof(float);
      std::span<const char> values;
      FERRY_RETURN_IF_ERROR(r.GetBytes(&values, n * row_bytes));
      FERRY_RETURN_IF_ERROR(r.Done());
      t.sparse_version = std::max(t.sparse_version, version);
      for (uint64_t i = 0; i < n; ++i) {
        const int slot = filter != nullptr ? placement::IdSlot(ids[i]) : 0;
        if (filter != nullptr && !filter->Keeps(slot)) continue;
        CheckpointData::Row row;
        row.steps = steps[i];
        if (filter == nullptr || filter->ValuesOf(slot)) {
          row.values.resize(static_cast<size_t>(row_floats));
          std::memcpy(row.values.data(), values.data() + i * row_bytes, row_bytes);
        }
        if (!t.rows.emplace(ids[i], std::move(row)).second)
          return DataLossError(where + ": id " + std::to_string(ids[i]) + " twice");
      }
    } else {
      return DataLossError(where + ": unknown block kind " + std::to_string(kind));
    }
  }
}

// A manifest's JSON, checked for shape (its files are not opened).
struct Manifest {
  uint32_t format = 0;
  int64_t step = 0;
  std::string meaning;
  std::vector<int64_t> worker_steps;
  std::vector<ShardFile> shards;  // with their chains
  bool before_slots = false;      // no "placement": written before 1.16
  std::shared_ptr<const placement::Placement> map;  // "placement_owners" (1.17): a map after a hand-over
};

// What a manifest's "placement" says: where its servers held chunks and rows.
constexpr const char* kPlacementBySlots = "slots-5040";
static_assert(placement::kSlots == 5040, "a new slot count is a new placement name");

// A list of workers' steps (integers in [-1, 2^62]) named `what`.
Status ParseSteps(const nlohmann::json& steps, const std::string& where, const char* what, std::vector<int64_t>* out) {
  if (!steps.is_array()) return DataLossError(where + ": " + what + " is not a list");
  for (const auto& w : steps) {
    if (!w.is_number_integer() || w.get<int64_t>() < -1 || w.get<int64_t>() > (int64_t{1} << 62)) {
      return DataLossError(where + ": " + what + " holds " + w.dump() + ", not an integer in [-1, 2^62]");
    }
    out->push_back(w.get<int64_t>());
  }
  return Status::Ok();
}

// A shard's entry; `top`: one of the manifest's shards (with its chain and its server's record
// of the workers' steps), not a link of a chain.
StatusOr<ShardFile> ShardEntry(const nlohmann::json& s, const std::string& where, bool chain, bool top = true) {
  ShardFile f{s.at("file").get<std::string>(), s.at("bytes").get<uint64_t>(), s.at("crc32").get<uint32_t>(),
              {}, {}, {}};
  if (f.name.empty() || f.name.find('/') != std::string::npos)
    return DataLossError(where + ": shard name '" + f.name + "' is not a file name");
  if (top && s.contains("worker_steps")) {
    FERRY_RETURN_IF_ERROR(ParseSteps(s.at("worker_steps"), where, "a shard's worker_steps", &f.worker_steps));
  }
  if (top && s.contains("table_steps")) {  // 1.25: {"<table id>": [steps by rank], ...}
    const auto& tables = s.at("table_steps");
    if (!tables.is_object()) return DataLossError(where + ": a shard's table_steps is not an object");
    for (const auto& [key, steps] : tables.items()) {
      uint64_t id = 0;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || key.empty() || (key[0] == '0' && key.size() > 1)) {
        return DataLossError(where + ": a shard's table_steps names '" + key + "', not a table id");
      }
      auto [at, fresh] = f.table_steps.try_emplace(id);
      if (!fresh) return DataLossError(where + ": a shard's table_steps names table id " + key + " twice");
      FERRY_RETURN_IF_ERROR(ParseSteps(steps, where, "a shard's table_steps", &at->second));
    }
  }
  if (!chain || !s.contains("base")) return f;
  if (!s.at("base").is_array() || s.at("base").empty())
    return DataLossError(where + ": the chain of " + f.name + " is not a list of files");
  for (const auto& b : s.at("base")) {
    FERRY_ASSIGN_OR_RETURN(ShardFile link, ShardEntry(b, where, /*chain=*/false, /*top=*/false));
    f.base.push_back(std::move(link));
  }
  return f;
}

StatusOr<Manifest> ParseManifest(const fs::path& dir, const std::string& manifest) {
  const std::string name = (dir / manifest).string();
  std::ifstream in(dir / manifest);
  if (!in) return NotFoundError(name + ": cannot open");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(name + ": not JSON (" + e.what() + ")");
  }
  Manifest out;
  try {
    out.format = j.at("format").get<uint32_t>();
    if (out.format != kCheckpointFormat && out.format != kCheckpointDeltaFormat) {
      return FailedPreconditionError(name + ": format " + j.at("format").dump() + ", this build reads " +
                                     std::to_string(kCheckpointFormat) + " and " +
                                     std::to_string(kCheckpointDeltaFormat));
    }
    out.step = j.at("step").get<int64_t>();
    out.meaning = j.at("meaning").get<std::string>();
    if (!j.contains("placement")) {
      out.before_slots = true;
    } else if (j.at("placement") != kPlacementBySlots) {
      return FailedPreconditionError(name + ": placement " + j.at("placement").dump() + ", this build knows \"" +
                                     kPlacementBySlots + "\" (and manifests without one, written before it)");
    }
    if (j.contains("worker_steps")) {
      FERRY_RETURN_IF_ERROR(ParseSteps(j.at("worker_steps"), name, "worker_steps", &out.worker_steps));
    }
    if (j.contains("placement_owners")) {
      const auto owners = j.at("placement_owners").get<std::vector<uint16_t>>();
      auto map = placement::Placement::FromOwners(j.at("placement_version").get<uint64_t>(), owners,
                                                  static_cast<int>(j.at("shards").size()));
      if (!map.ok()) return DataLossError(name + ": " + map.status().message());
      out.map = std::make_shared<const placement::Placement>(std::move(*map));
    }
    for (const auto& s : j.at("shards")) {
      FERRY_ASSIGN_OR_RETURN(ShardFile f, ShardEntry(s, name, out.format == kCheckpointDeltaFormat));
      out.shards.push_back(std::move(f));
    }
  } catch (const nlohmann::json::exception& e) {
    return DataLossError(name + ": " + e.what());
  }
  if (out.shards.empty()) return DataLossError(name + ": lists no shard");
  return out;
}

// Every file a manifest's checkpoint needs: its shards and their chains.
void AddFiles(const Manifest& m, std::set<std::string>* files) {
  for (const auto& s : m.shards) {
    files->insert(s.name);
    for (const auto& b : s.base) files->insert(b.name);
  }
}

// Adds `from` (one server's shard, or one shard's chain applied) to `into`, which holds the
// other servers' shards: no chunk or id may come twice, and a table is declared alike.
Status Merge(CheckpointData&& from, CheckpointData* into, const std::string& where) {
  for (auto& [id, t] : from.tables) {
    auto& to = into->tables[id];
    if (!to.spec.name.empty() && !t.spec.name.empty() && !(to.spec == t.spec)) {
      return DataLossError(where + ": table '" + t.spec.name + "' differs from another shard's declaration");
    }
    if (to.spec.name.empty()) to.spec = std::move(t.spec);
    to.chunks.merge(t.chunks);
    if (!t.chunks.empty()) {
      return DataLossError(where + ": table '" + to.spec.name + "' chunk " + std::to_string(t.chunks.begin()->first) +
                           " twice");
    }
    to.rows.merge(t.rows);
    if (!t.rows.empty()) {
      return DataLossError(where + ": table '" + to.spec.name + "' id " + std::to_string(t.rows.begin()->first) +
                           " twice");
    }
    to.sparse_version = std::max(to.sparse_version, t.sparse_version);
    to.disk_stores.insert(to.disk_stores.end(), t.disk_stores.begin(), t.disk_stores.end());
  }
  return Status::Ok();
}

bool SameFile(const ShardFile& a, const ShardFile& b) {
  return a.name == b.name && a.bytes == b.bytes && a.crc32 == b.crc32;
}

// One server's shard as its chain leaves it: the full file, then each delta in order (a dense
// chunk replaced, a sparse table's deleted ids removed and its changed rows put in). `from`
// (optional): the chain read before (with the same filter); when its files begin this one's,
// the read starts from what they left (taken out of it) and reads only the files after them.
StatusOr<CheckpointData> ReadChain(const fs::path& dir, const ShardFile& shard, const CheckpointFilter* filter,
                                   PreparedChains::Chain* from = nullptr) {
  std::vector<const ShardFile*> files;
  for (const auto& b : shard.base) files.push_back(&b);
  files.push_back(&shard);
  CheckpointData acc;
  size_t first = 0;
  if (from != nullptr && !from->files.empty() && from->files.size() <= files.size() &&
      std::equal(from->files.begin(), from->files.end(), files.begin(),
                 [](const ShardFile& a, const ShardFile* b) { return SameFile(a, *b); })) {
    acc = std::move(from->data);
    first = from->files.size();
    from->files.clear();
  }
  for (size_t i = first; i < files.size(); ++i) {
    const ShardFile& f = *files[i];
    FileData d;
    FERRY_RETURN_IF_ERROR(ReadShard(dir / f.name, f, filter, &d));
    const std::string name = (dir / f.name).string();
    if (i == 0) {
      if (d.previous) {
        return DataLossError(name + ": a delta (of " + d.previous->file.name + "), where its chain needs a full shard");
      }
      acc = std::move(d.data);
      continue;
    }
    const ShardFile& before = *files[i - 1];
    if (!d.previous) return DataLossError(name + ": a full shard where its chain needs a delta of " + before.name);
    if (d.previous->file.name != before.name || d.previous->file.bytes != before.bytes ||
        d.previous->file.crc32 != before.crc32) {
      return DataLossError(name + ": a delta of " + d.previous->file.name + " (" +
                           std::to_string(d.previous->file.bytes) + " bytes), where its chain has " + before.name +
                           " (" + std::to_string(before.bytes) + " bytes) before it");
    }
    for (auto& [id, t] : d.data.tables) {
      auto& to = acc.tables[id];
      if (!t.spec.name.empty()) to.spec = std::move(t.spec);
      for (auto& [index, chunk] : t.chunks) to.chunks.insert_or_assign(index, std::move(chunk));
      if (d.whole.contains(id)) to.rows.clear(), to.disk_stores.clear();  // held whole in this delta
      if (!t.disk_stores.empty()) to.disk_stores = std::move(t.disk_stores);
      if (auto del = d.deleted.find(id); del != d.deleted.end()) {
        for (const int64_t row : del->second) to.rows.erase(row);
      }
      for (auto& [row, values] : t.rows) to.rows.insert_or_assign(row, std::move(values));
      if (to.spec.type == TableType::kSparse) to.sparse_version = t.sparse_version;
    }
  }
  return acc;
}

// The shards of manifest `m` to read: every one, or with a filter those whose writers owned a
// slot it keeps.
std::vector<bool> ShardsToRead(const Manifest& m, const CheckpointFilter* filter) {
  const int num_servers = static_cast<int>(m.shards.size());
  std::vector<bool> read(m.shards.size(), true);
  if (filter != nullptr && !m.before_slots && num_servers >= 1 && num_servers <= placement::kSlots) {
    const placement::Placement written = m.map ? *m.map : placement::Placement::First(num_servers);
    if (written.num_servers() == num_servers) {
      read.assign(read.size(), false);
      for (int slot = 0; slot < placement::kSlots; ++slot) {
        if (filter->Keeps(slot)) read[static_cast<size_t>(written.SlotServer(slot))] = true;
      }
    }
  }
  if (filter != nullptr && !filter->KeepsAny()) read.assign(read.size(), false);  // (a manifest before slots too)
  return read;
}

// Reads and verifies one manifest and every shard it names (a delta with its whole chain), or
// those `filter` needs, from `prepared`'s chains where they fit (ReadCheckpointAt).
StatusOr<CheckpointData> ReadManifest(const fs::path& dir, const std::string& manifest,
                                      const CheckpointFilter* filter = nullptr, PreparedChains* prepared = nullptr) {
  const std::string name = (dir / manifest).string();
  FERRY_ASSIGN_OR_RETURN(Manifest m, ParseManifest(dir, manifest));
  const std::vector<bool> read = ShardsToRead(m, filter);
  if (prepared != nullptr && (filter == nullptr || !(prepared->filter == *filter))) prepared = nullptr;
  CheckpointData out;
  out.step = m.step;
  out.meaning = std::move(m.meaning);
  out.worker_steps = std::move(m.worker_steps);
  out.num_servers = static_cast<int>(m.shards.size());
  out.before_slots = m.before_slots;
  out.placement = std::move(m.map);
  out.manifest = manifest;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const ShardFile& s = m.shards[i];
    out.shard_worker_steps.push_back(s.worker_steps);
    out.shard_table_steps.push_back(s.table_steps);
    if (!read[i]) continue;
    PreparedChains::Chain* from = nullptr;
    if (prepared != nullptr) {
      if (auto it = prepared->shards.find(i); it != prepared->shards.end()) from = &it->second;
    }
    StatusOr<CheckpointData> shard = ReadChain(dir, s, filter, from);
    if (from != nullptr) {
      if (from->files.empty()) ++prepared->used;  // ReadChain took it
      prepared->shards.erase(i);  // taken, or of another chain: it serves no other read
    }
    FERRY_RETURN_IF_ERROR(shard.status());
    FERRY_RETURN_IF_ERROR(Merge(std::move(*shard), &out, (dir / s.name).string()));
  }
  for (const auto& [id, t] : out.tables) {
    if (t.spec.name.empty()) return DataLossError(name + ": table id " + std::to_string(id) + " has data but no spec");
  }
  return out;
}

}  // namespace

namespace {

// What one table puts in a snapshot.
struct TablePart {
  const Table* table = nullptr;
  std::vector<int64_t> chunks;                      // dense: the chunks copied
  std::vector<std::pair<int64_t, RowIndex>> rows;  // sparse: the rows copied, by id
  std::vector<int64_t> deleted;                     // sparse, delta: ids held at the predecessor, not now
  bool whole = false;                               // sparse, delta: copied whole (no count of changes)
};

TablePart Select(Table& t, bool delta, bool track) {
  TablePart p;
  p.table = &t;
  if (t.dense) {
    for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
      DenseChunk* c = t.dense->chunk(i);
      if (c == nullptr) continue;
      if (!delta || c->version != c->saved_version) p.chunks.push_back(i);
      c->saved_version = c->version;
    }
    return p;
  }
  SparseShard& s = *t.sparse;
  SparseShard::Changes changes;
  if (s.tracking()) changes = s.TakeChanges();  // (a full copy starts the count anew too)
  if (delta && s.tracking() && changes.complete) {
    p.rows = std::move(changes.rows);
    p.deleted = std::move(changes.deleted);
  } else {
    // A delta copies whole a table not counted since its predecessor: new since, or whose count
    // gave up (SparseShard::Changes::complete).
    p.whole = delta;
    // Rows never updated are left out: they hold their initial values, which a pull makes again
    // bit for bit. So a sync checkpoint of step t holds the same rows whichever workers had
    // pulled step t's new ids (creating them) when it was taken.
    p.rows.reserve(s.size());
    s.ForEachRow([&](int64_t id, RowIndex r) {
      if (s.steps(r) > 0) p.rows.emplace_back(id, r);
    });
    if (track && !s.has_disk()) s.TrackChanges();  // (a table with a disk tier is always copied whole)
  }
  std::sort(p.rows.begin(), p.rows.end());  // the same rows give the same file
  return p;
}

}  // namespace

uint64_t DeltaBytes(const TableRegistry& tables) {
  uint64_t total = 0;
  tables.ForEach([&](const Table& t) {
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        const DenseChunk* c = t.dense->chunk(i);
        if (c != nullptr && c->version != c->saved_version)
          total += (c->params.size() + c->state.size()) * sizeof(float) + 56;
      }
      return;
    }
    const SparseShard& s = *t.sparse;
    const uint64_t rows = s.tracking() && s.changes_complete() ? s.ChangedRowsBound() : s.size();
    total += rows * (16 + static_cast<uint64_t>(s.row_floats()) * sizeof(float));
  });
  return total;
}

namespace {

// The shard file of `parts` (SnapshotShard; none: an empty shard).
ShardImage ImageOf(const std::vector<TablePart>& parts, const DeltaOf* delta, const DiskStoreCopy* disk) {
  ShardImage image;
  // Sizes first, so the image is allocated once (a large shard is copied at memory speed).
  size_t total = 16 + 16 + sizeof(int64_t);
  if (delta) total += 16 + 40 + delta->file.name.size();
  for (const TablePart& p : parts) {
    const Table& t = *p.table;
    total += 16 + 2 * sizeof(uint64_t) + 512 + t.spec.name.size() + 24;
    for (const int64_t i : p.chunks) {
      const DenseChunk* c = t.dense->chunk(i);
      total += 16 + 40 + (c->params.size() + c->state.size()) * sizeof(float);
    }
    if (t.sparse) {
      const size_t n = p.rows.size();
      total += (n / kRowsPerBlock + 1) * (16 + 32) +
               n * (2 * sizeof(int64_t) + static_cast<size_t>(t.sparse->row_floats()) * sizeof(float));
      total += (p.deleted.size() / kRowsPerBlock + 1) * (16 + 16) + p.deleted.size() * sizeof(int64_t);
      if (t.sparse->has_disk() && disk != nullptr) {
        total += 16 + 24 + disk->folder.size();
        for (const auto& [name, bytes] : disk->files) total += 16 + name.size();
      }
    }
  }
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
  const uint32_t header[2] = {delta ? kCheckpointDeltaFormat : kCheckpointFormat, 0};
  put(kMagic, sizeof kMagic);
  put(header, sizeof header);
  if (delta) {
    begin_block(kPrevious);
    put64(int64_t{delta->step});
    put64(uint64_t{delta->file.bytes});
    const uint32_t crc_and_zero[2] = {delta->file.crc32, 0};
    put(crc_and_zero, sizeof crc_and_zero);
    put64(uint64_t{delta->file.name.size()});
    put(delta->file.name.data(), delta->file.name.size());
    end_block();
  }
  for (const TablePart& p : parts) {
    const Table& t = *p.table;
    flatbuffers::FlatBufferBuilder fbb(256);
    fbb.Finish(wire::SpecToWire(fbb, t.spec));
    begin_block(kTable);
    put64(uint64_t{t.id});
    put64(uint64_t{fbb.GetSize()});
    put(fbb.GetBufferPointer(), fbb.GetSize());
    end_block();
    for (const int64_t i : p.chunks) {
      const DenseChunk* c = t.dense->chunk(i);
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
    if (!t.sparse) continue;
    const SparseShard& s = *t.sparse;
    if (p.whole) {
      begin_block(kWhole);
      put64(uint64_t{t.id});
      end_block();
    }
    for (size_t b = 0; b < p.deleted.size(); b += kRowsPerBlock) {
      const size_t e = std::min(p.deleted.size(), b + kRowsPerBlock);
      begin_block(kDeleted);
      put64(uint64_t{t.id});
      put64(uint64_t{e - b});
      put(p.deleted.data() + b, (e - b) * sizeof(int64_t));
      end_block();
    }
    const size_t row_bytes = static_cast<size_t>(s.row_floats()) * sizeof(float);
    for (size_t b = 0; b < p.rows.size() || b == 0; b += kRowsPerBlock) {
      const size_t e = std::min(p.rows.size(), b + kRowsPerBlock);
      begin_block(kSparseRows);
      put64(uint64_t{t.id});
      put64(int64_t{s.version});
      put64(int64_t{s.row_floats()});
      put64(uint64_t{e - b});
      for (size_t i = b; i < e; ++i) put64(int64_t{p.rows[i].first});
      for (size_t i = b; i < e; ++i) put64(int64_t{s.steps(p.rows[i].second)});
      for (size_t i = b; i < e; ++i) put(s.row(p.rows[i].second), row_bytes);
      end_block();
      if (p.rows.empty()) break;
    }
    if (s.has_disk()) {
      if (disk == nullptr) throw std::logic_error("SnapshotShard: a table with a disk tier and no copy of its store");
      begin_block(kDiskStore);
      put64(uint64_t{t.id});
      put64(uint64_t{disk->folder.size()});
      put(disk->folder.data(), disk->folder.size());
      put64(uint64_t{disk->files.size()});
      for (const auto& [name, bytes] : disk->files) {
        put64(uint64_t{bytes});
        put64(uint64_t{name.size()});
        put(name.data(), name.size());
      }
      end_block();
    }
  }
  const int64_t blocks = static_cast<int64_t>(image.blocks.size());
  begin_block(kEnd);
  put64(blocks);
  end_block();
  return image;
}

}  // namespace

ShardImage SnapshotShard(TableRegistry& tables, const DeltaOf* delta, bool track, const DiskStoreCopy* disk) {
  std::vector<TablePart> parts;
  tables.ForEach([&](Table& t) { parts.push_back(Select(t, delta != nullptr, track)); });
  return ImageOf(parts, delta, disk);
}

ShardImage EmptyShard() { return ImageOf({}, nullptr, nullptr); }

ShardImage CopyShard(const TableRegistry& tables) {
  std::vector<TablePart> parts;
  tables.ForEach([&](const Table& t) {
    TablePart& p = parts.emplace_back();
    p.table = &t;
    if (t.dense) {
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (t.dense->chunk(i) != nullptr) p.chunks.push_back(i);
      }
      return;
    }
    const SparseShard& sh = *t.sparse;
    p.rows.reserve(sh.size());
    sh.ForEachRow([&](int64_t id, RowIndex r) {
      if (sh.steps(r) > 0) p.rows.emplace_back(id, r);  // (as Select: a row never updated is its id's)
    });
    std::sort(p.rows.begin(), p.rows.end());
  });
  ShardImage image = ImageOf(parts, nullptr, nullptr);
  SealImage(image);
  return image;
}

StatusOr<CheckpointData> ParseShardImage(std::span<const char> bytes, const std::string& name) {
  FileData file;
  FERRY_RETURN_IF_ERROR(ParseShard(bytes, fs::path(name), nullptr, &file));
  if (file.previous) return DataLossError(name + ": a delta, not a whole shard");
  file.data.manifest = name;
  return std::move(file.data);
}

uint32_t SealImage(ShardImage& image) {
  auto& bytes = image.bytes;
  // One CRC pass over each payload gives both its block's CRC (over kind, length, payload) and
  // the whole file's (over every byte, block headers included), joined with crc32_combine.
  size_t covered = image.blocks.empty() ? bytes.size() : image.blocks[0];
  uint32_t file_crc = Crc32(0, bytes.data(), covered);
  for (const size_t at : image.blocks) {
    uint32_t kind = 0;
    uint64_t len = 0;
    std::memcpy(&kind, bytes.data() + at, sizeof kind);
    std::memcpy(&len, bytes.data() + at + 8, sizeof len);
    const uint32_t payload = Crc32(0, bytes.data() + at + 16, static_cast<size_t>(len));
    const uint32_t crc = BlockCrc(kind, len, payload);
    std::memcpy(bytes.data() + at + 4, &crc, sizeof crc);
    file_crc = Crc32(file_crc, bytes.data() + at, 16);
    file_crc = static_cast<uint32_t>(crc32_combine(file_crc, payload, static_cast<z_off_t>(len)));
    covered = at + 16 + static_cast<size_t>(len);
  }
  if (covered != bytes.size()) std::abort();  // SnapshotShard lays the blocks end to end, to the end
  return file_crc;
}

StatusOr<ShardFile> WriteShardImage(const std::string& dir, int rank, int num_servers, int64_t step, ShardImage image) {
  const uint32_t file_crc = SealImage(image);
  auto& bytes = image.bytes;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
  ShardFile out{ShardName(step, rank, num_servers), 0, 0, {}, {}, {}};
  AtomicFile f((fs::path(dir) / out.name).string());
  FERRY_RETURN_IF_ERROR(f.Open());
  FERRY_RETURN_IF_ERROR(f.Write(bytes.data(), bytes.size()));
  out.bytes = f.bytes();
  out.crc32 = file_crc;
  FERRY_RETURN_IF_ERROR(f.Commit());
  return out;
}

StatusOr<DiskStoreCopy> CopyDiskTier(DiskTier& disk, const std::string& dir, int rank, int num_servers, int64_t step) {
  DiskStoreCopy copy;
  char gen[32];
  std::snprintf(gen, sizeof gen, "%016llx",
                static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count()));
  copy.folder = DiskFolderPrefix(ShardName(step, rank, num_servers)) + gen;
  const fs::path path = fs::path(dir) / copy.folder;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return InternalError("cannot create the checkpoint folder " + dir + ": " + ec.message());
  // RocksDB builds its copy in <path>.tmp and renames it: both must be free.
  for (const fs::path& p : {path, fs::path(path.string() + ".tmp")}) {
    fs::remove_all(p, ec);
    if (ec) return InternalError("cannot remove " + p.string() + ", left by an earlier checkpoint: " + ec.message());
  }
  if (Status s = disk.Checkpoint(path.string()); !s.ok()) {
    fs::remove_all(path, ec);
    return s;
  }
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    const uint64_t bytes = it->file_size(ec);
    if (ec) break;
    copy.files.emplace_back(it->path().filename().string(), bytes);
  }
  if (ec) return InternalError("cannot list the disk tier's copy " + path.string() + ": " + ec.message());
  std::sort(copy.files.begin(), copy.files.end());
  return copy;
}

StatusOr<ShardFile> WriteShard(const std::string& dir, int rank, int num_servers, int64_t step,
                               TableRegistry& tables, const DeltaOf* delta, bool track) {
  bool disk_tables = false;
  tables.ForEach([&](const Table& t) { disk_tables = disk_tables || (t.sparse && t.sparse->has_disk()); });
  std::optional<DiskStoreCopy> copy;
  if (disk_tables) {
    FERRY_ASSIGN_OR_RETURN(copy, CopyDiskTier(*tables.disk_tier(), dir, rank, num_servers, step));
  }
  auto f = WriteShardImage(dir, rank, num_servers, step, SnapshotShard(tables, delta, track, copy ? &*copy : nullptr));
  if (f.ok()) RemoveOtherDiskCopies(dir, f->name, copy ? copy->folder : std::string());
  return f;
}

Status ForEachDiskRow(const CheckpointData::Table& t, uint64_t table_id,
                      const std::function<Status(int64_t id, int64_t steps, const float* row)>& fn) {
  const int64_t row_floats = t.spec.dim * (1 + StateSlots(t.spec.optimizer.type));
  for (const std::string& dir : t.disk_stores) {
    std::unique_ptr<DiskTier> store;
    FERRY_RETURN_IF_ERROR(DiskTier::OpenReadOnly(dir, &store));
    Status s = store->AddTable(table_id, t.spec.name, row_floats);
    if (s.code() == StatusCode::kNotFound) continue;  // that server had no row of it on disk
    FERRY_RETURN_IF_ERROR(s);
    FERRY_RETURN_IF_ERROR(store->ForEachRow(table_id, [&](int64_t id, int64_t steps, const float* row) {
      if (t.rows.contains(id)) return Status::Ok();  // its RAM row at the checkpoint is the newer
      return fn(id, steps, row);
    }));
  }
  return Status::Ok();
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

StatusOr<ShardFile> WithChain(const std::string& dir, ShardFile shard) {
  const std::string name = (fs::path(dir) / shard.name).string();
  std::ifstream in(fs::path(dir) / shard.name, std::ios::binary);
  if (!in) return FailedPreconditionError(name + ": cannot open (" + std::strerror(errno) + ")");
  char head[32];
  if (!in.read(head, sizeof head)) return DataLossError(name + ": shorter than a shard's header");
  uint32_t format = 0;
  std::memcpy(&format, head + 8, 4);
  if (std::memcmp(head, kMagic, 8) != 0) return DataLossError(name + ": not a Ferry checkpoint shard");
  shard.base.clear();
  if (format != kCheckpointDeltaFormat) return shard;  // a full shard (ReadShard checks the rest)
  uint32_t kind = 0, crc = 0;
  uint64_t len = 0;
  std::memcpy(&kind, head + 16, 4);
  std::memcpy(&crc, head + 20, 4);
  std::memcpy(&len, head + 24, 8);
  if (kind != kPrevious || len > kMaxPreviousBlock) {
    return DataLossError(name + ": a delta shard whose first block does not name its predecessor");
  }
  std::vector<char> payload(static_cast<size_t>(len));
  if (!in.read(payload.data(), static_cast<std::streamsize>(len)) || BlockCrc(kind, len, payload.data()) != crc) {
    return DataLossError(name + ": the block naming its predecessor does not verify");
  }
  Reader r(payload, name + " block 0");
  DeltaOf previous;
  FERRY_RETURN_IF_ERROR(ParsePrevious(r, name + " block 0", &previous));
  const std::string listing = ManifestName(previous.step);
  auto m = ParseManifest(dir, listing);
  if (!m.ok()) {
    return FailedPreconditionError(name + " is a delta of " + previous.file.name + ", but the checkpoint of step " +
                                   std::to_string(previous.step) + " cannot be read: " + m.status().message());
  }
  if (previous.file.name == shard.name) {
    return FailedPreconditionError(name + " is a delta of its own name (its step saved again over the file it was "
                                   "written over)");
  }
  for (const ShardFile& s : m->shards) {
    if (s.name != previous.file.name) continue;
    if (s.bytes != previous.file.bytes || s.crc32 != previous.file.crc32) break;
    shard.base = s.base;
    ShardFile link = s;
    link.base.clear();
    shard.base.push_back(std::move(link));
    return shard;
  }
  return FailedPreconditionError(name + " is a delta of " + previous.file.name + " (" +
                                 std::to_string(previous.file.bytes) + " bytes), which " + listing +
                                 " does not list as such");
}

Status WriteManifest(const std::string& dir, int64_t step, const std::vector<ShardFile>& shards,
                     const std::string& meaning, int keep, const std::vector<int64_t>& worker_steps,
                     const placement::Placement* map) {
  const bool chains = std::ranges::any_of(shards, [](const ShardFile& s) { return !s.base.empty(); });
  auto entry = [](const ShardFile& s) {
    return nlohmann::ordered_json{{"file", s.name}, {"bytes", s.bytes}, {"crc32", s.crc32}};
  };
  nlohmann::ordered_json j;
  j["format"] = chains ? kCheckpointDeltaFormat : kCheckpointFormat;
  j["step"] = step;
  j["meaning"] = meaning;
  j["placement"] = kPlacementBySlots;
  // (Version 1 of every server: the first map of the shards' count, which a reader knows.)
  if (map != nullptr && (map->version() > 1 || map->ActiveServers() < map->num_servers())) {
    j["placement_version"] = map->version();
    j["placement_owners"] = map->Owners();
  }
  if (!worker_steps.empty()) j["worker_steps"] = worker_steps;
  j["shards"] = nlohmann::ordered_json::array();
  for (const auto& s : shards) {
    nlohmann::ordered_json e = entry(s);
    if (!s.worker_steps.empty()) e["worker_steps"] = s.worker_steps;
    if (!s.table_steps.empty()) {
      nlohmann::ordered_json tables = nlohmann::ordered_json::object();
      for (const auto& [id, steps] : s.table_steps) tables[std::to_string(id)] = steps;
      e["table_steps"] = std::move(tables);
    }
    if (!s.base.empty()) {
      e["base"] = nlohmann::ordered_json::array();
      for (const auto& b : s.base) e["base"].push_back(entry(b));
    }
    j["shards"].push_back(std::move(e));
  }
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
  // Keep the newest `keep` manifests and the files their chains need; remove the rest (a
  // manifest all of whose files are needed stays: an earlier point of a kept chain).
  const std::vector<std::string> manifests = ManifestsNewestFirst(dir);
  const size_t kept = std::min(manifests.size(), static_cast<size_t>(std::max(keep, 1)));
  std::set<std::string> needed;
  for (size_t i = 0; i < kept; ++i) {
    auto k = ParseManifest(dir, manifests[i]);
    if (!k.ok()) return Status::Ok();  // its chain is unknown: remove nothing it might need
    AddFiles(*k, &needed);
  }
  for (size_t i = kept; i < manifests.size(); ++i) {
    std::set<std::string> files;
    if (auto old = ParseManifest(dir, manifests[i]); old.ok()) AddFiles(*old, &files);
    if (!files.empty() && std::ranges::includes(needed, files)) continue;
    std::error_code ec;
    fs::remove(fs::path(dir) / manifests[i], ec);
  }
  // Then every shard file of an earlier step that no kept checkpoint needs: those of the removed
  // manifests, a chain's files left when the manifests naming them went (its servers at other
  // points of their chains), and the shards of checkpoints never committed. (No shard of a later
  // step is being written: the next checkpoint is asked for once this commit is done.)
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    int64_t of = -1;
    if (n.size() < 26 || !n.starts_with("step-") || n[25] != '-' || n.ends_with(".tmp") || Needed(needed, n)) continue;
    const auto [end, err] = std::from_chars(n.data() + 5, n.data() + 25, of);
    if (err == std::errc() && end == n.data() + 25 && of < step) fs::remove_all(e.path(), ec);
  }
  return Status::Ok();
}

void RemoveOtherDiskCopies(const std::string& dir, const std::string& shard, const std::string& keep) {
  const std::string prefix = DiskFolderPrefix(shard);
  std::error_code ec;
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(prefix) && n != keep) old.push_back(e.path());
  }
  for (const fs::path& p : old) fs::remove_all(p, ec);
}

std::vector<int64_t> MakeRoom(const std::string& dir, int rank, int keep, const std::string& spare) {
  std::vector<int64_t> removed;
  if (keep < 2) return removed;
  const std::vector<std::string> manifests = ManifestsNewestFirst(dir);
  std::set<std::string> needed;  // by the chains of the checkpoints the next commit keeps
  for (size_t i = 0; i < manifests.size() && i < static_cast<size_t>(keep - 1); ++i) {
    auto k = ParseManifest(dir, manifests[i]);
    if (!k.ok()) return removed;  // its chain is unknown: remove nothing it might need
    AddFiles(*k, &needed);
  }
  char mine[32];
  std::snprintf(mine, sizeof mine, "shard-%05d-of-", rank);
  for (size_t i = static_cast<size_t>(keep - 1); i < manifests.size(); ++i) {
    const std::string prefix = "step-" + manifests[i].substr(9) + "-" + mine;
    std::error_code ec;
    bool any = false;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with(prefix) && !Needed(needed, n) && n != spare) any = fs::remove_all(e.path(), ec) > 0 || any;
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

bool CheckpointFilter::KeepsAny() const { return std::ranges::find(slots, true) != slots.end(); }

namespace {

// OK when `dir` keeps a checkpoint of `step` and `filter` (optional) has a slot count.
Status CheckReadable(const std::string& dir, int64_t step, const CheckpointFilter* filter) {
  FERRY_ASSIGN_OR_RETURN(KeptCheckpoints kept, ListCheckpoints(dir));
  if (std::ranges::find(kept.steps, step) == kept.steps.end()) {
    std::string steps;
    for (int64_t s : kept.steps) steps += (steps.empty() ? "" : ", ") + std::to_string(s);
    return NotFoundError("no checkpoint of step " + std::to_string(step) + " in " + dir +
                         (steps.empty() ? " (it keeps none)" : " (it keeps steps " + steps + ")"));
  }
  if (filter != nullptr && (filter->slots.size() != static_cast<size_t>(placement::kSlots) ||
                            (!filter->versions_only.empty() &&
                             filter->versions_only.size() != static_cast<size_t>(placement::kSlots)))) {
    return InvalidArgumentError("a checkpoint filter of " + std::to_string(filter->slots.size()) + " and " +
                                std::to_string(filter->versions_only.size()) + " slots, not " +
                                std::to_string(placement::kSlots));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<CheckpointData> ReadCheckpointAt(const std::string& dir, int64_t step, const CheckpointFilter* filter,
                                          PreparedChains* prepared) {
  FERRY_RETURN_IF_ERROR(CheckReadable(dir, step, filter));
  return ReadManifest(dir, ManifestName(step), filter, prepared);
}

int64_t PreparedChains::Bytes() const {
  int64_t bytes = 0;
  for (const auto& [rank, chain] : shards) {
    for (const auto& [id, t] : chain.data.tables) {
      for (const auto& [index, c] : t.chunks) {
        bytes += static_cast<int64_t>((c.params.size() + c.state.size()) * sizeof(float)) + 64;
      }
      for (const auto& [row, r] : t.rows) bytes += static_cast<int64_t>(r.values.size() * sizeof(float)) + 64;
    }
  }
  return bytes;
}

StatusOr<PreparedChains> PrepareChains(const std::string& dir, int64_t step, const CheckpointFilter& filter) {
  FERRY_RETURN_IF_ERROR(CheckReadable(dir, step, &filter));
  FERRY_ASSIGN_OR_RETURN(Manifest m, ParseManifest(dir, ManifestName(step)));
  const std::vector<bool> read = ShardsToRead(m, &filter);
  PreparedChains out;
  out.step = step;
  out.filter = filter;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (!read[i]) continue;
    const ShardFile& s = m.shards[i];
    FERRY_ASSIGN_OR_RETURN(CheckpointData data, ReadChain(dir, s, &filter));
    PreparedChains::Chain& chain = out.shards[i];
    chain.files = s.base;
    chain.files.push_back(s);
    chain.files.back().base.clear();
    chain.data = std::move(data);
  }
  return out;
}

namespace {

// The replay floors of async/ssp table `table_id` in `ckpt`, by the rank of each server that wrote
// it, by worker rank: the record of that table's share there where the shard has table_steps
// (1.25; a share it has none of took no push: no floor), else that server's record of the
// workers' steps (before 1.25, the same for every table: a shard of an older server, or of a
// server with no async table); empty where it recorded none for this job's workers.
std::vector<std::vector<int64_t>> FloorsOf(const CheckpointData& ckpt, uint64_t table_id, int num_workers) {
  std::vector<std::vector<int64_t>> floors(ckpt.shard_worker_steps.size());
  for (size_t i = 0; i < floors.size(); ++i) {
    const std::vector<int64_t>* steps = &ckpt.shard_worker_steps[i];
    if (i < ckpt.shard_table_steps.size() && !ckpt.shard_table_steps[i].empty()) {
      const auto it = ckpt.shard_table_steps[i].find(table_id);
      if (it == ckpt.shard_table_steps[i].end()) continue;
      steps = &it->second;
    }
    if (steps->size() == static_cast<size_t>(num_workers)) floors[i] = *steps;
  }
  return floors;
}

// The replay floors of async/ssp table `table_id` restored from `ckpt` (Table::Replay, FloorsOf);
// none where no shard recorded any for this job's workers.
std::optional<Table::Replay> ReplayOf(const CheckpointData& ckpt, uint64_t table_id, int num_workers) {
  if (static_cast<int>(ckpt.shard_worker_steps.size()) != ckpt.num_servers) return std::nullopt;
  Table::Replay replay;
  replay.servers = ckpt.num_servers;
  replay.before_slots = ckpt.before_slots;
  replay.map = ckpt.placement;
  replay.floors = FloorsOf(ckpt, table_id, num_workers);
  replay.until.assign(static_cast<size_t>(num_workers), -1);
  bool any = false;
  for (const auto& steps : replay.floors) {
    for (size_t w = 0; w < steps.size(); ++w) replay.until[w] = std::max(replay.until[w], steps[w]);
    any = any || !steps.empty();
  }
  if (!any) return std::nullopt;
  return replay;
}

// A part restored or taken over from a checkpoint took what its share there had taken (`floors`,
// by worker rank; FloorsOf): a checkpoint saved before the replay is over records it again
// (TakenByTable), not nothing.
void CarryFloors(const std::vector<int64_t>& floors, StepsTaken* s) {
  for (size_t w = 0; w < floors.size(); ++w) {
    if (floors[w] > 0) s->Took(static_cast<int>(w), floors[w] - 1);
  }
}

// A sparse share whose rows come from the shares of `owners` (by rank in `floors`) besides its
// own: by worker, the lowest of their floors and of what it had taken is what it took of every
// row (a checkpoint before the replay ends may apply one row's step twice, never lose one).
void CarryLowestFloors(const std::vector<std::vector<int64_t>>& floors, const std::set<int>& owners, int num_workers,
                       StepsTaken* s) {
  for (int w = 0; w < num_workers; ++w) {
    int64_t lowest = -1;
    for (const int owner : owners) {
      if (owner < 0 || static_cast<size_t>(owner) >= floors.size()) continue;
      const auto& f = floors[static_cast<size_t>(owner)];
      // (0: no push of the worker reached that share: its rows put no bound.)
      const int64_t floor = static_cast<size_t>(w) < f.size() ? f[static_cast<size_t>(w)] : 0;
      if (floor > 0 && (lowest < 0 || floor < lowest)) lowest = floor;
    }
    if (lowest < 0) continue;
    if (static_cast<size_t>(w) >= s->taken.size()) s->taken.resize(static_cast<size_t>(w) + 1, 0);
    int64_t& own = s->taken[static_cast<size_t>(w)];
    own = own > 0 ? std::min(own, lowest) : lowest;
  }
}

}  // namespace

Status RestoreShard(const CheckpointData& ckpt, int rank, int num_workers, TableRegistry* tables) {
  for (const auto& [id, t] : ckpt.tables) {
    FERRY_RETURN_IF_ERROR(tables->Create(t.spec, id, num_workers));
    FERRY_ASSIGN_OR_RETURN(Table * restored, tables->Find(id, t.spec.type));
    restored->settings_open = true;
    std::optional<Table::Replay> replay;
    if (t.spec.consistency != Consistency::kSync) replay = ReplayOf(ckpt, id, num_workers);
    restored->replay = replay;
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
        c->replay_owner = replay ? replay->ChunkServer(id, i) : -1;
        if (replay) CarryFloors(replay->floors[static_cast<size_t>(c->replay_owner)], &c->steps_taken);
      }
    } else {
      FERRY_ASSIGN_OR_RETURN(Table * table, tables->Find(id, TableType::kSparse));
      SparseShard& s = *table->sparse;
      for (const auto& [row_id, row] : t.rows) {
        if (tables->placement().IdServer(row_id) != rank) continue;
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
      if (replay) {
        std::set<int> owners;
        for (int owner = 0; owner < replay->servers; ++owner) owners.insert(owner);
        CarryLowestFloors(replay->floors, owners, num_workers, &s.steps_taken);
      }
      // The rows beyond the RAM tiers go from the checkpoint's copies of the stores into this
      // server's store (its own ids), in batches: never more than a batch in RAM.
      if (!t.disk_stores.empty()) {
        DiskTier* disk = tables->disk_tier();  // Create refused the table without one
        const uint64_t table_id = id;          // (a lambda may not capture a structured binding)
        constexpr size_t kBatch = 4096;
        std::vector<int64_t> ids, steps;
        std::vector<float> rows;
        auto flush = [&]() -> Status {
          Status w = ids.empty() ? Status::Ok() : disk->Write(table_id, ids, steps, rows.data());
          ids.clear(), steps.clear(), rows.clear();
          return w;
        };
        FERRY_RETURN_IF_ERROR(ForEachDiskRow(t, id, [&](int64_t row_id, int64_t row_steps, const float* row) {
          if (tables->placement().IdServer(row_id) != rank) return Status::Ok();
          ids.push_back(row_id);
          steps.push_back(row_steps);
          rows.insert(rows.end(), row, row + s.row_floats());
          return ids.size() < kBatch ? Status::Ok() : flush();
        }));
        FERRY_RETURN_IF_ERROR(flush());
      }
    }
  }
  return Status::Ok();
}

std::map<uint64_t, std::vector<int64_t>> TakenByTable(const TableRegistry& tables, int num_workers) {
  std::map<uint64_t, std::vector<int64_t>> out;
  const auto n = static_cast<size_t>(std::max(num_workers, 0));
  auto taken = [](const StepsTaken& s, size_t r) { return r < s.taken.size() ? s.taken[r] : 0; };
  tables.ForEach([&](const Table& t) {
    if (t.spec.consistency == Consistency::kSync) return;
    std::vector<int64_t> steps(n, 0);
    if (t.sparse) {
      for (size_t r = 0; r < n; ++r) steps[r] = taken(t.sparse->steps_taken, r);
    } else {
      // The lowest over its chunks: a step one chunk took and another did not (chunks restored
      // from several servers' shares) is replayed, and skipped where it was taken, never lost.
      bool held = false;
      for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
        if (const DenseChunk* c = t.dense->chunk(i)) {
          for (size_t r = 0; r < n; ++r) {
            const int64_t t_r = taken(c->steps_taken, r);
            steps[r] = held ? std::min(steps[r], t_r) : t_r;
          }
          held = true;
        }
      }
      if (!held) return;
    }
    out.emplace(t.id, std::move(steps));
  });
  return out;
}

int64_t WholeStep(int64_t done, int rank, const std::map<uint64_t, std::vector<int64_t>>& taken) {
  if (done <= 0) return done;
  const auto r = static_cast<size_t>(rank);
  const bool lags =
      std::ranges::any_of(taken, [&](const auto& t) { return r < t.second.size() && t.second[r] < done; });
  return lags ? done - 1 : done;
}

CheckpointFilter HandOverFilter(const placement::Placement& now, const placement::Placement& next, int rank) {
  CheckpointFilter filter;
  filter.slots.resize(placement::kSlots);
  filter.versions_only.resize(placement::kSlots);
  for (int slot = 0; slot < placement::kSlots; ++slot) {
    const int from = now.SlotServer(slot), to = next.SlotServer(slot);
    filter.slots[static_cast<size_t>(slot)] = from != to && (from == rank || to == rank);
    filter.versions_only[static_cast<size_t>(slot)] = from != to && from == rank;
  }
  return filter;
}

StatusOr<HandOverCounts> HandOver(const CheckpointData& ckpt, const placement::Placement& next, int rank,
                                  int num_workers, TableRegistry* tables, bool check_only) {
  const placement::Placement& now = tables->placement();
  const std::string at = "the hand-over to placement version " + std::to_string(next.version()) + " from checkpoint " +
                         ckpt.manifest;
  if (next.num_servers() != now.num_servers()) {
    return FailedPreconditionError(at + ": it places over " + std::to_string(next.num_servers()) +
                                   " servers, this job has " + std::to_string(now.num_servers()));
  }
  if (tables->pending() > 0) return FailedPreconditionError(at + ": a table is still being declared here");
  // A server that neither gains nor gives up a slot only takes the map (it may have read no shard
  // of the checkpoint: HandOverFilter); the servers whose slots move check the tables.
  if (!HandOverFilter(now, next, rank).KeepsAny()) {
    if (!check_only) tables->SetPlacement(next);
    return HandOverCounts{};
  }
  // Checks, and what would move.
  bool joins = false;  // a server that owns no slot gains some
  for (int r = 0; r < now.num_servers(); ++r) joins = joins || (now.SlotsOf(r) == 0 && next.SlotsOf(r) > 0);
  HandOverCounts counts;
  int64_t bytes_in = 0, bytes_out = 0;
  Status refused = Status::Ok();
  auto refuse = [&](const std::string& why) {
    if (refused.ok()) refused = FailedPreconditionError(at + ": " + why);
  };
  size_t declared = 0;
  tables->ForEach([&](const Table& t) {
    ++declared;
    const std::string name = "table '" + t.spec.name + "'";
    auto it = ckpt.tables.find(t.id);
    if (it == ckpt.tables.end() || it->second.spec.type != t.spec.type) {
      return refuse(name + " is not in the checkpoint (declared after it)");
    }
    const CheckpointData::Table& saved = it->second;
    if (saved.spec.shape != t.spec.shape || saved.spec.dim != t.spec.dim ||
        saved.spec.optimizer.type != t.spec.optimizer.type) {
      return refuse(name + " has another shape, dimension or optimizer in the checkpoint");
    }
    if (t.dense) {
      if (t.feed_epoch != 0) return refuse(name + " has change-feed readers (they cannot follow a hand-over yet)");
      if (saved.spec.num_chunks() != t.spec.num_chunks() || saved.spec.chunk_elems != t.spec.chunk_elems) {
        return refuse(name + " is chunked otherwise in the checkpoint");
      }
      for (int64_t c = 0; c < t.dense->num_chunks(); ++c) {
        const bool here = now.ChunkServer(t.id, c) == rank, stays = next.ChunkServer(t.id, c) == rank;
        if (here == stays) continue;
        auto chunk = saved.chunks.find(c);
        if (chunk == saved.chunks.end()) return refuse(name + " chunk " + std::to_string(c) + " is not in it");
        if (stays) {
          const int64_t elems = DenseShard::ChunkElems(t.spec, c);
          if (static_cast<int64_t>(chunk->second.params.size()) != elems ||
              static_cast<int64_t>(chunk->second.state.size()) != elems * StateSlots(t.spec.optimizer.type)) {
            return refuse(name + " chunk " + std::to_string(c) + " has the wrong size in the checkpoint");
          }
          ++counts.chunks_taken;
          bytes_in += DenseShard::ChunkBytes(t.spec, c);
          continue;
        }
        const DenseChunk* held = t.dense->chunk(c);
        if (held == nullptr) {  // (a hand-over that ran out of memory half-way)
          return refuse(name + " chunk " + std::to_string(c) + " is missing here: restore the job");
        }
        if (held->sync.received > 0) return refuse(name + " chunk " + std::to_string(c) + " is in a sync step");
        if (held->version != chunk->second.version) {
          return refuse(name + " chunk " + std::to_string(c) + " is at version " + std::to_string(held->version) +
                        " here, " + std::to_string(chunk->second.version) +
                        " in the checkpoint (updated since: the workers must wait from the checkpoint to the "
                        "hand-over)");
        }
        ++counts.chunks_dropped;
        bytes_out += DenseShard::ChunkBytes(t.spec, c);
      }
      return;
    }
    if (t.feed_epoch != 0) return refuse(name + " has change-feed readers (they cannot follow a hand-over yet)");
    const SparseShard& s = *t.sparse;
    if (s.has_disk()) return refuse(name + " has a disk tier (its rows cannot be handed over yet)");
    if (s.sync.received > 0) return refuse(name + " is in a sync step");
    // A sync table is at the checkpoint's step on every server that owns slots, or a step ran
    // since: a server joining (one that owns none, 1.20) would take a stale step.
    if (joins && t.spec.consistency == Consistency::kSync && now.SlotsOf(rank) > 0 &&
        s.version != saved.sparse_version) {
      return refuse(name + " is at step " + std::to_string(s.version) + " here, " +
                    std::to_string(saved.sparse_version) +
                    " in the checkpoint (a step ran since: the workers must wait from the checkpoint to the "
                    "hand-over)");
    }
    // The rows it gives up against the checkpoint's, both in id order (one lookup a row in a map
    // of as many was most of a hand-over's time).
    std::vector<std::pair<int64_t, int64_t>> leaving;  // id, updates here
    s.ForEachRow([&](int64_t id, RowIndex r) {
      if (now.IdServer(id) != rank) return refuse(name + " id " + std::to_string(id) + " is held outside its slots");
      if (next.IdServer(id) != rank) leaving.emplace_back(id, s.steps(r));
    });
    if (!refused.ok()) return;
    std::ranges::sort(leaving);
    auto row = saved.rows.begin();
    for (const auto& [id, steps] : leaving) {
      while (row != saved.rows.end() && row->first < id) ++row;
      const int64_t saved_steps = row != saved.rows.end() && row->first == id ? row->second.steps : 0;
      if (steps != saved_steps) {
        return refuse(name + " id " + std::to_string(id) + " has " + std::to_string(steps) + " updates here, " +
                      std::to_string(saved_steps) +
                      " in the checkpoint (updated since: the workers must wait from the checkpoint to the "
                      "hand-over)");
      }
    }
    const auto rows_out = static_cast<int64_t>(leaving.size());
    counts.rows_dropped += rows_out;
    int64_t rows_in = 0;
    for (const auto& [id, row] : saved.rows) {
      if (next.IdServer(id) != rank || now.IdServer(id) == rank) continue;
      if (static_cast<int64_t>(row.values.size()) != s.row_floats()) {
        return refuse(name + " id " + std::to_string(id) + " has the wrong width in the checkpoint");
      }
      ++rows_in;
    }
    if (s.has_lifecycle() && t.spec.max_rows > 0 &&
        static_cast<int64_t>(s.size()) - rows_out + rows_in > t.spec.max_rows) {
      return refuse(name + " would hold more than its max_rows=" + std::to_string(t.spec.max_rows) + " rows here");
    }
    counts.rows_taken += rows_in;
    // A row that comes takes a free slot first (charged already): those of the rows that leave,
    // and those free before (evicted, or given up in an earlier hand-over). Only the rest is new
    // memory (what leaves frees no memory: its slot waits for the next row).
    const int64_t free_slots = static_cast<int64_t>(s.slots()) - static_cast<int64_t>(s.size()) + rows_out;
    bytes_in += std::max<int64_t>(0, rows_in - free_slots) * s.RowBytes();
  });
  FERRY_RETURN_IF_ERROR(refused);
  if (declared != ckpt.tables.size()) {
    return FailedPreconditionError(at + ": it holds " + std::to_string(ckpt.tables.size()) +
                                   " tables, this server " + std::to_string(declared) +
                                   " (declare every table of the job before a hand-over)");
  }
  const MemoryBudget& budget = tables->budget();
  if (bytes_in > bytes_out && budget.used() + (bytes_in - bytes_out) > budget.limit()) {
    return ResourceExhaustedError(at + ": server " + std::to_string(rank) + " would take " +
                                  std::to_string(bytes_in - bytes_out) + " more bytes; its memory budget has " +
                                  std::to_string(std::max<int64_t>(budget.limit() - budget.used(), 0)) + " left");
  }
  if (check_only) return counts;
  // What leaves goes first, so that what comes finds the memory the check counted on (a
  // lifecycle table's new row would otherwise make room by evicting one). Then what comes; only
  // running out of memory can fail there.
  tables->ForEach([&](Table& t) {
    if (t.dense) {
      for (int64_t c = 0; c < t.dense->num_chunks(); ++c) {
        if (now.ChunkServer(t.id, c) == rank && next.ChunkServer(t.id, c) != rank) {
          t.dense->Drop(c);
          tables->budget().Give(DenseShard::ChunkBytes(t.spec, c));
        }
      }
      return;
    }
    std::vector<int64_t> leaving;
    t.sparse->ForEachRow([&](int64_t id, RowIndex) {
      if (next.IdServer(id) != rank) leaving.push_back(id);
    });
    for (int64_t id : leaving) t.sparse->Forget(id);
  });
  try {
    tables->ForEach([&](Table& t) {
      const CheckpointData::Table& saved = ckpt.tables.at(t.id);
      // What the parts taken over had taken of each worker's steps, as their servers' shares
      // recorded it (async and ssp tables): carried, so that the next checkpoint records it.
      std::vector<std::vector<int64_t>> floors;
      if (t.spec.consistency != Consistency::kSync) floors = FloorsOf(ckpt, t.id, num_workers);
      auto floors_of = [&](int owner) -> const std::vector<int64_t>& {
        static const std::vector<int64_t> kNone;
        return static_cast<size_t>(owner) < floors.size() ? floors[static_cast<size_t>(owner)] : kNone;
      };
      if (t.dense) {
        for (int64_t c = 0; c < t.dense->num_chunks(); ++c) {
          if (now.ChunkServer(t.id, c) == rank || next.ChunkServer(t.id, c) != rank) continue;
          DenseChunk* taken = t.dense->Take(t.spec, t.id, c, num_workers);
          tables->budget().Force(DenseShard::ChunkBytes(t.spec, c));
          const CheckpointData::Chunk& from = saved.chunks.at(c);
          taken->params.Assign(from.params);
          taken->state = from.state;
          taken->version = from.version;
          std::fill(taken->last_pulled.begin(), taken->last_pulled.end(), taken->version);
          taken->replay_owner = t.replay ? t.replay->ChunkServer(t.id, c) : -1;
          CarryFloors(floors_of(now.ChunkServer(t.id, c)), &taken->steps_taken);
        }
        return;
      }
      SparseShard& s = *t.sparse;
      // A server that owned no slot heard none of the steps since (1.20: the workers send a sync
      // table's empty gradients only to the servers that own slots): it takes the checkpoint's
      // version, which the others hold too (a hand-over is at that step).
      if (now.SlotsOf(rank) == 0 && saved.sparse_version > s.version) {
        s.version = saved.sparse_version;
        std::fill(s.last_pulled.begin(), s.last_pulled.end(), s.version);
      }
      std::set<int> donors;
      for (const auto& [id, row] : saved.rows) {
        if (next.IdServer(id) != rank || now.IdServer(id) == rank) continue;
        const RowIndex r = s.FindOrCreate(id, /*over_budget_ok=*/true);
        std::copy(row.values.begin(), row.values.end(), s.row(r));
        s.steps(r) = row.steps;
        donors.insert(now.IdServer(id));
      }
      if (!floors.empty()) CarryLowestFloors(floors, donors, num_workers, &s.steps_taken);
    });
  } catch (const std::bad_alloc&) {
    // Half taken: this server holds neither map's share. It keeps the new map (what it holds is
    // a part of it) and says so; the job must restore from the checkpoint.
    tables->SetPlacement(next);
    return InternalError(at + ": server " + std::to_string(rank) +
                         " ran out of memory taking over its new slots; it holds part of them: restore the job "
                         "from that checkpoint");
  }
  tables->SetPlacement(next);
  return counts;
}

}  // namespace ferry::ps
