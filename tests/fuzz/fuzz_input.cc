#include "fuzz_input.h"

#include <cmath>
#include <cstring>

#include <flatbuffers/flatbuffers.h>

#include "ferry/messages/codec.h"
#include "ferry/messages/wire.h"
#include "ferry/table_spec.h"
#include "fuzz_tables.h"

namespace ferry::fuzz {

std::vector<std::string_view> SplitFrames(const uint8_t* data, size_t size) {
  std::vector<std::string_view> frames;
  size_t at = 0;
  while (at < size && frames.size() < 4100) {
    size_t len = size - at;
    if (size - at >= 2) {
      len = static_cast<size_t>(data[at]) | (static_cast<size_t>(data[at + 1]) << 8);
      at += 2;
      len = std::min(len, size - at);
    } else {
      at = size;  // one stray byte: an empty frame
      len = 0;
    }
    frames.emplace_back(reinterpret_cast<const char*>(data) + at, len);
    at += len;
  }
  return frames;
}

std::string JoinFrames(const std::vector<std::string>& frames) {
  std::string out;
  for (const auto& f : frames) {
    const size_t len = std::min<size_t>(f.size(), 0xFFFF);
    out.push_back(static_cast<char>(len & 0xFF));
    out.push_back(static_cast<char>(len >> 8));
    out.append(f.data(), len);
  }
  return out;
}

namespace {

using wire::Kind;

std::string Bytes(const flatbuffers::FlatBufferBuilder& fbb) {
  return std::string(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
}

template <typename T>
std::string Array(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

struct HeaderFields {
  Kind kind = Kind::Invalid;
  uint16_t major = wire::kMajor;
  uint64_t request_id = 1;
  int rank = kSeedRank;
  uint64_t table_id = 0;
  int64_t step = 0;
  std::vector<wire::DenseSlice> slices;
  std::vector<wire::SparseSlice> sparse;  // PullSparseTables / PushSparseTables
  int64_t num_ids = 0, dim = 0, barrier_id = 0;
  const TableSpec* spec = nullptr;
  bool hello = false;
  std::vector<std::pair<std::string, uint64_t>> shards;
  std::map<uint64_t, std::vector<int64_t>> table_steps;  // 1.25: each shard's
  uint64_t call = 0;  // 1.10: a push call in pieces
  uint32_t piece = 0, pieces = 0;
  uint64_t placement_version = 0;  // 1.17
  std::vector<uint16_t> placement;
  bool full = false;
  int snapshot_of = -1;  // 1.22 Snapshot: whose slots
  int64_t position = 0;
  int move_join = -1, move_drain = -1;  // 1.24 MoveAsk
  bool takes_moves = false;             // 1.24 Barrier
  int move_leave_worker = -1;           // 1.26 MoveAsk
  bool leaves = false;                  // 1.18 Finish
  int64_t leaves_at = -1;               // 1.26 Finish
  int move_rejoin_worker = -1;          // 1.27 MoveAsk
  int64_t joins_at = 0;                 // 1.18 Hello (1.27: wire::kWaitsToRejoin)
};

std::string Header(const HeaderFields& f) {
  flatbuffers::FlatBufferBuilder fbb(256);
  flatbuffers::Offset<flatbuffers::Vector<const wire::DenseSlice*>> slices;
  if (!f.slices.empty()) slices = fbb.CreateVectorOfStructs(f.slices);
  flatbuffers::Offset<flatbuffers::Vector<const wire::SparseSlice*>> sparse;
  if (!f.sparse.empty()) sparse = fbb.CreateVectorOfStructs(f.sparse);
  flatbuffers::Offset<wire::TableSpec> spec;
  if (f.spec != nullptr) spec = wire::SpecToWire(fbb, *f.spec);
  flatbuffers::Offset<flatbuffers::Vector<uint16_t>> placement;
  if (!f.placement.empty()) placement = fbb.CreateVector(f.placement);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::ShardFile>>> shards;
  if (!f.shards.empty()) {
    std::vector<flatbuffers::Offset<wire::ShardFile>> files;
    for (const auto& [name, bytes] : f.shards) {
      auto file = fbb.CreateString(name);
      auto tables = wire::TableStepsToWire(fbb, f.table_steps);
      files.push_back(wire::CreateShardFile(fbb, file, bytes, 0x12345678u, {}, tables));
    }
    shards = fbb.CreateVector(files);
  }
  wire::HeaderBuilder b(fbb);
  b.add_major(f.major);
  b.add_minor(wire::kMinor);
  b.add_kind(f.kind);
  b.add_request_id(f.request_id);
  b.add_rank(f.rank);
  if (f.table_id != 0) b.add_table_id(f.table_id);
  b.add_step(f.step);
  if (!f.slices.empty()) b.add_slices(slices);
  if (!f.sparse.empty()) b.add_sparse(sparse);
  if (f.num_ids != 0) b.add_num_ids(f.num_ids);
  if (f.dim != 0) b.add_dim(f.dim);
  if (f.spec != nullptr) b.add_spec(spec);
  if (f.barrier_id != 0) b.add_barrier_id(f.barrier_id);
  if (f.hello) {
    b.add_num_workers(kWorkers);
    b.add_num_servers(1);
    b.add_server_rank(0);
    b.add_heartbeat_ms(0);
  }
  if (!f.shards.empty()) b.add_shards(shards);
  if (f.placement_version != 0) b.add_placement_version(f.placement_version);
  if (!f.placement.empty()) b.add_placement(placement);
  if (f.full) b.add_full(true);
  if (f.snapshot_of >= 0) {
    b.add_server_rank(f.snapshot_of);
    b.add_position(f.position);
    b.add_max_bytes(4096);
  }
  if (f.move_join >= 0) b.add_move_join(f.move_join);
  if (f.move_drain >= 0) b.add_move_drain(f.move_drain);
  if (f.takes_moves) b.add_takes_moves(true);
  if (f.move_leave_worker >= 0) b.add_move_leave_worker(f.move_leave_worker);
  if (f.leaves) b.add_leaves(true);
  if (f.leaves_at >= 0) b.add_leaves_at(f.leaves_at);
  if (f.move_rejoin_worker >= 0) b.add_move_rejoin_worker(f.move_rejoin_worker);
  if (f.joins_at != 0) b.add_joins_at(f.joins_at);
  if (f.call != 0) {
    b.add_call(f.call);
    b.add_piece(f.piece);
    b.add_pieces(f.pieces);
  }
  wire::FinishHeaderBuffer(fbb, b.Finish());
  return Bytes(fbb);
}

// Chunks 0..n-1 of a table of `elems` in chunks of `chunk`.
std::vector<wire::DenseSlice> Slices(const TableSpec& t) {
  std::vector<wire::DenseSlice> out;
  const int64_t elems = t.shape[0];
  for (int64_t c = 0; c * t.chunk_elems < elems; ++c) {
    out.emplace_back(TableId(t.name), c, std::min(t.chunk_elems, elems - c * t.chunk_elems));
  }
  return out;
}

std::vector<std::string> Gradients(const std::vector<wire::DenseSlice>& slices, float value) {
  std::vector<std::string> out;
  for (const auto& s : slices) out.push_back(Array(std::vector<float>(static_cast<size_t>(s.count()), value)));
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<std::string>>> SeedMessages() {
  const std::vector<TableSpec> tables = FuzzTables();
  const TableSpec& sync = tables[0];
  const TableSpec& async = tables[1];
  const TableSpec& sparse = tables[2];
  const TableSpec& skip = tables[3];
  const TableSpec& topk = tables[4];
  const TableSpec& bf16 = tables[5];
  std::vector<std::pair<std::string, std::vector<std::string>>> seeds;
  auto add = [&](std::string name, const HeaderFields& h, std::vector<std::string> payload = {}) {
    std::vector<std::string> frames = {Header(h)};
    for (auto& p : payload) frames.push_back(std::move(p));
    seeds.emplace_back(std::move(name), std::move(frames));
  };
  auto make = [](Kind kind) {
    HeaderFields h;
    h.kind = kind;
    return h;
  };
  HeaderFields h = make(Kind::Hello);
  h.hello = true;
  add("hello", h);

  TableSpec extra;
  extra.name = "fuzz_extra";
  extra.shape = {8};
  h = make(Kind::CreateTable);
  h.table_id = TableId(extra.name);
  h.spec = &extra;
  add("create_table", h);
  h.table_id = TableId(sparse.name);
  h.spec = &sparse;
  add("create_sparse", h);

  h = make(Kind::PullDense);
  h.slices = Slices(async);
  add("pull_dense", h);
  h.kind = Kind::PushDense;
  add("push_dense", h, Gradients(h.slices, 0.5f));
  add("push_dense_nan", h, Gradients(h.slices, NAN));
  h.kind = Kind::PushPullDense;
  add("pushpull_dense", h, Gradients(h.slices, 0.25f));
  h.major = static_cast<uint16_t>(wire::kMajor + 1);
  add("other_major", h, Gradients(h.slices, 0.25f));
  h = make(Kind::PushDense);
  h.slices = Slices(sync);
  add("push_dense_sync", h, Gradients(h.slices, 1.0f));
  // 1.10: a sync push in pieces, its first and its last (of 2) each with one chunk.
  const std::vector<wire::DenseSlice> sync_chunks = h.slices;
  h.call = 9;
  h.pieces = 2;
  h.slices = {sync_chunks[0]};
  add("push_dense_sync_piece_0", h, Gradients(h.slices, 1.0f));
  h.piece = 1;
  h.slices = {sync_chunks[1]};
  add("push_dense_sync_piece_1", h, Gradients(h.slices, 1.0f));
  h.kind = Kind::PushPullDense;
  add("pushpull_dense_sync_piece_1", h, Gradients(h.slices, 1.0f));
  h = make(Kind::PushDense);
  h.slices = sync_chunks;
  h.kind = Kind::PullDense;
  h.step = 1;
  add("pull_dense_sync", h);

  const std::vector<int64_t> ids = {1, 7, int64_t{1} << 40, 3};
  h = make(Kind::PullSparse);
  h.table_id = TableId(sparse.name);
  h.num_ids = 4;
  h.dim = sparse.dim;
  add("pull_sparse", h, {Array(ids)});
  h.kind = Kind::PushSparse;
  add("push_sparse", h, {Array(ids), Array(std::vector<float>(16, 0.1f))});
  std::vector<float> rows(8, 0.2f);
  rows[3] = INFINITY;
  h.table_id = TableId(skip.name);
  h.dim = skip.dim;
  add("push_sparse_skip_rows", h, {Array(ids), Array(rows)});

  // 1.5: two sparse tables in one message (the second with lifecycle-free skip_rows).
  h = make(Kind::PullSparseTables);
  h.sparse = {wire::SparseSlice(TableId(sparse.name), sparse.dim, 4),
              wire::SparseSlice(TableId(skip.name), skip.dim, 4)};
  add("pull_sparse_tables", h, {Array(ids), Array(ids)});
  h.kind = Kind::PushSparseTables;
  add("push_sparse_tables", h,
      {Array(ids), Array(std::vector<float>(static_cast<size_t>(4 * sparse.dim), 0.1f)), Array(ids), Array(rows)});

  // 1.6: compressed tables. Top-k frames: k uint32 indices (increasing) then k fp16 values;
  // bf16 rows: 2 bytes a value.
  auto topk_frame = [](int64_t count, float ratio, bool bad) {
    const int64_t k = wire::TopKCount(ratio, count);
    std::vector<uint32_t> idx;
    for (int64_t j = 0; j < k; ++j) idx.push_back(static_cast<uint32_t>(j * (count / k)));
    if (bad) idx.back() = static_cast<uint32_t>(count);  // one past the chunk: refused
    std::vector<uint16_t> values(static_cast<size_t>(k), 0x3c00);  // fp16 1.0
    return Array(idx) + Array(values);
  };
  h = make(Kind::PushDense);
  h.slices = Slices(topk);
  std::vector<std::string> frames;
  for (const auto& sl : h.slices) frames.push_back(topk_frame(sl.count(), topk.topk_ratio, false));
  add("push_dense_topk_fp16", h, frames);
  frames.back() = topk_frame(h.slices.back().count(), topk.topk_ratio, true);
  add("push_dense_topk_bad_index", h, frames);
  h.kind = Kind::PushPullDense;
  frames.back() = topk_frame(h.slices.back().count(), topk.topk_ratio, false);
  add("pushpull_dense_topk_fp16", h, frames);
  h.kind = Kind::PullDense;
  add("pull_dense_fp16", h);
  h = make(Kind::PushSparseTables);
  h.sparse = {wire::SparseSlice(TableId(bf16.name), bf16.dim, 4)};
  add("push_sparse_bf16", h, {Array(ids), Array(std::vector<uint16_t>(static_cast<size_t>(4 * bf16.dim), 0x3f80))});
  h.kind = Kind::PullSparseTables;
  add("pull_sparse_bf16", h, {Array(ids)});

  h = make(Kind::Clock);
  h.step = 1;
  add("clock", h);
  add("barrier", make(Kind::Barrier));
  h = make(Kind::AllReduce);
  h.num_ids = 3;
  h.barrier_id = 1;
  add("all_reduce", h, {Array(std::vector<double>{1, 2, 3})});
  add("stats", make(Kind::Stats));
  add("heartbeat", make(Kind::Heartbeat));
  add("checkpoint", make(Kind::Checkpoint));
  h = make(Kind::CommitCheckpoint);
  h.shards = {{"step-000000000000/shard-00000-of-00001.ckpt", 4096}};
  add("commit_checkpoint", h);
  h.shards = {{"../../etc/passwd", 1}};
  add("commit_checkpoint_bad_name", h);
  // 1.25: each shard's table shares (one worker); a step outside [-1, 2^62] is refused.
  h.shards = {{"step-000000000000/shard-00000-of-00001.ckpt", 4096}};
  h.table_steps = {{h.table_id, {3}}};
  add("commit_checkpoint_table_steps", h);
  h.table_steps = {{h.table_id, {-5}}};
  add("commit_checkpoint_bad_table_steps", h);
  h.table_steps.clear();
  add("finish", make(Kind::Finish));
  // 1.17: a map of the one server's slots (its own: version 2 refused as not moving anything
  // new, or taken over from a checkpoint the folder lacks), and a pull placed by another map.
  h = make(Kind::Placement);
  h.placement_version = 2;
  h.placement.assign(5040, 0);
  h.full = true;
  add("placement", h);
  h = make(Kind::PullDense);
  h.slices = Slices(sync);
  h.step = 1;
  h.placement_version = 7;
  add("pull_dense_other_placement", h);
  // 1.21: a primary's updates for its backup's replica (this server keeps none: refused).
  h = make(Kind::Replicate);
  h.slices = Slices(async);
  add("replicate_dense", h, Gradients(h.slices, 0.5f));
  h = make(Kind::Replicate);
  h.sparse = {wire::SparseSlice(TableId(sparse.name), sparse.dim, 4)};
  add("replicate_sparse", h, {Array(ids), Array(std::vector<float>(static_cast<size_t>(4 * sparse.dim), 0.1f))});
  // 1.22: a replacement's request for a page of an image (this server keeps no replica: refused).
  h = make(Kind::Snapshot);
  h.snapshot_of = 0;
  add("snapshot_first_page", h);
  h.position = 4096;
  add("snapshot_next_page", h);
  // 1.24: a move asked of server 0 (the one server owns every slot: refused), and a barrier that
  // takes moves.
  h = make(Kind::MoveAsk);
  h.move_join = 0;
  add("move_ask_join", h);
  h = make(Kind::MoveAsk);
  h.move_drain = 0;
  add("move_ask_drain", h);
  h = make(Kind::Barrier);
  h.barrier_id = 0;
  h.takes_moves = true;
  add("barrier_takes_moves", h);
  // 1.26: a worker's leave asked of server 0 (worker 0: refused, it stays), and a Finish that
  // leaves before a step.
  h = make(Kind::MoveAsk);
  h.move_leave_worker = 0;
  add("move_ask_leave_worker", h);
  h = make(Kind::Finish);
  h.leaves = true;
  h.leaves_at = 3;
  add("finish_leaves_at", h);
  // 1.27: a worker's join again asked of server 0 (no process of it waits: refused), and a Hello
  // of one that waits to join again (it has not left: refused).
  h = make(Kind::MoveAsk);
  h.move_rejoin_worker = 1;
  add("move_ask_rejoin_worker", h);
  h = make(Kind::Hello);
  h.hello = true;
  h.joins_at = wire::kWaitsToRejoin;
  add("hello_waits_to_rejoin", h);
  return seeds;
}

}  // namespace ferry::fuzz
