// Checkpoints on disk (ps/server/internal/checkpoint.h, format in messages/CHECKPOINT.md):
// written by two servers, restored into 1, 3 and 2 with every parameter, optimizer slot, row
// step count and version bitwise equal; every single-byte corruption, a truncation, a missing
// manifest or CURRENT refused with the file named, and the previous good checkpoint used.
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>
#include <zlib.h>

#include "ferry/messages/placement.h"
#include "internal/checkpoint.h"
#include "internal/recovery.h"
#include "internal/table_registry.h"
#include "support/temp_dir.h"

namespace ferry::ps {
namespace {

namespace fs = std::filesystem;

TableSpec Dense() {
  TableSpec s;
  s.name = "w";
  s.shape = {10, 7};
  s.chunk_elems = 16;  // 5 chunks, spread over the servers
  s.optimizer.type = OptimizerType::kAdam;
  s.consistency = Consistency::kSync;
  return s;
}

TableSpec Sparse() {
  TableSpec s;
  s.name = "emb";
  s.type = TableType::kSparse;
  s.dim = 3;
  s.optimizer.type = OptimizerType::kAdagrad;
  return s;
}

// What a table holds, gathered over every server: for comparing before and after.
struct Gathered {
  std::map<int64_t, std::vector<float>> chunk_params, chunk_state;
  std::map<int64_t, int64_t> chunk_version;
  std::map<int64_t, std::vector<float>> rows;
  std::map<int64_t, int64_t> row_steps;
  bool operator==(const Gathered&) const = default;
};

Gathered Gather(std::vector<TableRegistry>& servers) {
  Gathered g;
  for (auto& reg : servers) {
    auto w = reg.Find(TableId("w"), TableType::kDense);
    EXPECT_TRUE(w.ok());
    for (int64_t i = 0; i < (*w)->dense->num_chunks(); ++i) {
      if (const DenseChunk* c = (*w)->dense->chunk(i)) {
        EXPECT_EQ(g.chunk_params.count(i), 0u) << "chunk " << i << " on two servers";
        g.chunk_params[i].assign(c->params.begin(), c->params.end());
        g.chunk_state[i] = c->state;
        g.chunk_version[i] = c->version;
      }
    }
    auto emb = reg.Find(TableId("emb"), TableType::kSparse);
    EXPECT_TRUE(emb.ok());
    const SparseShard& s = *(*emb)->sparse;
    s.ForEachRow([&](int64_t id, RowIndex r) {
      EXPECT_EQ(g.rows.count(id), 0u) << "id " << id << " on two servers";
      g.rows[id] = std::vector<float>(s.row(r), s.row(r) + s.row_floats());
      g.row_steps[id] = s.steps(r);
    });
  }
  return g;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::remove_all(dir_);  // the tests make it when they write the first checkpoint
    // Two servers of a job of 2 workers, with values no initialiser would produce.
    for (int r = 0; r < 2; ++r) {
      servers_.emplace_back(r, 2);
      TableRegistry& reg = servers_.back();
      ASSERT_TRUE(reg.Create(Dense(), TableId("w"), 2).ok());
      ASSERT_TRUE(reg.Create(Sparse(), TableId("emb"), 2).ok());
      Table* w = *reg.Find(TableId("w"), TableType::kDense);
      for (int64_t i = 0; i < w->dense->num_chunks(); ++i) {
        if (DenseChunk* c = w->dense->chunk(i)) {
          for (size_t k = 0; k < c->params.size(); ++k) c->params[k] = 0.1f * static_cast<float>(c->offset + k) - 3.0f;
          for (size_t k = 0; k < c->state.size(); ++k) c->state[k] = 1.0f / static_cast<float>(k + 3 + i);
          c->version = 7;
        }
      }
      SparseShard& s = *(*reg.Find(TableId("emb"), TableType::kSparse))->sparse;
      for (int64_t id = -50; id < 400; id += 3) {
        if (placement::IdServer(id, 2) != r) continue;
        const RowIndex x = s.FindOrCreate(id);
        for (int64_t k = 0; k < s.row_floats(); ++k)
          s.row(x)[k] = static_cast<float>(id) * 0.25f + static_cast<float>(k);
        s.steps(x) = (id + 50) % 11 + 1;  // every row updated at least once: all are saved
      }
      s.version = 7;
    }
    before_ = Gather(servers_);
  }

  // Both servers write their shards for `step`, then the manifest.
  void Save(int64_t step, int keep = 3) {
    std::vector<ShardFile> shards;
    for (int r = 0; r < 2; ++r) {
      auto f = WriteShard(dir_.string(), r, 2, step, servers_[static_cast<size_t>(r)]);
      ASSERT_TRUE(f.ok()) << f.status();
      shards.push_back(*f);
    }
    ASSERT_TRUE(
        WriteManifest(dir_.string(), step, shards, "sync: every server at step " + std::to_string(step), keep).ok());
  }

  fs::path Shard(int64_t step, int rank) const {
    char buf[96];
    std::snprintf(buf, sizeof buf, "step-%020lld-shard-%05d-of-00002.ckpt", static_cast<long long>(step), rank);
    return dir_ / buf;
  }

  test::TempDir tmp_{"ckpt-test"};
  const fs::path dir_ = tmp_.path();
  std::vector<TableRegistry> servers_;
  Gathered before_;
};

// A row never updated holds its initial values, which a pull makes again: it is not saved, so a
// sync checkpoint does not depend on which workers had pulled (created) a step's new rows.
// Failover (1.22): the image a peer sends a replacement (EncodeImage) restores the shard bit for bit,
// each part's steps taken as its replay floors and the workers' state; an image with any byte
// changed or missing, or one that verifies but does not hold what it says, is refused, never
// half restored into a server.
TEST_F(CheckpointTest, ARecoveryImageRestoresTheShardAndAnyDamageIsRefused) {
  const std::vector<WorkerState> workers = {{4, false, false}, {2, true, false}};
  std::vector<std::vector<char>> blobs;
  for (int r = 0; r < 2; ++r) {
    servers_[static_cast<size_t>(r)].ForEach([&](Table& t) {
      if (t.sparse) t.sparse->steps_taken.taken = {5, 3};
      for (int64_t i = 0; t.dense && i < t.dense->num_chunks(); ++i) {
        if (DenseChunk* c = t.dense->chunk(i)) c->steps_taken.taken = {i, 2};
      }
    });
    blobs.push_back(EncodeImage(servers_[static_cast<size_t>(r)], workers));
  }
  std::vector<TableRegistry> restored;
  for (int r = 0; r < 2; ++r) {
    restored.emplace_back(r, 2);
    std::vector<WorkerState> got;
    ASSERT_TRUE(RestoreImage(blobs[static_cast<size_t>(r)], r, 2, &restored.back(), "image", &got).ok());
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].clock, 4);
    EXPECT_TRUE(got[1].finished);
    EXPECT_FALSE(got[0].finished || got[0].left || got[1].left);
    restored.back().ForEach([&](Table& t) {
      EXPECT_FALSE(t.settings_open);
      if (t.sparse) {
        EXPECT_EQ(t.sparse->steps_taken.floor, (std::vector<int64_t>{5, 3}));
        EXPECT_TRUE(t.sparse->steps_taken.Replayed(0, 4));
        EXPECT_FALSE(t.sparse->steps_taken.Replayed(0, 5));
      }
      for (int64_t i = 0; t.dense && i < t.dense->num_chunks(); ++i) {
        if (DenseChunk* c = t.dense->chunk(i)) {
          EXPECT_EQ(c->steps_taken.floor, (std::vector<int64_t>{i, 2}));
        }
      }
    });
  }
  EXPECT_EQ(Gather(restored), before_);
  // Server 1's image is not server 0's: its rows and chunks are not server 0's to hold.
  TableRegistry wrong(0, 2);
  std::vector<WorkerState> ws;
  EXPECT_FALSE(RestoreImage(blobs[1], 0, 2, &wrong, "image", &ws).ok());
  const std::vector<char>& blob = blobs[0];
  // Every byte changed (a sample of them, every block's included), and every length cut short.
  for (size_t at = 0; at < blob.size(); at += std::max<size_t>(1, blob.size() / 300)) {
    std::vector<char> bad = blob;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    TableRegistry fresh(0, 2);
    const Status st = RestoreImage(bad, 0, 2, &fresh, "image", &ws);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << "byte " << at << ": " << st;
  }
  for (size_t n : {size_t{0}, size_t{3}, size_t{20}, blob.size() / 2, blob.size() - 1}) {
    TableRegistry fresh(0, 2);
    EXPECT_FALSE(RestoreImage(std::span(blob).first(n), 0, 2, &fresh, "image", &ws).ok()) << n << " bytes";
  }
  // One that verifies (its CRC made again) but whose fields lie: counts beyond what it holds.
  auto resealed = [](std::vector<char> b) {
    const uLong crc = crc32(0L, reinterpret_cast<const Bytef*>(b.data()), static_cast<uInt>(b.size() - 4));
    const uint32_t c = static_cast<uint32_t>(crc);
    std::memcpy(b.data() + b.size() - 4, &c, 4);
    return b;
  };
  uint64_t shard_bytes = 0;
  std::memcpy(&shard_bytes, blob.data(), 8);
  for (const uint64_t lie : {shard_bytes + 1, shard_bytes - 1, uint64_t{1} << 62}) {
    std::vector<char> bad = blob;
    std::memcpy(bad.data(), &lie, 8);
    TableRegistry fresh(0, 2);
    EXPECT_EQ(RestoreImage(resealed(bad), 0, 2, &fresh, "image", &ws).code(), StatusCode::kDataLoss) << lie;
  }
  std::vector<char> bad = blob;
  const uint64_t units = uint64_t{1} << 40;
  std::memcpy(bad.data() + 8 + shard_bytes, &units, 8);
  TableRegistry fresh(0, 2);
  EXPECT_EQ(RestoreImage(resealed(bad), 0, 2, &fresh, "image", &ws).code(), StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, RowsNeverUpdatedAreNotSaved) {
  SparseShard& s = *(*servers_[0].Find(TableId("emb"), TableType::kSparse))->sparse;
  int64_t fresh = 1001;
  while (placement::IdServer(fresh, 2) != 0) ++fresh;
  const RowIndex x = s.FindOrCreate(fresh);  // a pull made it; no push yet
  ASSERT_EQ(s.steps(x), 0);
  Save(8);
  auto ckpt = ReadCheckpoint(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const auto& rows = ckpt->tables.at(TableId("emb")).rows;
  EXPECT_EQ(rows.count(fresh), 0u);
  EXPECT_EQ(rows.size(), before_.rows.size()) << "every updated row is saved";
}

TEST_F(CheckpointTest, RestoresBitwiseIntoOneThreeAndTwoServers) {
  Save(7);
  auto ckpt = ReadCheckpoint(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 7);
  EXPECT_EQ(ckpt->num_servers, 2);
  EXPECT_EQ(ckpt->meaning, "sync: every server at step 7");
  for (int n : {1, 3, 2}) {
    std::vector<TableRegistry> restored;
    for (int r = 0; r < n; ++r) {
      restored.emplace_back(r, n);
      ASSERT_TRUE(RestoreShard(*ckpt, r, 2, &restored.back()).ok());
    }
    const Gathered after = Gather(restored);
    EXPECT_EQ(after.chunk_params.size(), 5u);
    EXPECT_EQ(after.rows.size(), before_.rows.size());
    EXPECT_TRUE(after == before_) << "restored into " << n << " servers";
    // Specs come back as declared, versions with them.
    auto w = restored[0].Find(TableId("w"), TableType::kDense);
    ASSERT_TRUE(w.ok());
    EXPECT_TRUE((*w)->spec == Dense());
    EXPECT_EQ((*restored[0].Find(TableId("emb"), TableType::kSparse))->sparse->version, 7);
  }
}

// The manifest says by which placement its servers held what they saved (1.16: slots). One without
// it was written before, under the rule "mod S": what its shards recorded per server is read by
// that rule, which for 11 servers differs from the slots' (for 2, as here, it does not).
TEST_F(CheckpointTest, TheManifestNamesItsPlacementAndOneWithoutItIsReadByTheRuleBefore) {
  Save(7);
  const fs::path manifest = dir_ / "MANIFEST-00000000000000000007";
  nlohmann::json m;
  std::ifstream(manifest) >> m;
  EXPECT_EQ(m["placement"], "slots-5040");
  auto ckpt = ReadCheckpointAt(dir_.string(), 7);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE(ckpt->before_slots);
  auto rewrite = [&](const nlohmann::json& j) { std::ofstream(manifest, std::ios::trunc) << j.dump(1) << "\n"; };
  nlohmann::json before = m;
  before.erase("placement");
  rewrite(before);
  ckpt = ReadCheckpointAt(dir_.string(), 7);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->before_slots);
  std::vector<TableRegistry> restored;
  for (int r = 0; r < 2; ++r) {
    restored.emplace_back(r, 2);
    ASSERT_TRUE(RestoreShard(*ckpt, r, 2, &restored.back()).ok());
  }
  EXPECT_TRUE(Gather(restored) == before_) << "2 servers: the same placement either way";
  // The record of who held what, for a job of 11 (a count that does not divide 5,040).
  Table::Replay old_rule, slots;
  old_rule.servers = slots.servers = 11;
  old_rule.before_slots = true;
  int differ = 0;
  for (int64_t id = 0; id < 1000; ++id) {
    ASSERT_EQ(old_rule.IdServer(id), placement::IdServerBeforeSlots(id, 11));
    ASSERT_EQ(slots.IdServer(id), placement::IdServer(id, 11));
    differ += old_rule.IdServer(id) != slots.IdServer(id);
  }
  EXPECT_GT(differ, 500) << "the two rules place most ids of 11 servers apart";
  for (int64_t c = 0; c < 100; ++c) {
    ASSERT_EQ(old_rule.ChunkServer(TableId("w"), c), placement::ChunkServerBeforeSlots(TableId("w"), c, 11));
  }
  // A placement this build does not know is refused, naming it.
  nlohmann::json other = m;
  other["placement"] = "rendezvous";
  rewrite(other);
  ckpt = ReadCheckpointAt(dir_.string(), 7);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), StatusCode::kFailedPrecondition) << ckpt.status();
  EXPECT_NE(ckpt.status().message().find("placement \"rendezvous\", this build knows \"slots-5040\""),
            std::string::npos)
      << ckpt.status();
}

// 1.25: each shard's record of its async/ssp table shares (table_steps, by table id) is kept in
// the manifest and read back by shard; anything but an object of decimal table ids naming lists of
// steps is refused as damage, naming what is wrong.
TEST_F(CheckpointTest, TheManifestKeepsEachShardsTableStepsAndRefusesDamagedOnes) {
  std::vector<ShardFile> shards;
  for (int r = 0; r < 2; ++r) {
    auto f = WriteShard(dir_.string(), r, 2, 9, servers_[static_cast<size_t>(r)]);
    ASSERT_TRUE(f.ok()) << f.status();
    f->worker_steps = {6 - r, 5};
    f->table_steps[TableId("w")] = {6 - r, 5};
    f->table_steps[TableId("emb")] = {5, 5};
    shards.push_back(*f);
  }
  ASSERT_TRUE(WriteManifest(dir_.string(), 9, shards, "async", 3, {5, 5}).ok());
  auto ckpt = ReadCheckpointAt(dir_.string(), 9);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ(ckpt->shard_table_steps.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ckpt->shard_table_steps[static_cast<size_t>(r)], shards[static_cast<size_t>(r)].table_steps) << r;
  }
  const fs::path manifest = dir_ / "MANIFEST-00000000000000000009";
  nlohmann::json m;
  std::ifstream(manifest) >> m;
  const std::string w = std::to_string(TableId("w"));
  for (const auto& [bad, says] : std::vector<std::pair<nlohmann::json, std::string>>{
           {nlohmann::json::array({5, 5}), "table_steps is not an object"},
           {{{"w", {5, 5}}}, "names 'w', not a table id"},
           {{{w + "x", {5, 5}}}, "not a table id"},
           {{{"0" + w, {5, 5}}}, "not a table id"},
           {{{w, "5"}}, "table_steps is not a list"},
           {{{w, {5, -2}}}, "holds -2, not an integer in [-1, 2^62]"}}) {
    nlohmann::json damaged = m;
    damaged["shards"][1]["table_steps"] = bad;
    std::ofstream(manifest, std::ios::trunc) << damaged.dump(1) << "\n";
    ckpt = ReadCheckpointAt(dir_.string(), 9);
    ASSERT_FALSE(ckpt.ok()) << bad.dump();
    EXPECT_EQ(ckpt.status().code(), StatusCode::kDataLoss) << ckpt.status();
    EXPECT_NE(ckpt.status().message().find(says), std::string::npos) << bad.dump() << ": " << ckpt.status();
  }
}

// 1.25: the parts a hand-over moves carry what their share had taken of each worker's steps (the
// hand-over checkpoint's table_steps), so that the next checkpoint records it: a part taken over
// with nothing taken would make the workers replay steps it holds, and apply them twice.
TEST(CheckpointHandOver, PartsTakenOverCarryTheirSharesTableSteps) {
  test::TempDir tmp("ckpt-handover");
  TableSpec dense = Dense(), sparse = Sparse();
  dense.consistency = sparse.consistency = Consistency::kAsync;
  std::vector<TableRegistry> servers;
  std::vector<ShardFile> shards;
  for (int r = 0; r < 2; ++r) {
    servers.emplace_back(r, 2);
    TableRegistry& reg = servers.back();
    ASSERT_TRUE(reg.Create(dense, TableId("w"), 2).ok());
    ASSERT_TRUE(reg.Create(sparse, TableId("emb"), 2).ok());
    Table* w = *reg.Find(TableId("w"), TableType::kDense);
    for (int64_t i = 0; i < w->dense->num_chunks(); ++i) {
      if (DenseChunk* c = w->dense->chunk(i)) {
        c->steps_taken.Took(0, 5);  // worker 0 took steps up to 5, worker 1 up to 3 + r
        c->steps_taken.Took(1, 3 + r);
      }
    }
    SparseShard& s = *(*reg.Find(TableId("emb"), TableType::kSparse))->sparse;
    for (int64_t id = 0; id < 40; ++id) {
      if (placement::IdServer(id, 2) == r) s.steps(s.FindOrCreate(id)) = 1;
    }
    s.steps_taken.Took(0, 5);
    if (r == 1) s.steps_taken.Took(1, 7);
    auto f = WriteShard(tmp.path().string(), r, 2, 9, reg);
    ASSERT_TRUE(f.ok()) << f.status();
    f->table_steps = TakenByTable(reg, 2);
    EXPECT_EQ(f->table_steps[TableId("w")], (std::vector<int64_t>{6, 4 + r}));
    EXPECT_EQ(f->table_steps[TableId("emb")], (std::vector<int64_t>{6, r == 1 ? 8 : 0}));
    f->worker_steps = {6, 4 + r};
    shards.push_back(*f);
  }
  ASSERT_TRUE(WriteManifest(tmp.path().string(), 9, shards, "async", 3, {6, 4}).ok());
  auto ckpt = ReadCheckpointAt(tmp.path().string(), 9);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  // Every slot of server 1 goes to server 0.
  std::vector<uint16_t> owners = placement::Placement::First(2).Owners();
  for (uint16_t& o : owners) o = 0;
  auto next = placement::Placement::FromOwners(2, owners, 2);
  ASSERT_TRUE(next.ok()) << next.status();
  auto counts = HandOver(*ckpt, *next, 0, 2, &servers[0], false);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_GT(counts->chunks_taken, 0);
  EXPECT_GT(counts->rows_taken, 0);
  const auto taken = TakenByTable(servers[0], 2);
  // The dense table: the lowest over its chunks, server 1's carried (worker 1: 4 of its own, 5 of
  // server 1's). The sparse share keeps what it had taken of its own (worker 0: 6), and takes
  // server 1's for the worker it had taken nothing of (worker 1: 8).
  EXPECT_EQ(taken.at(TableId("w")), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(taken.at(TableId("emb")), (std::vector<int64_t>{6, 8}));
}

TEST_F(CheckpointTest, TheSameTablesGiveTheSameBytes) {
  Save(7);
  Save(8);
  std::ifstream a(Shard(7, 1), std::ios::binary), b(Shard(8, 1), std::ios::binary);
  const std::string x((std::istreambuf_iterator<char>(a)), {}), y((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(x, y);
  EXPECT_GT(x.size(), 100u);
}

// Every byte of a shard flipped in turn, with the manifest updated to match the corrupt file
// (so only the blocks' own checks can catch it): never read as good; the older checkpoint is
// used, and the file is named.
TEST_F(CheckpointTest, EveryFlippedByteIsCaughtAndTheOlderCheckpointUsed) {
  Save(5);
  Save(7);
  const fs::path shard = Shard(7, 0);
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), {});
  }
  const fs::path manifest = dir_ / "MANIFEST-00000000000000000007";
  nlohmann::json m;
  {
    std::ifstream in(manifest);
    in >> m;
  }
  ASSERT_LT(bytes.size(), 20000u);  // keeps the loop short
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x41);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bad;
    nlohmann::json mm = m;
    mm["shards"][0]["crc32"] = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bad.data()), bad.size()));
    std::ofstream(manifest, std::ios::trunc) << mm.dump();
    std::vector<std::string> skipped;
    auto ckpt = ReadCheckpoint(dir_.string(), &skipped);
    ASSERT_TRUE(ckpt.ok()) << "byte " << i << ": " << ckpt.status();
    ASSERT_EQ(ckpt->step, 5) << "byte " << i << " flipped, yet step 7 was read as good";
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_NE(skipped[0].find(shard.string()), std::string::npos) << "byte " << i << ": " << skipped[0];
  }
}

// A hand-over reads only what moves (CheckpointFilter): the shards whose writers owned a slot it
// keeps, each verified whole, and of them only the chunks and rows of its slots, as a read of the
// whole checkpoint has them.
TEST_F(CheckpointTest, AFilteredReadOpensOnlyTheShardsOfItsSlotsAndKeepsOnlyThem) {
  Save(7);
  auto whole = ReadCheckpointAt(dir_.string(), 7);
  ASSERT_TRUE(whole.ok()) << whole.status();
  CheckpointFilter filter;  // every third slot of server 1 (the first map of 2: the odd slots)
  filter.slots.assign(placement::kSlots, false);
  for (int slot = 1; slot < placement::kSlots; slot += 6) filter.slots[static_cast<size_t>(slot)] = true;
  auto part = ReadCheckpointAt(dir_.string(), 7, &filter);
  ASSERT_TRUE(part.ok()) << part.status();
  ASSERT_EQ(part->tables.size(), whole->tables.size()) << "every table's spec, from the shard read";
  const auto& w = whole->tables.at(TableId("w"));
  const auto& emb = whole->tables.at(TableId("emb"));
  const auto& pw = part->tables.at(TableId("w"));
  const auto& pemb = part->tables.at(TableId("emb"));
  EXPECT_TRUE(pw.spec == Dense());
  size_t chunks = 0, rows = 0;
  for (const auto& [c, chunk] : w.chunks) {
    if (!filter.Keeps(placement::ChunkSlot(TableId("w"), c))) continue;
    ++chunks;
    ASSERT_EQ(pw.chunks.count(c), 1u) << "chunk " << c;
    EXPECT_EQ(pw.chunks.at(c).params, chunk.params);
    EXPECT_EQ(pw.chunks.at(c).state, chunk.state);
    EXPECT_EQ(pw.chunks.at(c).version, chunk.version);
  }
  for (const auto& [id, row] : emb.rows) {
    if (!filter.Keeps(placement::IdSlot(id))) continue;
    ++rows;
    ASSERT_EQ(pemb.rows.count(id), 1u) << "id " << id;
    EXPECT_EQ(pemb.rows.at(id).values, row.values);
    EXPECT_EQ(pemb.rows.at(id).steps, row.steps);
  }
  EXPECT_EQ(pw.chunks.size(), chunks);
  EXPECT_EQ(pemb.rows.size(), rows);
  EXPECT_GT(rows, 5u);
  EXPECT_LT(rows, emb.rows.size() / 4);
  EXPECT_EQ(pemb.sparse_version, emb.sparse_version);
  // Of what it gives up a hand-over keeps versions and update counts alone (versions_only).
  CheckpointFilter counts = filter;
  counts.versions_only.assign(placement::kSlots, false);
  for (int slot = 1; slot < placement::kSlots; slot += 12) counts.versions_only[static_cast<size_t>(slot)] = true;
  auto lean = ReadCheckpointAt(dir_.string(), 7, &counts);
  ASSERT_TRUE(lean.ok()) << lean.status();
  size_t without_values = 0;
  for (const auto& [id, row] : lean->tables.at(TableId("emb")).rows) {
    ASSERT_EQ(row.steps, emb.rows.at(id).steps) << "id " << id;
    const bool values = !counts.versions_only[static_cast<size_t>(placement::IdSlot(id))];
    EXPECT_EQ(row.values, values ? emb.rows.at(id).values : std::vector<float>{}) << "id " << id;
    without_values += !values;
  }
  EXPECT_EQ(lean->tables.at(TableId("emb")).rows.size(), rows);
  EXPECT_GT(without_values, 0u);
  EXPECT_LT(without_values, rows);
  for (const auto& [c, chunk] : lean->tables.at(TableId("w")).chunks) {
    EXPECT_EQ(chunk.version, w.chunks.at(c).version);
    const bool values = !counts.versions_only[static_cast<size_t>(placement::ChunkSlot(TableId("w"), c))];
    EXPECT_EQ(chunk.params.size(), values ? w.chunks.at(c).params.size() : 0u) << "chunk " << c;
  }
  // Shard 0 is not opened: without its file the filtered read is as before, the whole read
  // refused naming it; a filter with one slot of server 0 reads it, and is refused too.
  const fs::path moved_away = dir_ / "shard-0.away";
  fs::rename(Shard(7, 0), moved_away);
  auto refused = ReadCheckpointAt(dir_.string(), 7);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(Shard(7, 0).string()), std::string::npos) << refused.status();
  auto again = ReadCheckpointAt(dir_.string(), 7, &filter);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tables.at(TableId("emb")).rows.size(), rows);
  CheckpointFilter with_zero = filter;
  with_zero.slots[0] = true;
  refused = ReadCheckpointAt(dir_.string(), 7, &with_zero);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(Shard(7, 0).string()), std::string::npos) << refused.status();
  fs::rename(moved_away, Shard(7, 0));
  // A shard read is verified whole: any byte flipped in shard 1 is refused, in a block the filter
  // keeps or not.
  std::string shard1;
  {
    std::ifstream in(Shard(7, 1), std::ios::binary);
    shard1.assign((std::istreambuf_iterator<char>(in)), {});
  }
  ASSERT_LT(shard1.size(), 20000u);  // keeps the loop short
  for (size_t i = 0; i < shard1.size(); ++i) {
    std::string bad = shard1;
    bad[i] = static_cast<char>(bad[i] ^ 0x41);
    std::ofstream(Shard(7, 1), std::ios::binary | std::ios::trunc) << bad;
    auto read = ReadCheckpointAt(dir_.string(), 7, &filter);
    ASSERT_FALSE(read.ok()) << "byte " << i << " of shard 1 flipped, yet it was read";
    ASSERT_NE(read.status().message().find(Shard(7, 1).string()), std::string::npos) << read.status();
  }
  // A filter that keeps no slot reads no shard, whatever the manifest (one before slots too).
  CheckpointFilter none;
  none.slots.assign(placement::kSlots, false);
  fs::rename(Shard(7, 0), moved_away);
  auto nothing = ReadCheckpointAt(dir_.string(), 7, &none);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_TRUE(nothing->tables.empty());
  EXPECT_EQ(nothing->num_servers, 2);
  fs::rename(moved_away, Shard(7, 0));
  // A filter of another size is refused.
  CheckpointFilter short_filter;
  short_filter.slots.assign(10, true);
  EXPECT_EQ(ReadCheckpointAt(dir_.string(), 7, &short_filter).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CheckpointTest, TruncatedFilesAndMissingManifestsFallBackSayingWhy) {
  Save(5);
  Save(7);
  // Truncated: the manifest's size catches it.
  fs::resize_file(Shard(7, 1), fs::file_size(Shard(7, 1)) - 10);
  std::vector<std::string> skipped;
  auto ckpt = ReadCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 5);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("truncated"), std::string::npos) << skipped[0];
  // The newest manifest gone (a crash before it was written): the older checkpoint, no fuss.
  fs::remove(dir_ / "MANIFEST-00000000000000000007");
  ckpt = ReadCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 5);
  // CURRENT gone too: the newest manifest that verifies is found by name.
  fs::remove(dir_ / "CURRENT");
  ckpt = ReadCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 5);
  // A shard of step 5 missing as well: nothing usable, and the error names what was tried.
  fs::remove(Shard(5, 0));
  ckpt = ReadCheckpoint(dir_.string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), StatusCode::kNotFound);
  EXPECT_NE(ckpt.status().message().find("CURRENT: missing"), std::string::npos) << ckpt.status();
  EXPECT_NE(ckpt.status().message().find(Shard(5, 0).string() + ": cannot open"), std::string::npos) << ckpt.status();
}

TEST_F(CheckpointTest, KeepsTheNewestK) {
  Save(1, 2);
  Save(2, 2);
  Save(3, 2);
  EXPECT_FALSE(fs::exists(dir_ / "MANIFEST-00000000000000000001"));
  EXPECT_FALSE(fs::exists(Shard(1, 0)));
  EXPECT_FALSE(fs::exists(Shard(1, 1)));
  EXPECT_TRUE(fs::exists(Shard(2, 0)));
  EXPECT_TRUE(fs::exists(dir_ / "MANIFEST-00000000000000000003"));
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_FALSE(e.path().string().ends_with(".tmp")) << e.path();
  }
  auto ckpt = ReadCheckpoint(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 3);
}

// ---- delta checkpoints ----

TableSpec Life() {  // a sparse table with a row lifecycle: rows get evicted, so deltas record deletions
  TableSpec s;
  s.name = "life";
  s.type = TableType::kSparse;
  s.dim = 2;
  s.optimizer.type = OptimizerType::kMomentum;
  s.max_rows = 12;  // per server
  return s;
}

// What a checkpoint of the servers' tables must hold: every table's chunks and updated rows.
struct Held {
  std::map<uint64_t, std::map<int64_t, std::pair<int64_t, std::vector<float>>>> chunks;  // version, params+state
  std::map<uint64_t, std::map<int64_t, std::pair<int64_t, std::vector<float>>>> rows;    // steps, values
  std::map<uint64_t, int64_t> sparse_version;
  bool operator==(const Held&) const = default;
};

Held Live(std::vector<TableRegistry>& servers) {
  Held h;
  for (auto& reg : servers) {
    reg.ForEach([&](const Table& t) {
      if (t.dense) {
        for (int64_t i = 0; i < t.dense->num_chunks(); ++i) {
          if (const DenseChunk* c = t.dense->chunk(i)) {
            std::vector<float> v(c->params.begin(), c->params.end());
            v.insert(v.end(), c->state.begin(), c->state.end());
            h.chunks[t.id][i] = {c->version, v};
          }
        }
        return;
      }
      const SparseShard& s = *t.sparse;
      s.ForEachRow([&](int64_t id, RowIndex r) {
        if (s.steps(r) > 0) h.rows[t.id][id] = {s.steps(r), std::vector<float>(s.row(r), s.row(r) + s.row_floats())};
      });
      h.sparse_version[t.id] = std::max(h.sparse_version[t.id], s.version);
    });
  }
  return h;
}

Held Read(const CheckpointData& c) {
  Held h;
  for (const auto& [id, t] : c.tables) {
    for (const auto& [i, chunk] : t.chunks) {
      std::vector<float> v = chunk.params;
      v.insert(v.end(), chunk.state.begin(), chunk.state.end());
      h.chunks[id][i] = {chunk.version, v};
    }
    for (const auto& [row, r] : t.rows) h.rows[id][row] = {r.steps, r.values};
    if (t.spec.type == TableType::kSparse) h.sparse_version[id] = t.sparse_version;
  }
  return h;
}

class DeltaCheckpointTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    for (auto& reg : servers_) ASSERT_TRUE(reg.Create(Life(), TableId("life"), 2).ok());
  }

  // Both servers write `step`: full when `delta` is false, else a delta over what each wrote
  // last; then the manifest, each shard with its chain as server 0 finds it.
  // `full_rank`: that server writes a full shard all the same (servers at other points of their chains).
  void SaveStep(int64_t step, bool delta, int keep = 100, int full_rank = -1) {
    std::vector<ShardFile> shards;
    for (int r = 0; r < 2; ++r) {
      const DeltaOf of{last_step_, last_[static_cast<size_t>(r)]};
      const bool as_delta = delta && r != full_rank;
      auto f = WriteShard(dir_.string(), r, 2, step, servers_[static_cast<size_t>(r)], as_delta ? &of : nullptr,
                          /*track=*/true);
      ASSERT_TRUE(f.ok()) << f.status();
      last_[static_cast<size_t>(r)] = *f;
      auto chained = WithChain(dir_.string(), *f);
      ASSERT_TRUE(chained.ok()) << chained.status();
      shards.push_back(*chained);
    }
    last_step_ = step;
    ASSERT_TRUE(WriteManifest(dir_.string(), step, shards, "sync", keep).ok());
    held_[step] = Live(servers_);
  }

  // Changes a few rows and chunks as training does: dense chunks updated (version + 1), sparse
  // rows pushed (new ones made), the lifecycle table pushed past max_rows (rows evicted).
  void Train(int round) {
    for (size_t r = 0; r < servers_.size(); ++r) {
      TableRegistry& reg = servers_[r];
      Table* w = *reg.Find(TableId("w"), TableType::kDense);
      if (DenseChunk* c = w->dense->chunk(round % 5)) {
        for (size_t k = 0; k < c->params.size(); ++k) c->params[k] += 0.5f * static_cast<float>(round + 1);
        ++c->version;
      }
      std::vector<RowIndex> scratch;
      SparseShard& emb = *(*reg.Find(TableId("emb"), TableType::kSparse))->sparse;
      std::vector<int64_t> ids;
      for (int64_t id = round * 7; id < round * 7 + 40; id += 5) {
        if (placement::IdServer(id, 2) == static_cast<int>(r)) ids.push_back(id);
      }
      std::vector<float> grads(ids.size() * 3, 0.25f * static_cast<float>(round + 1));
      emb.ApplyRows(ids, grads.data(), &scratch);
      ++emb.version;
      SparseShard& life = *(*reg.Find(TableId("life"), TableType::kSparse))->sparse;
      ids.clear();
      for (int64_t id = round * 9; id < round * 9 + 30; ++id) {
        if (placement::IdServer(id, 2) == static_cast<int>(r)) ids.push_back(id);
      }
      grads.assign(ids.size() * 2, 1.0f + static_cast<float>(round));
      life.ApplyRows(ids, grads.data(), &scratch);
      ++life.version;
    }
  }

  std::array<ShardFile, 2> last_;
  int64_t last_step_ = -1;
  std::map<int64_t, Held> held_;
};

TEST_F(DeltaCheckpointTest, AChainOfDeltasReadsBackAsTheTablesWereAtEachStep) {
  SaveStep(10, /*delta=*/false);
  Train(1);
  SaveStep(20, /*delta=*/true);
  Train(2);
  Train(3);
  SaveStep(30, /*delta=*/true);
  SaveStep(40, /*delta=*/true);  // nothing changed: a delta of no rows
  int64_t evicted = 0;
  for (auto& reg : servers_) {
    evicted += (*reg.Find(TableId("life"), TableType::kSparse))->sparse->lifecycle().evicted_capacity;
  }
  EXPECT_GT(evicted, 0) << "the test must evict rows, so that deltas record deletions";
  // A filtered read of a chain (a hand-over's) keeps what the whole read has of its slots.
  CheckpointFilter filter;
  filter.slots.assign(placement::kSlots, false);
  for (int slot = 0; slot < placement::kSlots; slot += 3) filter.slots[static_cast<size_t>(slot)] = true;
  for (int64_t step : {10, 20, 30, 40}) {
    auto ckpt = ReadCheckpointAt(dir_.string(), step);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_TRUE(Read(*ckpt) == held_[step]) << "step " << step;
    auto part = ReadCheckpointAt(dir_.string(), step, &filter);
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_EQ(part->tables.size(), ckpt->tables.size());
    for (const auto& [id, t] : ckpt->tables) {
      const auto& p = part->tables.at(id);
      size_t chunks = 0, rows = 0;
      for (const auto& [c, chunk] : t.chunks) {
        if (!filter.Keeps(placement::ChunkSlot(id, c))) continue;
        ++chunks;
        ASSERT_EQ(p.chunks.count(c), 1u) << "step " << step << " chunk " << c;
        EXPECT_EQ(p.chunks.at(c).params, chunk.params);
        EXPECT_EQ(p.chunks.at(c).version, chunk.version);
      }
      for (const auto& [row_id, row] : t.rows) {
        if (!filter.Keeps(placement::IdSlot(row_id))) continue;
        ++rows;
        ASSERT_EQ(p.rows.count(row_id), 1u) << "step " << step << " id " << row_id;
        EXPECT_EQ(p.rows.at(row_id).values, row.values);
        EXPECT_EQ(p.rows.at(row_id).steps, row.steps);
      }
      EXPECT_EQ(p.chunks.size(), chunks) << "step " << step << " table " << t.spec.name;
      EXPECT_EQ(p.rows.size(), rows) << "step " << step << " table " << t.spec.name;
    }
  }
  // The deltas hold only what changed: each smaller than the full shard by far.
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(fs::file_size(Shard(20, r)) * 2, fs::file_size(Shard(10, r)));
    EXPECT_LT(fs::file_size(Shard(40, r)) * 4, fs::file_size(Shard(10, r)));
  }
  // The manifest names each delta's chain, full shard first.
  nlohmann::json m;
  std::ifstream(dir_ / "MANIFEST-00000000000000000030") >> m;
  EXPECT_EQ(m["format"], 2);
  ASSERT_EQ(m["shards"][1]["base"].size(), 2u);
  EXPECT_EQ(m["shards"][1]["base"][0]["file"], Shard(10, 1).filename().string());
  EXPECT_EQ(m["shards"][1]["base"][1]["file"], Shard(20, 1).filename().string());
  // Restored into three servers from the chain: the tables of step 40, placed anew.
  auto ckpt = ReadCheckpoint(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 40);
  std::vector<TableRegistry> three;
  for (int r = 0; r < 3; ++r) {
    three.emplace_back(r, 3);
    ASSERT_TRUE(RestoreShard(*ckpt, r, 2, &three.back()).ok());
  }
  EXPECT_TRUE(Live(three) == held_[40]);
}

// A hand-over's read ahead (protocol 1.19, Placement's `prepare`): the chains of an earlier
// checkpoint, read with the hand-over's filter, serve the read of a later delta checkpoint, which
// then reads only the files written since (the earlier ones may even be gone) and keeps what a
// read of the whole chain keeps. A chain that does not begin with what was read ahead (a full
// shard written since), or another filter, is read as without.
TEST_F(DeltaCheckpointTest, AChainReadAheadServesALaterDeltaWhichReadsOnlyItsNewFiles) {
  SaveStep(10, /*delta=*/false);
  Train(1);
  SaveStep(20, /*delta=*/true);
  CheckpointFilter filter;
  filter.slots.assign(placement::kSlots, false);
  filter.versions_only.assign(placement::kSlots, false);
  for (int slot = 0; slot < placement::kSlots; slot += 3) filter.slots[static_cast<size_t>(slot)] = true;
  for (int slot = 0; slot < placement::kSlots; slot += 6) filter.versions_only[static_cast<size_t>(slot)] = true;
  auto ahead = PrepareChains(dir_.string(), 20, filter);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  ASSERT_EQ(ahead->shards.size(), 2u);  // both servers wrote slots the filter keeps
  EXPECT_EQ(ahead->shards.at(1).files.size(), 2u);
  Train(2);
  Train(3);
  SaveStep(30, /*delta=*/true);
  auto expected = ReadCheckpointAt(dir_.string(), 30, &filter);
  ASSERT_TRUE(expected.ok()) << expected.status();
  // The files read ahead go away: a read that needed them would fail.
  const fs::path away = dir_ / "away";
  fs::create_directory(away);
  for (int64_t step : {10, 20}) {
    for (int r = 0; r < 2; ++r) fs::rename(Shard(step, r), away / Shard(step, r).filename());
  }
  ASSERT_FALSE(ReadCheckpointAt(dir_.string(), 30, &filter).ok());
  PreparedChains other = *ahead;
  other.filter.slots[1] = true;  // another hand-over's
  auto refused = ReadCheckpointAt(dir_.string(), 30, &filter, &other);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(Shard(10, 0).filename().string()), std::string::npos) << refused.status();
  auto read = ReadCheckpointAt(dir_.string(), 30, &filter, &*ahead);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(Read(*read) == Read(*expected));
  EXPECT_TRUE(ahead->shards.empty()) << "each chain read ahead serves one read";
  EXPECT_EQ(ahead->used, 2);
  for (int64_t step : {10, 20}) {
    for (int r = 0; r < 2; ++r) fs::rename(away / Shard(step, r).filename(), Shard(step, r));
  }
  // Server 1 writes a full shard at step 40: its chain read ahead does not fit and is not used;
  // server 0's does.
  ahead = PrepareChains(dir_.string(), 30, filter);
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  Train(4);
  SaveStep(40, /*delta=*/true, /*keep=*/100, /*full_rank=*/1);
  expected = ReadCheckpointAt(dir_.string(), 40, &filter);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_GT(ahead->Bytes(), 0);
  fs::rename(Shard(10, 0), away / Shard(10, 0).filename());
  read = ReadCheckpointAt(dir_.string(), 40, &filter, &*ahead);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(Read(*read) == Read(*expected));
  EXPECT_EQ(ahead->used, 1);  // server 0's chain; server 1's began anew
  // No checkpoint of that step: said as a read says it.
  auto none = PrepareChains(dir_.string(), 35, filter);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound) << none.status();
}

TEST_F(DeltaCheckpointTest, AFullShardAfterDeltasStartsANewChainAndTheOldOneGoes) {
  SaveStep(10, false, /*keep=*/1);
  Train(1);
  SaveStep(20, true, 1);
  Train(2);
  SaveStep(30, true, 1);
  // keep 1: the newest checkpoint and its chain stay, with the manifests of the chain's steps
  // (their files are all kept anyway: each is a point to fall back to).
  for (int64_t step : {10, 20, 30}) {
    EXPECT_TRUE(fs::exists(Shard(step, 0))) << step;
    EXPECT_TRUE(fs::exists(dir_ / ("MANIFEST-000000000000000000" + std::to_string(step)))) << step;
  }
  // MakeRoom before a server's next shard (keep 2) removes nothing the newest chain needs.
  EXPECT_TRUE(MakeRoom(dir_.string(), 0, 2).empty());
  Train(3);
  SaveStep(40, false, 1);
  for (int64_t step : {10, 20, 30}) {
    EXPECT_FALSE(fs::exists(Shard(step, 0))) << step;
    EXPECT_FALSE(fs::exists(dir_ / ("MANIFEST-000000000000000000" + std::to_string(step)))) << step;
  }
  auto ckpt = ReadCheckpoint(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(Read(*ckpt) == held_[40]);
  // The next delta goes over the new full shard.
  Train(4);
  SaveStep(50, true, 1);
  ckpt = ReadCheckpoint(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(Read(*ckpt) == held_[50]);
}

// A table whose rows churn through its max_rows evicts more ids between two checkpoints than
// the count of changes keeps (2 x slots + 1024): the count gives up, and the delta holds the table
// whole, marked so, which replaces the chain's rows on reading.
TEST_F(DeltaCheckpointTest, ATableWhoseRowsChurnIsHeldWholeInTheDelta) {
  SaveStep(10, false);
  Train(1);
  SaveStep(20, true);
  for (auto& reg : servers_) {
    SparseShard& life = *(*reg.Find(TableId("life"), TableType::kSparse))->sparse;
    std::vector<RowIndex> scratch;
    for (int64_t id = 100000; id < 103000; ++id) {
      const std::vector<int64_t> one = {id};
      const std::vector<float> g = {0.5f, 0.25f};
      life.ApplyRows(one, g.data(), &scratch);
    }
    EXPECT_FALSE(life.changes_complete()) << "3000 ids through 12 rows: the count must give up";
  }
  Train(2);
  SaveStep(30, true);
  const auto bytes = [&](int64_t step) {
    uint64_t n = 0;
    for (int r = 0; r < 2; ++r) n += fs::file_size(Shard(step, r));
    return n;
  };
  EXPECT_LT(bytes(30), bytes(10)) << "the other tables are still deltas";
  for (int64_t step : {20, 30}) {
    auto ckpt = ReadCheckpointAt(dir_.string(), step);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_TRUE(Read(*ckpt) == held_[step]) << "step " << step;
  }
  Train(3);  // and the count starts again after it
  SaveStep(40, true);
  auto ckpt = ReadCheckpointAt(dir_.string(), 40);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(Read(*ckpt) == held_[40]);
}

// Servers at different points of their chains (server 1 wrote a full shard at 20): keeping one
// checkpoint, each commit removes every shard file of an earlier step that no kept chain needs, so
// nothing is left behind when the chains end; a step saved again is not a delta over itself.
TEST_F(DeltaCheckpointTest, NoShardFileOutlivesTheChainsThatNeedIt) {
  SaveStep(10, false, 1);
  Train(1);
  SaveStep(20, true, 1, /*full_rank=*/1);
  Train(2);
  SaveStep(30, true, 1);
  EXPECT_TRUE(fs::exists(Shard(10, 0)));   // server 0's chain: 10, 20, 30
  EXPECT_FALSE(fs::exists(Shard(10, 1)));  // server 1's: 20, 30
  ASSERT_TRUE(ReadCheckpoint(dir_.string()).ok());
  Train(3);
  SaveStep(40, false, 1);
  Train(4);
  SaveStep(50, false, 1);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"CURRENT", "MANIFEST-00000000000000000050",
                                            Shard(50, 0).filename().string(), Shard(50, 1).filename().string()}));
  // A delta written over a file of its own name (its step saved again) is refused at commit.
  const DeltaOf self{50, last_[0]};
  auto again = WriteShard(dir_.string(), 0, 2, 50, servers_[0], &self, true);
  ASSERT_TRUE(again.ok()) << again.status();
  auto chained = WithChain(dir_.string(), *again);
  ASSERT_FALSE(chained.ok());
  EXPECT_NE(chained.status().message().find("a delta of its own name"), std::string::npos) << chained.status();
}

// Every byte of a delta flipped in turn, with the manifest updated to match (so only the file's
// own checks can catch it): never read as good; the whole chain before it is used instead.
TEST_F(DeltaCheckpointTest, EveryFlippedByteOfADeltaIsCaught) {
  SaveStep(10, false);
  Train(1);
  SaveStep(20, true);
  Train(2);
  SaveStep(30, true);
  const fs::path shard = Shard(20, 1);
  std::string bytes;
  {
    std::ifstream in(shard, std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), {});
  }
  const fs::path manifest = dir_ / "MANIFEST-00000000000000000020";
  nlohmann::json m;
  std::ifstream(manifest) >> m;
  ASSERT_LT(bytes.size(), 20000u);  // keeps the loop short
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x41);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bad;
    nlohmann::json mm = m;
    mm["shards"][1]["crc32"] = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(bad.data()), bad.size()));
    std::ofstream(manifest, std::ios::trunc) << mm.dump();
    auto at20 = ReadCheckpointAt(dir_.string(), 20);
    ASSERT_FALSE(at20.ok()) << "byte " << i << " flipped, yet the delta of step 20 was read as good";
    EXPECT_NE(at20.status().message().find(shard.string()), std::string::npos) << "byte " << i << ": "
                                                                              << at20.status();
  }
  std::ofstream(manifest, std::ios::trunc) << m.dump();
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << std::string(bytes).replace(100, 1, "?");
  // Step 30 needs step 20's delta (its CRC in 30's manifest no longer matches): the newest
  // whole chain is step 10's.
  std::vector<std::string> skipped;
  auto ckpt = ReadCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 10);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find(shard.string()), std::string::npos) << skipped[0];
  EXPECT_NE(skipped[1].find(shard.string()), std::string::npos) << skipped[1];
}

TEST_F(DeltaCheckpointTest, AChainWithAMissingMiddleDeltaRestoresTheNewestWholePrefix) {
  SaveStep(10, false);
  Train(1);
  SaveStep(20, true);
  Train(2);
  SaveStep(30, true);
  Train(3);
  SaveStep(40, true);
  fs::remove(Shard(30, 0));
  std::vector<std::string> skipped;
  auto ckpt = ReadCheckpoint(dir_.string(), &skipped);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->step, 20);
  EXPECT_TRUE(Read(*ckpt) == held_[20]);
  ASSERT_EQ(skipped.size(), 2u);  // steps 40 and 30, each naming the missing file
  for (const auto& why : skipped) {
    EXPECT_NE(why.find(Shard(30, 0).string() + ": cannot open"), std::string::npos) << why;
  }
}

TEST_F(DeltaCheckpointTest, ADeltaOverAShardNoCheckpointListsIsRefusedAtCommit) {
  SaveStep(10, false);
  Train(1);
  // Server 0 wrote its shard of step 20, but step 20 was never committed (another server failed).
  const DeltaOf of{10, last_[0]};
  auto orphan = WriteShard(dir_.string(), 0, 2, 20, servers_[0], &of, true);
  ASSERT_TRUE(orphan.ok()) << orphan.status();
  const DeltaOf over_orphan{20, *orphan};
  auto f = WriteShard(dir_.string(), 0, 2, 30, servers_[0], &over_orphan, true);
  ASSERT_TRUE(f.ok()) << f.status();
  auto chained = WithChain(dir_.string(), *f);
  ASSERT_FALSE(chained.ok());
  EXPECT_EQ(chained.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(chained.status().message().find("checkpoint of step 20 cannot be read"), std::string::npos)
      << chained.status();
  // A delta whose chain in the manifest is not the one its file names is refused on reading.
  std::ofstream(dir_ / "MANIFEST-00000000000000000030")
      << nlohmann::json{{"format", 2}, {"step", 30}, {"meaning", "sync"},
                        {"shards", {{{"file", f->name}, {"bytes", f->bytes}, {"crc32", f->crc32},
                                     {"base", {{{"file", last_[0].name}, {"bytes", last_[0].bytes},
                                                {"crc32", last_[0].crc32}}}}}}}}
             .dump();
  auto read = ReadCheckpointAt(dir_.string(), 30);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("a delta of " + orphan->name), std::string::npos) << read.status();
}

}  // namespace
}  // namespace ferry::ps
