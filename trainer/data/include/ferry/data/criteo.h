// ferry/data/criteo.h — a streaming reader of Criteo display-ads data (the Kaggle / Terabyte
// "train.txt" / "day_N" format), plain or gzipped, from one file or many.
//
// Line format: 40 tab-separated columns, `label \t I1..I13 \t C1..C26`, '\n' (or "\r\n") ended:
//   label   "0" or "1"
//   I1..I13 decimal integers (may be negative), or empty
//   C1..C26 categorical values: hexadecimal digits (8 in the public data; hashed as they are,
//           case-sensitive), or empty
// Output (CtrBatch with num_dense = 13, num_fields = 26):
//   dense[j] = log(1 + max(I_j, 0))    (float; an empty field gives 0, the same as I_j <= 0)
//   ids[f]   = CriteoFieldId(f, C_f, hash_buckets)  (an empty field hashes the empty string, which
//              is field f's dedicated "missing" id: missing values are kept, not skipped, so every
//              example has exactly one id per field as the model expects)
// A bad line (not 40 columns, a label other than 0/1, an integer field that is not a whole
// decimal int64, a categorical value that is not hexadecimal, more than max_line_bytes) is
// skipped, counted, and the first few are recorded
// with their file, 1-based line number and the reason; it is never fatal. I/O errors (missing
// file, corrupt gzip) are.
//
// Files: a reader reads its files one after another, in the order given (ExpandCriteoPaths
// sorts a glob's matches with their numbers in order, so day_0 .. day_23 come in day order).
// Sharding (CriteoOptions::shard, shard_by):
//   by file  file i of the list belongs to shard i % num_shards, which reads all its lines;
//   by line  line k of every file (0-based, counting every line, bad or good) belongs to shard
//            k % num_shards; a reader parses only its own lines (the others are scanned for
//            '\n' and dropped);
//   auto     by file when there are at least as many files as shards, else by line.
// Over all shards every line is read exactly once per pass, and each bad line is counted by
// exactly one shard, so the per-shard stats sum to the files'. The order is file order; a file
// cannot be shuffled without holding it, so shuffle Criteo offline if needed.
//
// Memory: one file open at a time, one read buffer (CriteoOptions::read_buffer_bytes, grown for
// a long line up to twice max_line_bytes) plus the caller's batch; no file is ever held whole.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ferry/data/ctr_batch.h"
#include "ferry/data/shard.h"
#include "ferry/status.h"

namespace ferry::data {

inline constexpr int kCriteoDense = 13;
inline constexpr int kCriteoFields = 26;
inline constexpr int kCriteoColumns = 1 + kCriteoDense + kCriteoFields;  // 40

// The id of categorical value `value` in field `field` (0-based, C1 is field 0). Stable: it depends
// on nothing but its arguments and never changes between builds, platforms or runs:
//   h  = Mix64(Fnv1a64(value) ^ Mix64(field + 1))
//        Fnv1a64: FNV-1a, 64-bit (offset basis 0xcbf29ce484222325, prime 0x100000001b3)
//        Mix64:   SplitMix64's output function: x += 0x9e3779b97f4a7c15;
//                 x = (x ^ x >> 30) * 0xbf58476d1ce4e5b9; x = (x ^ x >> 27) * 0x94d049bb133111eb;
//                 x ^= x >> 31
//   hash_buckets == 0: id = h >> 1, in [0, 2^63); distinct fields give distinct ids (up to
//                      64-bit collisions), so one embedding table can hold every field
//   hash_buckets  > 0: id = field * hash_buckets + h % hash_buckets; field f owns the range
//                      [f * hash_buckets, (f + 1) * hash_buckets) (the hashing trick)
// The empty value is a field's "missing" id. Requires 0 <= field and, with buckets,
// (field + 1) * hash_buckets <= INT64_MAX (CriteoOptions validation guarantees both).
int64_t CriteoFieldId(int field, std::string_view value, int64_t hash_buckets = 0);

// The dense transform: log(1 + max(x, 0)), in float.
float CriteoDenseValue(int64_t x);

// Parses one line (without its '\n'; a trailing '\r' is ignored) and appends it to `batch`, whose
// shape must be (kCriteoDense, kCriteoFields). On a bad line (or a misshapen batch) returns
// INVALID_ARGUMENT with the reason and leaves `batch` unchanged.
Status ParseCriteoLine(std::string_view line, int64_t hash_buckets, CtrBatch* batch);

// How a reader's files are split among shards (see the header comment).
enum class CriteoShardBy { kAuto, kFile, kLine };

// "auto", "file" or "line"; INVALID_ARGUMENT otherwise.
StatusOr<CriteoShardBy> ParseCriteoShardBy(std::string_view name);
const char* CriteoShardByName(CriteoShardBy by);

struct CriteoOptions {
  ShardSpec shard;                                // which files or lines this reader takes
  CriteoShardBy shard_by = CriteoShardBy::kAuto;  // by file or by line (see the header comment)
  int64_t hash_buckets = 0;       // 0: 63-bit ids; > 0: per-field bucket ranges (CriteoFieldId)
  int max_bad_line_records = 10;  // how many bad lines to keep with their file and line number
  int64_t read_buffer_bytes = int64_t{1} << 20;  // the read buffer, >= 1 KiB
  int64_t max_line_bytes = int64_t{1} << 20;     // a longer line is a bad line, >= 1 KiB

  Status Validate() const;
};

struct CriteoBadLine {
  std::string path;         // the file
  int64_t line_number = 0;  // 1-based line of that file
  std::string reason;

  std::string ToString() const;  // "path:line: reason"
};

// Counts for the current pass over this reader's shard.
struct CriteoStats {
  int64_t lines = 0;      // this shard's lines seen (examples + bad_lines)
  int64_t examples = 0;   // lines turned into examples
  int64_t bad_lines = 0;  // lines skipped as malformed
  int64_t bytes = 0;      // bytes of text read (inflated), this shard's lines and the others'
  int64_t files = 0;      // files opened
  std::vector<CriteoBadLine> first_bad_lines;  // the first max_bad_line_records bad lines
};

// The files a list names: comma-separated entries, each a path or a glob pattern (*, ? or [ in
// it; glob(3), matches sorted with numbers in order: day_2 before day_10). NOT_FOUND naming the
// entry when a path does not exist or a
// pattern matches nothing; INVALID_ARGUMENT for an empty list or entry. A file named twice is
// kept once, where it first appears.
StatusOr<std::vector<std::string>> ExpandCriteoPaths(std::string_view list);

// Thread-safety: not thread-safe; use one reader per thread. The reader owns its file handle.
class CriteoReader {
 public:
  // Opens `paths` (plain or gzipped, read in that order; this shard's files of them when
  // sharding by file). NOT_FOUND if one does not exist (all are checked here, not when reached);
  // INVALID_ARGUMENT for bad options, no file, or no file for this shard.
  static StatusOr<std::unique_ptr<CriteoReader>> Open(const std::vector<std::string>& paths,
                                                      const CriteoOptions& options = {});
  static StatusOr<std::unique_ptr<CriteoReader>> Open(const std::string& path, const CriteoOptions& options = {});
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // Replaces `batch`'s contents with up to `max_examples` (>= 1) further examples of this shard
  // and returns how many; fewer only at the end of the pass (the last file), 0 once it is
  // exhausted. DATA_LOSS on a read error (e.g. a truncated gzip file), after which the reader
  // stays failed.
  StatusOr<int64_t> ReadBatch(int64_t max_examples, CtrBatch* batch);

  // Goes back to the first line of the first file for another pass (epoch) and resets stats().
  // A failed reader stays failed (returns its error); open the files again instead.
  Status Rewind();

  const CriteoStats& stats() const;
  const std::vector<std::string>& files() const;  // this shard's files, in reading order
  CriteoShardBy shard_by() const;                 // as applied (never kAuto)

 private:
  struct Impl;
  explicit CriteoReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One finished pass of a CriteoStream.
struct CriteoPass {
  int64_t pass = 0;  // 0-based
  CriteoStats stats;
};

// Exactly n examples at a time from a CriteoReader, passing over its files again at their end:
// the training source of a run sized in steps, whose memory does not grow with the files.
//
// Read-ahead (read_ahead = true): once Next has handed out a batch of n, the next n examples
// are read and parsed on a thread of the stream's own while the caller uses the batch, so a
// training step does not wait for the reader unless parsing is slower than the step. The
// examples, their order, the passes and the errors are exactly those without read-ahead; memory
// is one batch more. An error met ahead is returned by the Next that would have met it.
// Thread-safety: the methods are called by one thread; the read-ahead thread is internal.
class CriteoStream {
 public:
  // pass_limit > 0: a pass ends after that many examples (--train-limit); 0: at the files' end.
  explicit CriteoStream(std::unique_ptr<CriteoReader> reader, int64_t pass_limit = 0, bool read_ahead = false);
  ~CriteoStream();  // waits for a read ahead in progress
  CriteoStream(const CriteoStream&) = delete;
  CriteoStream& operator=(const CriteoStream&) = delete;

  // Replaces `batch`'s contents with the next `n` (>= 1) examples, beginning another pass where
  // one ends (a batch may span two). INVALID_ARGUMENT when a whole pass yields no example (naming
  // the files and the first bad lines); the reader's errors as they are. After an error the
  // stream stays failed.
  Status Next(int64_t n, CtrBatch* batch);
  // Reads past the next `n` examples (a resumed job's earlier steps): parsed, not kept.
  Status Skip(int64_t n);

  // The pass the last example handed out came from (0-based; 0 before any).
  int64_t pass() const { return pass_handed_; }
  // The passes finished since the last call, oldest first: those the examples handed out have
  // crossed (a pass is reported with the first example after it, read ahead or not).
  std::vector<CriteoPass> TakeFinishedPasses() { return std::exchange(finished_, {}); }

 private:
  // A pass that ended before example `at` of a run of examples.
  struct Crossing {
    int64_t at = 0;
    CriteoPass pass;
  };
  // n examples read from the files, with the pass of the first and the passes ended among them.
  struct Chunk {
    CtrBatch batch;
    int64_t first_pass = 0;
    std::vector<Crossing> crossings;
    Status status;
  };
  // Reads n examples (the only code that touches reader_, pass_, in_pass_ and scratch_: on the
  // caller's thread, or on the read-ahead thread while one is in flight, never both).
  Chunk Read(int64_t n);
  // The next n examples into *batch (what is left over from a read ahead first); starts the next
  // read ahead of `ahead` examples when that is > 0.
  Status Take(int64_t n, CtrBatch* batch, int64_t ahead);
  void Use(Chunk& chunk);  // appends its examples (and crossings) to carry_

  std::unique_ptr<CriteoReader> reader_;
  const int64_t pass_limit_;
  const bool read_ahead_;
  int64_t pass_ = 0;     // the pass the reader is in
  int64_t in_pass_ = 0;  // examples of that pass read
  CtrBatch scratch_;
  // The caller's side.
  CtrBatch carry_;                  // examples read (ahead) and not handed out yet
  int64_t carry_pass_ = 0;          // the pass of carry_'s first example, before its crossings
  std::vector<Crossing> carry_crossings_;  // passes ended among carry_'s examples
  std::future<Chunk> ahead_;        // a read in flight
  int64_t pass_handed_ = 0;
  std::vector<CriteoPass> finished_;
  Status failed_;
};

}  // namespace ferry::data
