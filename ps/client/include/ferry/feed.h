// ferry/feed.h — the change feed: a reader that keeps a copy of tables up to date while a job
// trains (a serving copy of an embedding table, a model exported as it learns), without being a
// worker: it says no Hello, takes no rank, and cannot push. PROTOCOL.md, "The change feed".
//
// Each Poll of a table is one round over every server: a server cuts the table's feed (a point in
// its sequence of updates) when the round reaches it, and sends, page by page, every row (sparse)
// or chunk (dense) made or changed after the previous round's cut, with their values as they are
// when the page is read, and the ids evicted since. So once Poll returns, the copy holds every
// update a server applied before its cut: its staleness is at most the time between two Polls
// plus one Poll's duration. A value changed again while a round goes on is sent again in the next
// round: the copy converges to the servers' tables, bit for bit once they stop changing. Training
// pauses for one page at a time (a bounded scan and copy on the server's I/O thread).
//
// The first Poll of a table sends everything; so does a server restarted since (another process:
// a new feed epoch) or one whose log of evictions no longer reaches back to the reader's cursor.
// Those servers are listed in TableChanges::full_servers: drop what the copy holds from them
// (ferry/messages/placement.h: IdServer for sparse ids, ChunkServer for dense chunks) before
// applying the rest.
//
// Under CURVE the servers accept a reader's key (ferry-keys --readers, curve::LoadReaderKeys), or
// a worker's; a reader's key may read (Changes, Stats) and nothing else.
//
// Thread-safety: one thread at a time per ChangeFeed (use one per thread to read in parallel).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/context.h"
#include "ferry/curve.h"
#include "ferry/status.h"
#include "ferry/table_spec.h"

namespace ferry {

struct FeedOptions {
  std::vector<std::string> servers;      // one endpoint per server, in server-rank order
  std::optional<CurveClientKeys> curve;  // the servers use CURVE: a reader's keys (or a worker's)
  // Longest one page's reply may take; a server silent longer fails the Poll with
  // DEADLINE_EXCEEDED naming it (the next Poll asks again).
  std::chrono::milliseconds request_timeout{std::chrono::seconds(30)};
  // About the most value bytes one page carries (a server's page is also bounded by the rows it
  // looks at); 0: the server's default (4 MiB).
  int64_t page_bytes = 0;
  std::shared_ptr<Context> context;  // required for inproc:// servers
};

// What changed in one table since the previous Poll of it (the first: everything).
struct TableChanges {
  TableSpec spec;                 // the table, as the servers hold it
  std::vector<int> full_servers;  // servers that sent all they hold: drop what you hold from them first
  // Sparse: the ids evicted since (apply first; an id may also be in `ids`, made again since),
  // then the rows made or changed: ids.size() x spec.dim values, in no particular order.
  std::vector<int64_t> deleted;
  std::vector<int64_t> ids;
  std::vector<float> rows;
  // Dense: the chunks changed, as ranges [begin, end) of the flattened tensor's elements, and
  // their values one range after another.
  struct Range {
    int64_t begin = 0;
    int64_t end = 0;
  };
  std::vector<Range> ranges;
  std::vector<float> values;
  int64_t pages = 0;  // replies this Poll took
};

class ChangeFeed {
 public:
  static StatusOr<std::unique_ptr<ChangeFeed>> Connect(FeedOptions options);
  virtual ~ChangeFeed() = default;
  virtual int num_servers() const = 0;
  // One round over every server (all in flight together): what changed in `table` since this
  // feed's previous Poll of it. Fails with the first server's refusal (NOT_FOUND for a table it
  // does not hold yet, PERMISSION_DENIED for a key it refuses) or DEADLINE_EXCEEDED naming a
  // silent server; the next Poll then asks again from the last round that completed.
  virtual Status Poll(std::string_view table, TableChanges* out) = 0;
};

// A copy of one table kept up to date by a ChangeFeed's Polls: what a serving process holds. Each
// Apply takes one Poll's changes in order: for each of full_servers, the rows (or chunks) it
// placed on that server go; then the deleted ids; then the rows and ranges sent. A program with a
// store of its own does the same with it.
// Thread-safety: none (one thread, or the caller's lock).
class TableCopy {
 public:
  TableCopy();
  ~TableCopy();
  TableCopy(TableCopy&&) noexcept;
  TableCopy& operator=(TableCopy&&) noexcept;
  // `num_servers`: the feed's (placement of ids and chunks). INVALID_ARGUMENT, nothing changed,
  // for changes of another table or shape than the ones applied before.
  Status Apply(const TableChanges& changes, int num_servers);
  const TableSpec& spec() const;
  // Sparse: rows held, and the row of `id` (spec().dim values; null: none).
  size_t size() const;
  const float* row(int64_t id) const;
  // Sparse: every id held, ascending.
  std::vector<int64_t> ids() const;
  // Dense: the tensor, flattened (elements not sent yet are 0).
  const std::vector<float>& dense() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
