// ps/server/internal/checkpoint.h — checkpoints of a server's tables on disk (format:
// messages/CHECKPOINT.md). Each server writes its shard of every table to one file (written to
// a temporary name, fsynced, renamed); a manifest written last names the complete set, and
// CURRENT names the newest manifest, so a checkpoint exists only once all of it is on disk.
// Reading verifies every block's checksum and every size, and falls back to the newest older
// checkpoint that verifies; restoring re-places dense chunks and sparse ids for any number of
// servers.
//
// Thread-safety: none; call from the thread that owns the tables.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "internal/table_registry.h"

namespace ferry::ps {

// zlib's CRC-32 of `n` bytes at `data`, continuing `crc` (0 to start), in pieces of at most 1 GiB.
uint32_t Crc32(uint32_t crc, const void* data, size_t n);

inline constexpr uint32_t kCheckpointFormat = 1;       // a full shard, and a manifest of full shards
inline constexpr uint32_t kCheckpointDeltaFormat = 2;  // a delta shard, and a manifest naming one

// One server's shard file as the manifest lists it.
struct ShardFile {
  std::string name;  // file name inside the checkpoint folder
  uint64_t bytes = 0;
  uint32_t crc32 = 0;  // of the whole file
  // A delta shard's chain: the files it is applied over, oldest (a full shard) first, the last
  // the one it is a delta of. Empty for a full shard.
  std::vector<ShardFile> base;
  // By worker rank, the steps each worker had done as this shard's server knew them when it
  // saved (-1: none known; empty: not recorded); since 1.25 the steps it held whole (WholeStep).
  // Without table_steps, a restore skips a replayed async/ssp push of a step this server had
  // taken already, for what this server held (RestoreShard).
  std::vector<int64_t> worker_steps;
  // 1.25, by table id: each async/ssp table's share on this shard's server, by worker rank, one
  // more than the highest step of the worker's pushes it applied (ps::TakenByTable). A restore
  // takes these as the replay floors where the manifest has them for every shard, instead of
  // worker_steps (a step cut between two tables' pushes is replayed where it was not held).
  std::map<uint64_t, std::vector<int64_t>> table_steps;
};

// A delta shard's predecessor: the shard file of the same server it records the changes since.
struct DeltaOf {
  int64_t step = -1;
  ShardFile file;  // (its base is not used here)
};

// A server's shard of every table serialized in memory: the bytes of its shard file. Taking it
// is the only part of a checkpoint that must stop the server (a copy at memory speed); writing
// it touches no table, so it happens on another thread while the server goes on serving.
// An allocator that leaves new elements uninitialised: the snapshot writes every byte of its
// image, so zeroing them first would be one more pass over a shard-sized buffer in the pause.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: left as it is
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

struct ShardImage {
  std::vector<char, UninitializedAllocator<char>> bytes;  // the whole file; each block's crc still zero
  std::vector<size_t> blocks;  // where each block starts in `bytes`
};

// The disk tier's part of a shard (messages/CHECKPOINT.md, "The disk tier"): a copy of the
// server's store made by hard links (DiskTier::Checkpoint) in a folder beside the shard file, named
// after it and a generation of its own, and the files it holds, which the shard lists with their
// sizes.
struct DiskStoreCopy {
  std::string folder;                                   // inside the checkpoint folder: <shard file>.disk.<gen>
  std::vector<std::pair<std::string, uint64_t>> files;  // its files and their sizes, by name
};

// Copies the store of `tables` (their DiskTier) for server `rank`'s shard of `step`, in `dir`
// (made if missing), into a folder of a new generation: an earlier save's copy of the same step
// stays until the new shard is in place (RemoveOtherDiskCopies). Nothing is copied through RAM
// where the file system allows hard links; the rows the store holds in RAM are flushed first.
StatusOr<DiskStoreCopy> CopyDiskTier(DiskTier& disk, const std::string& dir, int rank, int num_servers, int64_t step);

// Copies every table of `tables` into an image (throws std::bad_alloc when memory is short).
// With `delta`: only what changed since the snapshot that wrote `delta->file` (the dense chunks
// whose version moved, the sparse rows noted by SparseShard::TrackChanges, the ids evicted
// since), as a delta shard (format 2); a table not tracked yet (new since) is copied whole.
// `track`: (every snapshot of a server that writes deltas) starts or restarts the count of
// changes, which the next delta takes. A table with a disk tier: the RAM tier's rows, and a block
// naming `disk` (required then), whose copy of the store holds the rest (a table with a disk tier
// is never tracked: it is copied whole, so such a server writes no deltas).
ShardImage SnapshotShard(TableRegistry& tables, const DeltaOf* delta = nullptr, bool track = false,
                         const DiskStoreCopy* disk = nullptr);

// A shard with no table (what server 0 writes for a server that owns no slot, protocol 1.20).
ShardImage EmptyShard();

// Fills in the image's block checksums; returns the whole image's CRC-32 (a shard file's).
uint32_t SealImage(ShardImage& image);

// Every table of `tables` in a sealed image (a full shard), touching nothing of theirs (a
// checkpoint's snapshot marks what it copied, for the next delta): what a server sends a
// replacement peer (protocol 1.22, Snapshot). Throws std::bad_alloc when memory is short.
ShardImage CopyShard(const TableRegistry& tables);

// About the bytes a delta snapshot of `tables` would take now (an upper bound for sparse rows):
// what a server weighs against its chain's full shard before writing a delta.
uint64_t DeltaBytes(const TableRegistry& tables);

// Fills in the image's checksums and writes it as server `rank` of `num_servers`'s shard of
// `step` into `dir` (created if missing). Returns what the manifest must list for it.
StatusOr<ShardFile> WriteShardImage(const std::string& dir, int rank, int num_servers, int64_t step, ShardImage image);

// Before server `rank` writes its shard of a new checkpoint into `dir`: removes its own shard
// files of the checkpoints that the new one's commit will remove (all but the newest keep - 1),
// so that a disk that holds `keep` checkpoints always has room for the next one (their manifests
// go with that commit), except files the chains of the checkpoints kept need. With keep 1 nothing
// is removed: the only checkpoint goes once the new one is saved. Returns the steps of the shards
// it removed (errors are ignored: the commit retries).
// `spare`: a name not to remove (the copy of the disk tier store the shard being written names).
std::vector<int64_t> MakeRoom(const std::string& dir, int rank, int keep, const std::string& spare = "");

// Once `shard` is in place (renamed over any earlier file of the same step): removes the other
// copies of the disk tier store beside it than `keep` (those of an earlier save of the step).
void RemoveOtherDiskCopies(const std::string& dir, const std::string& shard, const std::string& keep);

// SnapshotShard, then WriteShardImage.
StatusOr<ShardFile> WriteShard(const std::string& dir, int rank, int num_servers, int64_t step,
                               TableRegistry& tables, const DeltaOf* delta = nullptr, bool track = false);

// `shard` (in `dir`) with its chain filled in: nothing for a full shard; for a delta, the chain of
// the file its first block names as its predecessor, as the manifest of that file's step lists
// it, then that file. FailedPrecondition when no checkpoint lists the predecessor with the size
// and CRC the delta records; DataLoss when the shard's first block does not verify.
StatusOr<ShardFile> WithChain(const std::string& dir, ShardFile shard);

// InvalidArgument unless `shards` are the files a checkpoint of `step` by shards.size() servers
// must have, in server order (a manifest names only files its own servers wrote).
Status CheckShardList(int64_t step, const std::vector<ShardFile>& shards);

// Writes MANIFEST-<step> naming `shards` (one per server, in rank order, each with its chain),
// then points CURRENT at it, each atomically; then removes the checkpoints of `dir` beyond the
// newest `keep`, except the files their chains need (and the manifests all of whose files those
// are: the earlier checkpoints of a kept chain stay restorable).
// `meaning`: what the cut is ("sync: every server at global step 120"; "async: ...").
// `map`: the servers' placement, written when a hand-over changed it (version above 1).
// `worker_steps`: the steps each worker had done, by rank, as the servers knew them when they
// saved (the lowest any server knew; -1: none knew; empty: not written). A worker resumes at its
// own.
Status WriteManifest(const std::string& dir, int64_t step, const std::vector<ShardFile>& shards,
                     const std::string& meaning, int keep, const std::vector<int64_t>& worker_steps = {},
                     const placement::Placement* map = nullptr);

// A checkpoint read back: every table whole, whatever the servers that wrote it.
struct CheckpointData {
  int64_t step = 0;
  int num_servers = 0;
  // The manifest does not say "placement": written before placement by slots (1.16), so what its
  // shards recorded per server follows the rule before (placement::IdServerBeforeSlots); the
  // same servers for counts dividing placement::kSlots.
  bool before_slots = false;
  // The map its shards were written under when a hand-over had changed the job's (1.17; the
  // manifest's "placement_owners"); null: the first map of num_servers.
  std::shared_ptr<const placement::Placement> placement;
  std::string manifest;  // the manifest it came from
  std::string meaning;
  std::vector<int64_t> worker_steps;  // by rank, -1 unknown (WriteManifest); empty in a manifest without them
  // By the rank of the server that wrote each shard: its own record of the workers' steps
  // (ShardFile::worker_steps); an empty entry where the manifest has none.
  std::vector<std::vector<int64_t>> shard_worker_steps;
  // By the same rank: its table_steps (ShardFile::table_steps); empty maps where the manifest
  // has none (written before 1.25).
  std::vector<std::map<uint64_t, std::vector<int64_t>>> shard_table_steps;
  struct Chunk {
    int64_t version = 0;
    std::vector<float> params, state;
  };
  struct Row {
    int64_t steps = 0;
    std::vector<float> values;  // params then optimizer state: dim * (1 + state slots)
  };
  struct Table {
    TableSpec spec;
    std::map<int64_t, Chunk> chunks;  // dense: by chunk index
    std::map<int64_t, Row> rows;      // sparse: by id
    int64_t sparse_version = 0;       // sparse: the highest version of the shards that wrote it
    // Sparse, with a disk tier: the copies of the stores (absolute paths, verified) that hold the
    // rows beyond the RAM tiers, one per server that wrote the checkpoint; a row of `rows` shadows
    // its id's stale copy there (ForEachDiskRow).
    std::vector<std::string> disk_stores;
  };
  std::map<uint64_t, Table> tables;  // by table id
};

// Calls fn(id, steps, row floats) for each row of table `t` (id `table_id`) held in its disk
// stores and not in t.rows (the RAM tiers' rows, which are the newer); stops at fn's first error.
// Rows are read from the files, a few at a time: nothing is held in RAM but the row at hand.
Status ForEachDiskRow(const CheckpointData::Table& t, uint64_t table_id,
                      const std::function<Status(int64_t id, int64_t steps, const float* row)>& fn);

// Reads the checkpoint CURRENT names, verifying every file (a delta shard's whole chain, each
// link against the one before); if it does not verify, the newest older manifest that does. The
// error (when none verifies) names each file tried and what is
// wrong with it; `skipped` (optional) gets the same for the checkpoints passed over.
StatusOr<CheckpointData> ReadCheckpoint(const std::string& dir, std::vector<std::string>* skipped = nullptr);

// The steps of the checkpoints `dir` keeps (one per manifest), ascending, and the step CURRENT
// names (-1: none). Manifests are not verified here.
struct KeptCheckpoints {
  std::vector<int64_t> steps;
  int64_t current = -1;
};
StatusOr<KeptCheckpoints> ListCheckpoints(const std::string& dir);

// What a reader keeps of a checkpoint: the dense chunks and sparse rows of some slots
// (placement::IdSlot, ChunkSlot), read from only the shards whose writers owned one of them (by
// the map the checkpoint was written under; every shard of a manifest before slots). The files
// not read are not verified. A file read has its size and checksum checked as without a filter,
// and every block it keeps is checked as before; a dense chunk's block it drops is not parsed
// (its checksum and the structure around it are the file's). A table's spec comes from any
// shard, so every table is there whenever a shard is read. A hand-over reads with one
// (HandOverFilter): what it reads and holds is what moves to or from its server, not the model.
struct CheckpointFilter {
  std::vector<bool> slots;  // placement::kSlots entries
  // Empty, or kSlots entries: of the slots kept, those whose chunks keep only their version and
  // rows only their update count (no values): what a hand-over's server gives up is checked
  // against them, not taken.
  std::vector<bool> versions_only;
  bool Keeps(int slot) const { return slots[static_cast<size_t>(slot)]; }
  bool ValuesOf(int slot) const { return versions_only.empty() || !versions_only[static_cast<size_t>(slot)]; }
  bool KeepsAny() const;
  bool operator==(const CheckpointFilter&) const = default;
};

// A hand-over's checkpoint read ahead (protocol 1.19, Placement's `prepare`), while the job
// trains: each shard's chain as `filter` keeps it, by the rank of the server that wrote it (not
// merged). A later read with the same filter of a checkpoint whose chain of a shard begins with
// the files read here starts from what they left and reads only the files after them (a delta
// checkpoint of a later step reads its new deltas alone).
struct PreparedChains {
  int64_t step = -1;
  CheckpointFilter filter;
  struct Chain {
    std::vector<ShardFile> files;  // read and verified, oldest (a full shard) first
    CheckpointData data;           // what they leave, filtered
  };
  std::map<size_t, Chain> shards;  // by the rank of the server that wrote the shard
  int used = 0;  // chains a read started from (ReadCheckpointAt)
  // About the memory it holds: the values and states of its chunks and rows.
  int64_t Bytes() const;
};

// Reads and verifies the checkpoint of `step` as ReadCheckpointAt with `filter` does, keeping each
// shard's chain apart (PreparedChains).
StatusOr<PreparedChains> PrepareChains(const std::string& dir, int64_t step, const CheckpointFilter& filter);

// Reads and verifies the checkpoint of `step` (its manifest and every shard it names, or those
// `filter` needs, keeping only what it keeps); no fallback to another. NotFound, naming the steps
// kept, when `dir` has none of that step. `prepared` (optional, with the same filter): chains read
// ahead, which the read starts from where they fit (taken out of it: each serves one read).
StatusOr<CheckpointData> ReadCheckpointAt(const std::string& dir, int64_t step,
                                          const CheckpointFilter* filter = nullptr,
                                          PreparedChains* prepared = nullptr);

// The tables of a full shard's bytes (CopyShard's image), every block verified; `name` says where
// they came from in errors (and is the result's `manifest`).
StatusOr<CheckpointData> ParseShardImage(std::span<const char> bytes, const std::string& name);

// Declares every table of `ckpt` in `tables` (server `rank`, a job of `num_workers`) and fills
// in the chunks and rows that the registry's placement gives this server. An async or
// ssp table whose shards recorded their own workers' steps gets replay floors (Table::replay):
// a worker resumes at the lowest step any server held whole, and a push it replays is skipped for
// the chunks and rows whose table share at the checkpoint had taken that step already (1.25:
// table_steps; before, whose server had taken any push of that step). The floors are carried as
// what the restored parts took (StepsTaken), so that a checkpoint saved before the replay is over
// records them again.
Status RestoreShard(const CheckpointData& ckpt, int rank, int num_workers, TableRegistry* tables);

// 1.25, what a checkpoint records of each async/ssp table's share held here (ShardFile::
// table_steps): by worker rank (num_workers of them), one more than the highest step of that
// worker's pushes the share applied (StepsTaken::taken; a dense table: the highest over its chunks
// here, none where it holds no chunk here), 0 where none.
std::map<uint64_t, std::vector<int64_t>> TakenByTable(const TableRegistry& tables, int num_workers);
// The steps of worker `rank` a server holds whole, given its `done` (Workers::done: one more than
// the highest step of the worker's pushes it took) and `taken` (TakenByTable): `done`, less one
// where a share lags it. A worker's step reaches a server as one request per table (or a few
// tables), so a checkpoint, or the worker's death, may cut a step between them: the worker
// resumes at that step again, and the shares that took it skip it (the replay floors).
int64_t WholeStep(int64_t done, int rank, const std::map<uint64_t, std::vector<int64_t>>& taken);

// A placement hand-over (protocol 1.17, PROTOCOL.md "Placement versions"): server `rank` goes
// from its registry's map to `next`, taking the chunks and rows of the slots it gains from `ckpt`
// (the job's checkpoint of the hand-over's step, which every server of the job reads) and
// dropping those of the slots it gives up; then the registry holds `next`. Everything is
// checked before anything changes (FAILED_PRECONDITION saying what): the tables here are the
// checkpoint's, none has a disk tier or a table being declared, no sync step is in progress
// here, what this server gives up is as the checkpoint holds it (a dense chunk at the
// checkpoint's version, a sparse row with its update count: a push applied since would be lost),
// and the memory budget has room for what it takes. `check_only`: checks and changes nothing.
// `ckpt` may be read with HandOverFilter(now, next, rank) (now: the registry's map): a server
// that neither gains nor gives up a slot reads no shard, checks no table and only takes the map.
struct HandOverCounts {
  int64_t chunks_taken = 0, chunks_dropped = 0, rows_taken = 0, rows_dropped = 0;
};
CheckpointFilter HandOverFilter(const placement::Placement& now, const placement::Placement& next, int rank);
StatusOr<HandOverCounts> HandOver(const CheckpointData& ckpt, const placement::Placement& next, int rank,
                                  int num_workers, TableRegistry* tables, bool check_only);

}  // namespace ferry::ps
