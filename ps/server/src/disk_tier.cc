// ps/server/src/disk_tier.cc — the disk tier's RocksDB store (internal/disk_tier.h).
#include "internal/disk_tier.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <thread>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

namespace ferry::ps {
namespace {

namespace fs = std::filesystem;

// Written into the store's folder when it is made: a folder holding it is Ferry's to wipe.
constexpr char kMarker[] = "FERRY_DISK_TIER";
constexpr size_t kStepsBytes = sizeof(int64_t);

std::string ColumnFamilyName(uint64_t table_id) { return std::string("t").append(std::to_string(table_id)); }

// Empties a folder earlier Ferry processes used as their store; refuses any other folder with files.
Status PrepareFolder(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return UnavailableError("disk tier " + path + ": cannot create the folder: " + ec.message());
  bool ours = fs::exists(fs::path(path) / kMarker, ec);
  std::vector<fs::path> entries;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  if (ec) return UnavailableError("disk tier " + path + ": cannot list the folder: " + ec.message());
  if (!entries.empty() && !ours) {
    return FailedPreconditionError(
        "disk tier " + path + ": the folder holds files that are not a Ferry disk tier's ('" +
        entries.front().filename().string() + "'): give --disk-tier-dir an empty or new folder");
  }
  for (const fs::path& p : entries) {
    fs::remove_all(p, ec);
    if (ec)
      return UnavailableError("disk tier " + path + ": cannot remove the earlier store's " + p.string() + ": " +
                              ec.message());
  }
  std::ofstream marker(fs::path(path) / kMarker);
  marker << "A Ferry server's disk tier: rows of sparse tables, wiped when a server opens it.\n";
  marker.close();
  if (!marker) return UnavailableError("disk tier " + path + ": cannot write " + kMarker);
  return Status::Ok();
}

int LatencyBucket(int64_t us) {
  if (us < 1) return 0;
  return std::min(DiskTier::Stats::kLatencyBuckets - 1, static_cast<int>(std::bit_width(static_cast<uint64_t>(us))));
}

}  // namespace

std::array<char, 8> DiskTier::Key(int64_t id) {
  uint64_t u = static_cast<uint64_t>(id) ^ (uint64_t{1} << 63);
  std::array<char, 8> key;
  for (int i = 7; i >= 0; --i, u >>= 8) key[static_cast<size_t>(i)] = static_cast<char>(u & 0xff);
  return key;
}

int64_t DiskTier::IdOfKey(const char* key) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(key[i]);
  return static_cast<int64_t>(u ^ (uint64_t{1} << 63));
}

Status DiskTier::Open(const Options& options, std::unique_ptr<DiskTier>* out) {
  if (options.path.empty()) return InvalidArgumentError("disk tier: no folder given");
  if (Status s = PrepareFolder(options.path); !s.ok()) return s;
  std::unique_ptr<DiskTier> tier(new DiskTier(options));

  rocksdb::BlockBasedTableOptions table;
  if (options.block_cache_bytes > 0) {
    tier->cache_ = rocksdb::NewLRUCache(static_cast<size_t>(options.block_cache_bytes));
    table.block_cache = tier->cache_;
    table.cache_index_and_filter_blocks = true;  // their memory is the cache's, bounded
    table.pin_l0_filter_and_index_blocks_in_cache = true;
  } else {
    table.no_block_cache = true;
  }
  table.block_align = options.align_blocks;
  if (options.bloom_bits_per_key > 0)
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(options.bloom_bits_per_key));
  rocksdb::Options o;
  o.create_if_missing = true;
  o.paranoid_checks = true;
  o.use_direct_reads = options.direct_reads;
  o.compression = rocksdb::kNoCompression;  // floats barely compress; a read then costs no decompression
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  o.max_background_jobs = 2;
  o.write_buffer_size = static_cast<size_t>(std::max<int64_t>(options.write_buffer_bytes, 1 << 20));
  // The bound holds for all tables together: past it RocksDB writes a table's buffer to a file, so a
  // server with many tables does not hold a buffer's worth of rows for each.
  o.db_write_buffer_size = o.write_buffer_size;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, options.path, &db);
  if (!s.ok()) return tier->Wrap(&s, nullptr, "opening the store");
  tier->db_.reset(db);
  tier->default_cf_ = db->DefaultColumnFamily();
  *out = std::move(tier);
  return Status::Ok();
}

Status DiskTier::OpenReadOnly(const std::string& dir, std::unique_ptr<DiskTier>* out) {
  Options options;
  options.path = dir;
  options.block_cache_bytes = 0;
  std::unique_ptr<DiskTier> tier(new DiskTier(options));
  tier->read_only_ = true;
  rocksdb::Options o;
  o.paranoid_checks = true;
  o.create_if_missing = false;
  o.max_open_files = 64;
  rocksdb::BlockBasedTableOptions table;
  table.no_block_cache = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  std::vector<std::string> names;
  rocksdb::Status s = rocksdb::DB::ListColumnFamilies(o, dir, &names);
  if (!s.ok()) {
    if (s.IsIOError() || s.IsNotFound()) s = rocksdb::Status::Corruption(s.ToString());  // a copy incomplete
    return tier->Wrap(&s, nullptr, "opening a checkpoint's copy of the store");
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs;
  for (const std::string& n : names) cfs.emplace_back(n, rocksdb::ColumnFamilyOptions(o));
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  s = rocksdb::DB::OpenForReadOnly(o, dir, cfs, &handles, &db);
  if (!s.ok()) {
    if (s.IsIOError() || s.IsNotFound()) s = rocksdb::Status::Corruption(s.ToString());
    return tier->Wrap(&s, nullptr, "opening a checkpoint's copy of the store");
  }
  tier->db_.reset(db);
  tier->default_cf_ = db->DefaultColumnFamily();
  tier->unclaimed_ = std::move(handles);
  *out = std::move(tier);
  return Status::Ok();
}

Status DiskTier::VerifyChecksums() {
  rocksdb::Status s = db_->VerifyChecksum();
  if (!s.ok()) return Wrap(&s, nullptr, "verifying its files' checksums");
  return Status::Ok();
}

DiskTier::DiskTier(Options options) : options_(std::move(options)) {}

DiskTier::~DiskTier() {
  if (!db_) return;
  MutexLock lock(&mu_);
  for (auto& [id, t] : tables_) db_->DestroyColumnFamilyHandle(t->cf);
  tables_.clear();
  for (rocksdb::ColumnFamilyHandle* h : unclaimed_) db_->DestroyColumnFamilyHandle(h);
  unclaimed_.clear();
  db_->Close().PermitUncheckedError();
}

Status DiskTier::Wrap(const void* rocksdb_status, const Table* t, const std::string& what) const {
  const auto& s = *static_cast<const rocksdb::Status*>(rocksdb_status);
  std::string m = "disk tier " + options_.path + (t ? ", table '" + t->name + "'" : std::string()) + ": " + what +
                  " failed: " + s.ToString();
  if (s.IsNoSpace()) return ResourceExhaustedError(m + " (the disk is full)");
  if (s.IsCorruption()) return DataLossError(m);
  if (s.IsIOError()) return UnavailableError(m);
  if (s.IsInvalidArgument()) return InvalidArgumentError(m);
  return InternalError(m);
}

DiskTier::Table* DiskTier::Find(uint64_t table_id, Status* s) {
  MutexLock lock(&mu_);
  for (auto& [id, t] : tables_) {
    if (id == table_id) return t.get();
  }
  *s = NotFoundError("disk tier " + options_.path + ": no table of id " + std::to_string(table_id));
  return nullptr;
}

Status DiskTier::AddTable(uint64_t table_id, const std::string& table, int64_t row_floats) {
  if (row_floats <= 0) return InvalidArgumentError("disk tier: table '" + table + "' has rows of no floats");
  MutexLock lock(&mu_);
  for (auto& [id, t] : tables_) {
    if (id == table_id) return AlreadyExistsError("disk tier " + options_.path + ": table '" + table + "' exists");
  }
  auto t = std::make_unique<Table>();
  t->name = table;
  t->row_floats = row_floats;
  if (read_only_) {
    auto it = std::find_if(unclaimed_.begin(), unclaimed_.end(),
                           [&](rocksdb::ColumnFamilyHandle* h) { return h->GetName() == ColumnFamilyName(table_id); });
    if (it == unclaimed_.end()) {
      return NotFoundError("disk tier " + options_.path + ": holds no rows of table '" + table + "'");
    }
    t->cf = *it;
    unclaimed_.erase(it);
    tables_.emplace_back(table_id, std::move(t));
    return Status::Ok();
  }
  rocksdb::ColumnFamilyOptions cfo(db_->GetOptions(default_cf_));
  rocksdb::Status s = db_->CreateColumnFamily(cfo, ColumnFamilyName(table_id), &t->cf);
  if (!s.ok()) return Wrap(&s, t.get(), "creating its column family");
  tables_.emplace_back(table_id, std::move(t));
  return Status::Ok();
}

Status DiskTier::DropTable(uint64_t table_id) {
  MutexLock lock(&mu_);
  auto it = std::find_if(tables_.begin(), tables_.end(), [&](const auto& e) { return e.first == table_id; });
  if (it == tables_.end())
    return NotFoundError("disk tier " + options_.path + ": no table of id " + std::to_string(table_id));
  rocksdb::Status s = db_->DropColumnFamily(it->second->cf);
  if (!s.ok()) return Wrap(&s, it->second.get(), "dropping its column family");
  db_->DestroyColumnFamilyHandle(it->second->cf);
  tables_.erase(it);
  return Status::Ok();
}

Status DiskTier::Write(uint64_t table_id, std::span<const int64_t> ids, std::span<const int64_t> steps,
                       const float* rows) {
  Status found;
  Table* t = Find(table_id, &found);
  if (t == nullptr) return found;
  if (steps.size() != ids.size())
    return InvalidArgumentError("disk tier: Write of " + std::to_string(ids.size()) + " ids with " +
                                std::to_string(steps.size()) + " steps");
  const size_t row_bytes = static_cast<size_t>(t->row_floats) * sizeof(float);
  rocksdb::WriteBatch batch;
  std::string value(kStepsBytes + row_bytes, '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t st = static_cast<uint64_t>(steps[i]);
    for (size_t b = 0; b < kStepsBytes; ++b) value[b] = static_cast<char>((st >> (8 * b)) & 0xff);
    std::memcpy(value.data() + kStepsBytes, rows + i * static_cast<size_t>(t->row_floats), row_bytes);
    const auto key = Key(ids[i]);
    rocksdb::Status s = batch.Put(t->cf, rocksdb::Slice(key.data(), key.size()), value);
    if (!s.ok()) return Wrap(&s, t, "batching rows");
  }
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;  // the store is the RAM tier's overflow; checkpoints keep the rows
  rocksdb::Status s = db_->Write(wo, &batch);
  if (!s.ok()) return Wrap(&s, t, "writing " + std::to_string(ids.size()) + " rows");
  rows_written_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return Status::Ok();
}

Status DiskTier::Decode(const Table& t, int64_t id, const char* data, size_t size, int64_t* steps, float* row) const {
  const size_t row_bytes = static_cast<size_t>(t.row_floats) * sizeof(float);
  if (size != kStepsBytes + row_bytes) {
    return DataLossError("disk tier " + options_.path + ", table '" + t.name + "': the row of id " +
                         std::to_string(id) + " holds " + std::to_string(size) + " bytes, not " +
                         std::to_string(kStepsBytes + row_bytes));
  }
  uint64_t st = 0;
  for (size_t b = 0; b < kStepsBytes; ++b) st |= static_cast<uint64_t>(static_cast<unsigned char>(data[b])) << (8 * b);
  *steps = static_cast<int64_t>(st);
  std::memcpy(row, data + kStepsBytes, row_bytes);
  return Status::Ok();
}

Status DiskTier::MultiGet(uint64_t table_id, std::span<const int64_t> ids, bool cached_only, float* rows,
                          int64_t* steps, std::vector<Lookup>* state, int64_t* found) {
  Status missing;
  Table* t = Find(table_id, &missing);
  if (t == nullptr) return missing;
  const size_t n = ids.size();
  *found = 0;
  if (cached_only && cache_ == nullptr) {  // without a block cache RocksDB reads the files even then
    state->assign(n, Lookup::kNeedsDisk);
    return Status::Ok();
  }
  state->assign(n, Lookup::kAbsent);
  std::vector<std::array<char, 8>> keys(n);
  std::vector<rocksdb::Slice> slices(n);
  for (size_t i = 0; i < n; ++i) {
    keys[i] = Key(ids[i]);
    slices[i] = rocksdb::Slice(keys[i].data(), keys[i].size());
  }
  std::vector<rocksdb::PinnableSlice> values(n);
  std::vector<rocksdb::Status> statuses(n);
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  if (cached_only) {
    // Incomplete where the disk would be read. One Get a key: RocksDB 7.8's batched MultiGet can
    // turn a table's Incomplete into OK (facebook/rocksdb#12462), and then reads the file.
    ro.read_tier = rocksdb::kBlockCacheTier;
    for (size_t i = 0; i < n; ++i) statuses[i] = db_->Get(ro, t->cf, slices[i], &values[i]);
  } else if (n > 0) {
    db_->MultiGet(ro, t->cf, n, slices.data(), values.data(), statuses.data(), /*sorted_input=*/false);
  }
  Status result;
  for (size_t i = 0; i < n && result.ok(); ++i) {
    if (statuses[i].IsNotFound()) continue;
    if (cached_only && statuses[i].IsIncomplete()) {
      (*state)[i] = Lookup::kNeedsDisk;
      continue;
    }
    if (!statuses[i].ok()) {
      result = Wrap(&statuses[i], t, "reading the row of id " + std::to_string(ids[i]));
      break;
    }
    result = Decode(*t, ids[i], values[i].data(), values[i].size(), &steps[i],
                    rows + i * static_cast<size_t>(t->row_floats));
    if (result.ok()) {
      (*state)[i] = Lookup::kFound;
      ++*found;
    }
  }
  if (!result.ok()) state->assign(n, Lookup::kAbsent);
  return result;
}

Status DiskTier::ReadCached(uint64_t table_id, std::span<const int64_t> ids, float* rows, int64_t* steps,
                            std::vector<Lookup>* state) {
  int64_t found = 0;
  FERRY_RETURN_IF_ERROR(MultiGet(table_id, ids, /*cached_only=*/true, rows, steps, state, &found));
  // The ids it answered count as looked up (those left to Read count there).
  int64_t answered = 0;
  for (Lookup l : *state) answered += l != Lookup::kNeedsDisk ? 1 : 0;
  rows_asked_.fetch_add(answered, std::memory_order_relaxed);
  rows_found_.fetch_add(found, std::memory_order_relaxed);
  return Status::Ok();
}

Status DiskTier::Read(uint64_t table_id, std::span<const int64_t> ids, float* rows, int64_t* steps,
                      std::vector<bool>* found) {
  if (options_.read_delay.count() > 0) std::this_thread::sleep_for(options_.read_delay);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Lookup> state;
  int64_t hits = 0;
  const Status result = MultiGet(table_id, ids, /*cached_only=*/false, rows, steps, &state, &hits);
  found->assign(ids.size(), false);
  for (size_t i = 0; i < state.size(); ++i) (*found)[i] = state[i] == Lookup::kFound;
  const int64_t us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  reads_.fetch_add(1, std::memory_order_relaxed);
  rows_asked_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  rows_found_.fetch_add(hits, std::memory_order_relaxed);
  read_us_[static_cast<size_t>(LatencyBucket(us))].fetch_add(1, std::memory_order_relaxed);
  return result;
}

Status DiskTier::Erase(uint64_t table_id, std::span<const int64_t> ids) {
  Status missing;
  Table* t = Find(table_id, &missing);
  if (t == nullptr) return missing;
  rocksdb::WriteBatch batch;
  for (int64_t id : ids) {
    const auto key = Key(id);
    rocksdb::Status s = batch.Delete(t->cf, rocksdb::Slice(key.data(), key.size()));
    if (!s.ok()) return Wrap(&s, t, "batching erasures");
  }
  rocksdb::WriteOptions wo;
  wo.disableWAL = true;
  rocksdb::Status s = db_->Write(wo, &batch);
  if (!s.ok()) return Wrap(&s, t, "erasing rows");
  rows_erased_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  return Status::Ok();
}

Status DiskTier::Scan(uint64_t table_id, void* fn, RowFn call) {
  Status missing;
  Table* t = Find(table_id, &missing);
  if (t == nullptr) return missing;
  rocksdb::ReadOptions ro;
  ro.verify_checksums = true;
  ro.fill_cache = false;  // a scan would push the hot blocks out
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, t->cf));
  std::vector<float> row(static_cast<size_t>(t->row_floats));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key(), value = it->value();
    if (key.size() != 8) {
      return DataLossError("disk tier " + options_.path + ", table '" + t->name + "': a key of " +
                           std::to_string(key.size()) + " bytes, not 8");
    }
    const int64_t id = IdOfKey(key.data());
    int64_t steps = 0;
    if (Status s = Decode(*t, id, value.data(), value.size(), &steps, row.data()); !s.ok()) return s;
    Status s;
    call(fn, id, steps, row.data(), &s);
    if (!s.ok()) return s;
  }
  rocksdb::Status s = it->status();
  if (!s.ok()) return Wrap(&s, t, "reading its rows in order");
  return Status::Ok();
}

int64_t DiskTier::IntProperty(uint64_t table_id, const char* name) {
  Status missing;
  Table* t = Find(table_id, &missing);
  uint64_t n = 0;
  if (t == nullptr || !db_->GetIntProperty(t->cf, name, &n)) return 0;
  return static_cast<int64_t>(n);
}

int64_t DiskTier::EstimatedRows(uint64_t table_id) { return IntProperty(table_id, "rocksdb.estimate-num-keys"); }

int64_t DiskTier::FileBytes(uint64_t table_id) { return IntProperty(table_id, "rocksdb.total-sst-files-size"); }

Status DiskTier::Checkpoint(const std::string& dir) {
  rocksdb::Checkpoint* raw = nullptr;
  rocksdb::Status s = rocksdb::Checkpoint::Create(db_.get(), &raw);
  std::unique_ptr<rocksdb::Checkpoint> cp(raw);
  if (s.ok()) s = cp->CreateCheckpoint(dir, /*log_size_for_flush=*/0);
  if (!s.ok()) return Wrap(&s, nullptr, "a checkpoint into " + dir);
  return Status::Ok();
}

Status DiskTier::Flush() {
  std::vector<rocksdb::ColumnFamilyHandle*> cfs;
  {
    MutexLock lock(&mu_);
    for (auto& [id, t] : tables_) cfs.push_back(t->cf);
  }
  rocksdb::Status s = db_->Flush(rocksdb::FlushOptions(), cfs);
  if (!s.ok()) return Wrap(&s, nullptr, "flushing rows to files");
  return Status::Ok();
}

Status DiskTier::Compact() {
  if (Status s = Flush(); !s.ok()) return s;
  std::vector<std::pair<rocksdb::ColumnFamilyHandle*, const Table*>> cfs;
  {
    MutexLock lock(&mu_);
    for (auto& [id, t] : tables_) cfs.emplace_back(t->cf, t.get());
  }
  for (auto& [cf, t] : cfs) {
    rocksdb::Status s = db_->CompactRange(rocksdb::CompactRangeOptions(), cf, nullptr, nullptr);
    if (!s.ok()) return Wrap(&s, t, "compacting its files");
  }
  return Status::Ok();
}

Status DiskTier::Resume() {
  rocksdb::Status s = db_->Resume();
  if (!s.ok()) return Wrap(&s, nullptr, "resuming writes");
  return Status::Ok();
}

DiskTier::Stats DiskTier::stats() const {
  Stats st;
  st.reads = reads_.load(std::memory_order_relaxed);
  st.rows_asked = rows_asked_.load(std::memory_order_relaxed);
  st.rows_found = rows_found_.load(std::memory_order_relaxed);
  st.rows_written = rows_written_.load(std::memory_order_relaxed);
  st.rows_erased = rows_erased_.load(std::memory_order_relaxed);
  for (size_t b = 0; b < st.read_us.size(); ++b) st.read_us[b] = read_us_[b].load(std::memory_order_relaxed);
  return st;
}

}  // namespace ferry::ps
