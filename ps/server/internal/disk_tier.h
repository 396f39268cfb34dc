// ps/server/internal/disk_tier.h — the disk tier of sparse tables (issue 37): rows kept on local
// disk, in an embedded RocksDB store, instead of being lost when the RAM tier has no room for them.
//
// One store per server, in a folder of its own (ferry-ps --disk-tier-dir); a column family per
// table. A row is its id -> [steps: int64, little-endian][its floats: values, then optimizer
// state]. The store is the RAM tier's overflow, not its durability: writes skip RocksDB's
// write-ahead log (a crash loses the store; checkpoints keep the rows), and Open starts from an
// empty store, wiping what an earlier process of Ferry left in the folder (a folder holding
// anything else is refused, so a wrong path never loses a user's files).
//
// Every failure names the table and the store's folder (RocksDB's own text names the file): a full
// disk is RESOURCE_EXHAUSTED, a checksum mismatch or a row of the wrong size DATA_LOSS, any other
// I/O error UNAVAILABLE. After a failed write RocksDB refuses further writes until Resume() (a
// full disk that got room back).
//
// Thread-safety: every method may be called from any thread; a table must not be added or dropped
// while another thread uses it. Reading an id while another thread writes it gives the old row or
// the new one, whole. The counters are atomics.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"

namespace rocksdb {
class Cache;
class ColumnFamilyHandle;
class DB;
}  // namespace rocksdb

namespace ferry::ps {

// Thrown where a row must go to the store and cannot (inside code whose failure path is an
// exception, as BudgetExceeded): status() says what failed and where.
class DiskTierError : public std::runtime_error {
 public:
  explicit DiskTierError(Status s) : std::runtime_error(s.ToString()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

class DiskTier {
 public:
  struct Options {
    std::string path;  // the store's folder: created if missing
    // RocksDB's block cache, index and filter blocks included; 0: none (every read goes to the files).
    int64_t block_cache_bytes = int64_t{64} << 20;
    int64_t write_buffer_bytes = int64_t{16} << 20;  // all tables: rows written gather in RAM up to this
    bool direct_reads = false;                       // read with O_DIRECT: no page cache (what a cold row costs)
    int bloom_bits_per_key = 10;                     // a lookup of an id not on disk rarely reads a block
    // Data blocks padded to 4 KiB pages, so that a row's block is one aligned page read rather
    // than two. Off: on the VM of bench/results/disk_tier it gained nothing beyond noise and its
    // files are 4% larger.
    bool align_blocks = false;
    // For tests: each Read waits this long first (a slow disk). ReadCached does not.
    std::chrono::milliseconds read_delay{0};
  };

  // What the store did, summed over its tables.
  struct Stats {
    static constexpr int kLatencyBuckets = 24;       // bucket b: reads of [2^(b-1), 2^b) us; 0: under 1 us
    int64_t reads = 0;                               // Read calls
    int64_t rows_asked = 0;                          // ids they (and ReadCached) looked up
    int64_t rows_found = 0;                          // of which were in the store
    int64_t rows_written = 0;                        // rows Write stored
    int64_t rows_erased = 0;                         // ids Erase removed
    std::array<int64_t, kLatencyBuckets> read_us{};  // each Read call's time
  };

  // Opens the store at options.path, empty (see the top of the file). FAILED_PRECONDITION when
  // the folder holds files that are not a Ferry disk tier's; UNAVAILABLE when RocksDB cannot open.
  static Status Open(const Options& options, std::unique_ptr<DiskTier>* out);
  // Opens a copy Checkpoint wrote, read-only and as it is (nothing wiped), with no block cache:
  // AddTable then finds a table's column family in it (NOT_FOUND when it has none) instead of
  // making one; Write, Erase and Checkpoint are refused. DATA_LOSS when RocksDB finds it
  // incomplete or corrupt (its text names the file).
  static Status OpenReadOnly(const std::string& dir, std::unique_ptr<DiskTier>* out);
  // Reads every block of every file of the store and checks its checksum.
  Status VerifyChecksums();
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::string& path() const { return options_.path; }

  // A table's column family: `table` names it in errors; every row has `row_floats` floats.
  // ALREADY_EXISTS when `table_id` has one.
  Status AddTable(uint64_t table_id, const std::string& table, int64_t row_floats);
  // Drops the table's column family and its rows.
  Status DropTable(uint64_t table_id);

  // Stores rows: ids[i] with steps[i] updates and floats rows[i * row_floats ...], replacing what
  // the store had for them (one atomic batch: all or none).
  Status Write(uint64_t table_id, std::span<const int64_t> ids, std::span<const int64_t> steps, const float* rows);
  // Looks up `ids` (one batched lookup): for each found[i] is set, and when true, steps[i] and the
  // row at rows[i * row_floats] are filled. A row of the wrong size is DATA_LOSS.
  Status Read(uint64_t table_id, std::span<const int64_t> ids, float* rows, int64_t* steps, std::vector<bool>* found);
  // Read without I/O (RocksDB's block cache tier): the rows in its write buffers or block cache
  // are read, and the ids it can tell are not on disk (its bloom filters in the cache) are
  // absent; what needs a read of the disk is left to Read. For each id, state[i] says which;
  // a found row fills steps[i] and rows[i * row_floats]. The ids it answers count in stats()'s
  // rows_asked and rows_found, not in its reads or their latency. A store without
  // a block cache knows nothing without I/O (RocksDB would read its files): every id needs the disk.
  enum class Lookup : uint8_t { kAbsent, kFound, kNeedsDisk };
  Status ReadCached(uint64_t table_id, std::span<const int64_t> ids, float* rows, int64_t* steps,
                    std::vector<Lookup>* state);
  // Removes `ids` (present or not): their rows went back to RAM.
  Status Erase(uint64_t table_id, std::span<const int64_t> ids);
  // Calls fn(id, steps, row) for each row of the table, ids ascending; stops at fn's first error.
  template <typename Fn>
  Status ForEachRow(uint64_t table_id, Fn&& fn);

  // The table's rows on disk (RocksDB's estimate: exact after a flush with no overwrites) and
  // the bytes of its files.
  int64_t EstimatedRows(uint64_t table_id);
  int64_t FileBytes(uint64_t table_id);

  // Writes a copy of the whole store into `dir` (which must not exist) by hard links where the
  // file system allows (RocksDB's checkpoint): nothing is copied through RAM.
  Status Checkpoint(const std::string& dir);
  // Writes the rows gathered in RAM into files (Checkpoint does it too).
  Status Flush();
  // Flushes, then merges every table's files into one sorted run (a lookup then reads one file
  // per level): what a store settles into; a pause of a full rewrite.
  Status Compact();
  // After a failed write: lets RocksDB try writing again (a full disk that has room now).
  Status Resume();

  Stats stats() const;

  // The key of an id: 8 bytes, big-endian with the sign bit flipped, so keys sort as ids do.
  static std::array<char, 8> Key(int64_t id);
  static int64_t IdOfKey(const char* key);

 private:
  struct Table {
    std::string name;
    int64_t row_floats = 0;
    rocksdb::ColumnFamilyHandle* cf = nullptr;  // the db's; destroyed by DropTable or ~DiskTier
  };
  explicit DiskTier(Options options);
  // The table of `table_id`, or nullptr with `*s` NOT_FOUND.
  Table* Find(uint64_t table_id, Status* s);
  // RocksDB's status as ours: "disk tier <path>, table '<name>': <what> failed: <RocksDB's text>".
  Status Wrap(const void* rocksdb_status, const Table* t, const std::string& what) const;
  // Read and ReadCached: one MultiGet with `cached_only`; state as ReadCached's.
  Status MultiGet(uint64_t table_id, std::span<const int64_t> ids, bool cached_only, float* rows, int64_t* steps,
                  std::vector<Lookup>* state, int64_t* found);
  // One row's decoding, with its size checked: DATA_LOSS naming the id.
  Status Decode(const Table& t, int64_t id, const char* data, size_t size, int64_t* steps, float* row) const;
  // RocksDB's integer property `name` of the table's column family; 0 when unknown.
  int64_t IntProperty(uint64_t table_id, const char* name);
  using RowFn = void (*)(void* fn, int64_t id, int64_t steps, const float* row, Status* s);
  Status Scan(uint64_t table_id, void* fn, RowFn call);

  const Options options_;
  std::shared_ptr<rocksdb::Cache> cache_;
  std::unique_ptr<rocksdb::DB> db_;
  Mutex mu_;  // guards tables_ (the handles themselves are thread-safe)
  std::vector<std::pair<uint64_t, std::unique_ptr<Table>>> tables_ ABSL_GUARDED_BY(mu_);
  rocksdb::ColumnFamilyHandle* default_cf_ = nullptr;
  bool read_only_ = false;                               // OpenReadOnly
  std::vector<rocksdb::ColumnFamilyHandle*> unclaimed_;  // OpenReadOnly: handles no AddTable took yet
  std::atomic<int64_t> reads_{0}, rows_asked_{0}, rows_found_{0}, rows_written_{0}, rows_erased_{0};
  std::array<std::atomic<int64_t>, Stats::kLatencyBuckets> read_us_{};
};

template <typename Fn>
Status DiskTier::ForEachRow(uint64_t table_id, Fn&& fn) {
  return Scan(table_id, &fn, [](void* f, int64_t id, int64_t steps, const float* row, Status* s) {
    *s = (*static_cast<std::remove_reference_t<Fn>*>(f))(id, steps, row);
  });
}

}  // namespace ferry::ps
