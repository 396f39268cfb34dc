// ferry-ckpt against a checkpoint written by the server's code: `list` names every table, and
// `dump` writes .npy files that numpy (Debian's /usr/bin/python3) loads with the right dtype,
// shape and bits.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "internal/checkpoint.h"
#include "internal/disk_tier.h"
#include "internal/table_registry.h"
#include "support/temp_dir.h"

namespace ferry::ps {
namespace {

namespace fs = std::filesystem;

// Runs `cmd`; returns its exit status and stdout+stderr.
std::pair<int, std::string> Shell(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

template <typename T>
std::vector<T> ReadRaw(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// The tables these tests save: dense "w", 4 x 5 in chunks of 6 ([0, 6) [6, 12) [12, 18) [18, 20)),
// and sparse "emb" of `dim`.
TableSpec WSpec(OptimizerType optimizer, const std::string& name = "w") {
  TableSpec w;
  w.name = name;  // not a literal: GCC 12 warns falsely (-Wrestrict) on assigning one at -O3
  w.shape = {4, 5};
  w.chunk_elems = 6;
  w.optimizer.type = optimizer;
  return w;
}
TableSpec EmbSpec(int64_t dim, OptimizerType optimizer, const std::string& name = "emb") {
  TableSpec emb;
  emb.name = name;
  emb.type = TableType::kSparse;
  emb.dim = dim;
  emb.optimizer.type = optimizer;
  return emb;
}

TEST(CkptTool, ListsTablesAndDumpsThemForNumpy) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Debian's python3 with python3-numpy is needed to read the .npy files back";
  }
  test::TempDir tmp("ckpt-tool");
  const fs::path dir = tmp.path();
  fs::remove_all(dir);  // the checkpoint writer makes it
  TableRegistry tables(0, 1);
  const TableSpec w = WSpec(OptimizerType::kSgd);
  const TableSpec emb = EmbSpec(3, OptimizerType::kAdagrad);  // rows carry state too; only the values are dumped
  ASSERT_TRUE(tables.Create(w, TableId("w"), 1).ok());
  ASSERT_TRUE(tables.Create(emb, TableId("emb"), 1).ok());
  std::vector<float> want_w;
  Table* wt = *tables.Find(TableId("w"), TableType::kDense);
  for (int64_t i = 0; i < wt->dense->num_chunks(); ++i) {
    for (float& v : wt->dense->chunk(i)->params) {
      v = static_cast<float>(want_w.size()) / 7.0f - 1.0f;
      want_w.push_back(v);
    }
  }
  SparseShard& s = *(*tables.Find(TableId("emb"), TableType::kSparse))->sparse;
  const std::vector<int64_t> want_ids = {-9, 4, 1000000007};
  std::vector<float> want_rows;
  for (int64_t id : {int64_t{1000000007}, int64_t{-9}, int64_t{4}}) {  // created out of order
    const RowIndex r = s.FindOrCreate(id);
    for (int64_t k = 0; k < s.row_floats(); ++k)
      s.row(r)[k] = static_cast<float>(id % 1000) + 0.5f * static_cast<float>(k);
    s.steps(r) = 1;  // updated once (a row never updated is not saved)
  }
  for (int64_t id : want_ids) {
    for (int k = 0; k < 3; ++k) want_rows.push_back(static_cast<float>(id % 1000) + 0.5f * static_cast<float>(k));
  }
  auto shard = WriteShard(dir.string(), 0, 1, 42, tables);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE(WriteManifest(dir.string(), 42, {*shard}, "sync: every server at step 42", 2).ok());

  const std::string tool = FERRY_CKPT_PATH;
  auto [rc, out] = Shell(tool + " list " + dir.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step 42, 1 server(s), sync: every server at step 42"), std::string::npos) << out;
  EXPECT_NE(out.find("w                        dense  4x5 (4 chunks)"), std::string::npos) << out;
  EXPECT_NE(out.find("emb                      sparse 3 rows of dim 3"), std::string::npos) << out;

  std::tie(rc, out) = Shell(tool + " dump " + dir.string() + " w " + (dir / "w").string());
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = Shell(tool + " dump " + dir.string() + " emb " + (dir / "emb").string());
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = Shell(tool + " dump " + dir.string() + " nope " + (dir / "x").string());
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("no table 'nope'"), std::string::npos) << out;

  // numpy reads them; it writes the raw values back for a bitwise comparison here.
  const std::string py =
      "import numpy as np, sys; d = sys.argv[1]\n"
      "w = np.load(d + '/w.npy'); ids = np.load(d + '/emb.ids.npy'); rows = np.load(d + '/emb.rows.npy')\n"
      "assert (w.dtype, w.shape) == (np.float32, (4, 5)), (w.dtype, w.shape)\n"
      "assert (ids.dtype, ids.shape) == (np.int64, (3,)), (ids.dtype, ids.shape)\n"
      "assert (rows.dtype, rows.shape) == (np.float32, (3, 3)), (rows.dtype, rows.shape)\n"
      "w.tofile(d + '/w.raw'); ids.tofile(d + '/ids.raw'); rows.tofile(d + '/rows.raw')\n";
  {
    std::ofstream(dir / "check.py") << py;
  }
  std::tie(rc, out) = Shell("/usr/bin/python3 " + (dir / "check.py").string() + " " + dir.string());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(ReadRaw<float>(dir / "w.raw"), want_w);
  EXPECT_EQ(ReadRaw<int64_t>(dir / "ids.raw"), want_ids);
  EXPECT_EQ(ReadRaw<float>(dir / "rows.raw"), want_rows);

  // A corrupt checkpoint: refused, with the file named.
  fs::remove(dir / "CURRENT");
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().starts_with("MANIFEST-")) fs::remove(e.path());
  }
  std::tie(rc, out) = Shell(tool + " list " + dir.string());
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("no usable checkpoint in " + dir.string()), std::string::npos) << out;
}

// A table with a disk tier: list and dump take the rows of both tiers (the RAM tier's in the
// shard, the rest from the checkpoint's copy of the store).
TEST(CkptTool, DumpsBothTiersOfATableWithADiskTier) {
  test::TempDir tmp("ckpt-tool");
  const fs::path dir = tmp.path() / "ckpt";
  std::unique_ptr<DiskTier> store;
  ASSERT_TRUE(DiskTier::Open({.path = (tmp.path() / "store").string()}, &store).ok());
  TableRegistry tables(0, 1);
  tables.SetDiskTier(store.get());
  TableSpec emb = EmbSpec(2, OptimizerType::kSgd);
  emb.max_rows = 5;
  emb.disk_tier = true;
  ASSERT_TRUE(tables.Create(emb, TableId("emb"), 1).ok());
  SparseShard& s = *(*tables.Find(TableId("emb"), TableType::kSparse))->sparse;
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 40; ++id) ids.push_back(id);
  std::vector<float> grads(ids.size() * 2);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = static_cast<float>(i);
  std::vector<RowIndex> scratch;
  // 4 at a time through a RAM tier of 5: 5 rows in it, the last 4 on probation beside it (pushed
  // no more often than its rows, until the next call demotes them), 31 on disk.
  for (size_t k = 0; k < ids.size(); k += 4) {
    s.ApplyRows(std::span(ids).subspan(k, 4), grads.data() + k * 2, &scratch);
  }
  ASSERT_EQ(9u, s.size());
  auto shard = WriteShard(dir.string(), 0, 1, 7, tables);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE(WriteManifest(dir.string(), 7, {*shard}, "sync: every server at step 7", 2).ok());

  const std::string tool = FERRY_CKPT_PATH;
  auto [rc, out] = Shell(tool + " list " + dir.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("emb                      sparse 40 rows of dim 2 (31 of them on disk)"), std::string::npos)
      << out;
  std::tie(rc, out) = Shell(tool + " dump " + dir.string() + " emb " + (tmp.path() / "emb").string());
  ASSERT_EQ(rc, 0) << out;
  // The .npy files end with the raw arrays: ids ascending, and the rows as the shard and the store
  // hold them (each row in one of the two).
  const auto npy_ids = ReadRaw<int64_t>(tmp.path() / "emb.ids.npy");
  ASSERT_GE(npy_ids.size(), 40u);
  EXPECT_EQ(ids, std::vector<int64_t>(npy_ids.end() - 40, npy_ids.end()));
  const auto npy_rows = ReadRaw<float>(tmp.path() / "emb.rows.npy");
  ASSERT_GE(npy_rows.size(), 80u);
  std::vector<float> want;
  for (int64_t id : ids) {
    std::vector<float> row(2);
    std::vector<int64_t> steps(1);
    std::vector<bool> found;
    if (const RowIndex r = s.Find(id); r != kNoRow) {
      row.assign(s.row(r), s.row(r) + 2);
    } else {
      ASSERT_TRUE(store->Read(TableId("emb"), {&id, 1}, row.data(), steps.data(), &found).ok());
      ASSERT_TRUE(found[0]) << id;
    }
    want.insert(want.end(), row.begin(), row.end());
  }
  EXPECT_EQ(want, std::vector<float>(npy_rows.end() - 80, npy_rows.end()));
}

// --step picks any checkpoint kept; --state dumps the optimizer's state beside the parameters.
TEST(CkptTool, PicksAnyCheckpointKeptAndDumpsOptimizerState) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Debian's python3 with python3-numpy is needed to read the .npy files back";
  }
  test::TempDir tmp("ckpt-tool-state");
  const fs::path dir = tmp.path();
  fs::remove_all(dir);
  TableRegistry tables(0, 1);
  const TableSpec w = WSpec(OptimizerType::kAdam);          // 2 slots
  const TableSpec emb = EmbSpec(3, OptimizerType::kAdagrad);  // 1 slot
  ASSERT_TRUE(tables.Create(w, TableId("w"), 1).ok());
  ASSERT_TRUE(tables.Create(emb, TableId("emb"), 1).ok());
  Table* wt = *tables.Find(TableId("w"), TableType::kDense);
  SparseShard& s = *(*tables.Find(TableId("emb"), TableType::kSparse))->sparse;
  // Every value names itself: parameter i of step t is t + i / 100, slot k's 1000 (k + 1) more.
  auto fill = [&](int64_t step) {
    int64_t i = 0;
    for (int64_t c = 0; c < wt->dense->num_chunks(); ++c) {
      DenseChunk& chunk = *wt->dense->chunk(c);
      const size_t n = chunk.params.size();
      for (size_t j = 0; j < n; ++j, ++i) {
        chunk.params[j] = static_cast<float>(step) + static_cast<float>(i) / 100.0f;
        for (size_t k = 0; k < 2; ++k) chunk.state[k * n + j] = chunk.params[j] + 1000.0f * static_cast<float>(k + 1);
      }
    }
    for (int64_t id : {int64_t{7}, int64_t{-2}}) {
      const RowIndex r = s.FindOrCreate(id);
      for (int64_t k = 0; k < s.row_floats(); ++k)
        s.row(r)[k] = static_cast<float>(step * 10 + id) + static_cast<float>(k);
      s.steps(r) = 1;
    }
  };
  for (int64_t step : {42, 50}) {
    fill(step);
    auto shard = WriteShard(dir.string(), 0, 1, step, tables);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE(
        WriteManifest(dir.string(), step, {*shard}, "sync: every server at step " + std::to_string(step), 3).ok());
  }

  const std::string tool = FERRY_CKPT_PATH;
  auto [rc, out] = Shell(tool + " list " + dir.string());
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("kept: step(s) 42, 50; CURRENT names step 50"), std::string::npos) << out;
  EXPECT_NE(out.find("step 50, 1 server(s)"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " list " + dir.string() + " --step 42");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("step 42, 1 server(s)"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " list " + dir.string() + " --step 7");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("no checkpoint of step 7 in " + dir.string() + " (it keeps steps 42, 50)"), std::string::npos)
      << out;
  std::tie(rc, out) = Shell(tool + " list " + dir.string() + " --step x");
  EXPECT_EQ(rc, 2) << out;

  std::tie(rc, out) = Shell(tool + " dump " + dir.string() + " w " + (dir / "w").string() + " --step 42 --state");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("optimizer state (adam): 2 slot(s): m (first moment), v (second moment)"), std::string::npos)
      << out;
  std::tie(rc, out) = Shell(tool + " dump --state " + dir.string() + " emb " + (dir / "emb").string());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("optimizer state (adagrad): 1 slot(s): accumulator"), std::string::npos) << out;

  const std::string py =
      "import numpy as np, sys; d = sys.argv[1]\n"
      "w = np.load(d + '/w.npy'); ws = np.load(d + '/w.state.npy')\n"
      "want = 42 + np.arange(20, dtype=np.float32).reshape(4, 5) / np.float32(100)\n"
      "assert ws.shape == (2, 4, 5) and ws.dtype == np.float32, ws.shape\n"
      "assert (w == want).all(), w\n"
      "assert (ws[0] == want + 1000).all() and (ws[1] == want + 2000).all(), ws\n"
      "ids = np.load(d + '/emb.ids.npy'); rows = np.load(d + '/emb.rows.npy'); st = np.load(d + '/emb.state.npy')\n"
      "assert list(ids) == [-2, 7], ids\n"
      "assert st.shape == (1, 2, 3), st.shape\n"
      "for i, id in enumerate(ids):\n"
      "    base = 500 + id\n"
      "    assert list(rows[i]) == [base, base + 1, base + 2], rows[i]\n"
      "    assert list(st[0, i]) == [base + 3, base + 4, base + 5], st[0, i]\n";
  {
    std::ofstream(dir / "check_state.py") << py;
  }
  std::tie(rc, out) = Shell("/usr/bin/python3 " + (dir / "check_state.py").string() + " " + dir.string());
  EXPECT_EQ(rc, 0) << out;
}

// export --since S: what changed after the checkpoint of S, bit for bit; applied to S's dump it
// gives the newer checkpoint's table (a serving copy kept in sync).
TEST(CkptTool, ExportsWhatChangedSinceAnEarlierCheckpoint) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Debian's python3 with python3-numpy is needed to read the .npy files back";
  }
  test::TempDir tmp("ckpt-tool-export");
  const fs::path dir = tmp.path();
  fs::remove_all(dir);
  TableRegistry tables(0, 1);
  const TableSpec w = WSpec(OptimizerType::kAdagrad);
  const TableSpec emb = EmbSpec(2, OptimizerType::kAdagrad);  // a row: 2 values, 2 accumulators
  ASSERT_TRUE(tables.Create(w, TableId("w"), 1).ok());
  ASSERT_TRUE(tables.Create(emb, TableId("emb"), 1).ok());
  Table* wt = *tables.Find(TableId("w"), TableType::kDense);
  SparseShard& s = *(*tables.Find(TableId("emb"), TableType::kSparse))->sparse;
  auto set_row = [&](int64_t id, float v, float acc) {
    const RowIndex r = s.FindOrCreate(id);
    s.row(r)[0] = v;
    s.row(r)[1] = v + 0.5f;
    s.row(r)[2] = acc;
    s.row(r)[3] = acc;
    s.steps(r) += 1;
  };
  for (int64_t i = 0; i < wt->dense->num_chunks(); ++i) {
    for (float& v : wt->dense->chunk(i)->params) v = static_cast<float>(i);
  }
  for (int64_t id = 0; id < 6; ++id) set_row(id, static_cast<float>(id), 1.0f);
  auto save = [&](int64_t step) {
    auto shard = WriteShard(dir.string(), 0, 1, step, tables);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE(WriteManifest(dir.string(), step, {*shard}, "sync", 3).ok());
  };
  ASSERT_NO_FATAL_FAILURE(save(10));
  // After step 10: chunk 1's values and chunk 3's optimizer state change; rows 2 and 4 change,
  // row 5 only in its accumulator, row 9 is new, row 0 is gone.
  for (float& v : wt->dense->chunk(1)->params) v = -1.0f;
  wt->dense->chunk(3)->state[0] = 7.0f;
  set_row(2, 20.0f, 1.0f);
  set_row(4, -0.0f, 1.0f);  // 0.0 became -0.0: other bits, a change
  set_row(5, 5.0f, 2.0f);
  set_row(9, 90.0f, 1.0f);
  s.steps(s.FindOrCreate(0)) = 0;  // row 0 as a checkpoint sees it evicted: not saved (nor is a row never updated)
  ASSERT_NO_FATAL_FAILURE(save(20));

  const std::string tool = FERRY_CKPT_PATH, d = dir.string();
  auto [rc, out] = Shell(tool + " export " + d + " emb " + d + "/emb --since 10");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("table 'emb': what changed after step 10"), std::string::npos) << out;
  EXPECT_NE(out.find("3 of 6 row(s) new or changed, 1 deleted"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " emb " + d + "/emb_state --since 10 --state");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("4 of 6 row(s) new or changed, 1 deleted"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " w " + d + "/w --since 10");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("1 of 4 chunk(s) changed: 6 of 20 values"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " w " + d + "/w_state --since 10 --state");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("2 of 4 chunk(s) changed: 8 of 20 values"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " w " + d + "/none --since 20");  // nothing after 20
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("0 of 4 chunk(s) changed"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " dump " + d + " emb " + d + "/emb10 --step 10");
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = Shell(tool + " dump " + d + " emb " + d + "/emb20");
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = Shell(tool + " dump " + d + " w " + d + "/w10 --step 10");
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = Shell(tool + " dump " + d + " w " + d + "/w20");
  ASSERT_EQ(rc, 0) << out;

  // A serving copy made from step 10's dump, with the export applied, is step 20's table.
  const std::string py =
      "import numpy as np, sys; d = sys.argv[1]\n"
      "ids = np.load(d + '/emb.ids.npy'); rows = np.load(d + '/emb.rows.npy')\n"
      "assert ids.dtype == np.int64 and rows.dtype == np.float32 and rows.shape == (3, 2), rows.shape\n"
      "assert list(ids) == [2, 4, 9], ids\n"
      "assert list(np.load(d + '/emb.deleted.npy')) == [0]\n"
      "assert list(np.load(d + '/emb_state.ids.npy')) == [2, 4, 5, 9]\n"
      "assert np.load(d + '/emb_state.state.npy').shape == (1, 4, 2)\n"
      "copy = dict(zip(np.load(d + '/emb10.ids.npy').tolist(), np.load(d + '/emb10.rows.npy')))\n"
      "for i, r in zip(ids.tolist(), rows): copy[i] = r\n"
      "for i in np.load(d + '/emb.deleted.npy').tolist(): del copy[i]\n"
      "want = dict(zip(np.load(d + '/emb20.ids.npy').tolist(), np.load(d + '/emb20.rows.npy')))\n"
      "assert sorted(copy) == sorted(want), (sorted(copy), sorted(want))\n"
      "assert all(copy[i].tobytes() == want[i].tobytes() for i in want)\n"
      "ranges = np.load(d + '/w.ranges.npy'); values = np.load(d + '/w.values.npy')\n"
      "assert ranges.dtype == np.int64 and ranges.tolist() == [[6, 12]], ranges\n"
      "w = np.load(d + '/w10.npy').reshape(-1).copy(); at = 0\n"
      "for b, e in ranges: w[b:e] = values[at:at + e - b]; at += e - b\n"
      "assert w.tobytes() == np.load(d + '/w20.npy').tobytes()\n"
      "assert np.load(d + '/w_state.ranges.npy').tolist() == [[6, 12], [18, 20]]\n"
      "st = np.load(d + '/w_state.state.npy'); assert st.shape == (1, 8) and st[0, 6] == 7, st\n"
      "assert np.load(d + '/none.ranges.npy').shape == (0, 2)\n";
  {
    std::ofstream(dir / "check_export.py") << py;
  }
  std::tie(rc, out) = Shell("/usr/bin/python3 " + (dir / "check_export.py").string() + " " + d);
  EXPECT_EQ(rc, 0) << out;

  // Step 30 saved with other chunks (as a job restored with another chunk size saves): the same
  // values as step 20 but element 13, compared element by element.
  {
    TableRegistry rechunked(0, 1);
    TableSpec w8 = w;
    w8.chunk_elems = 8;  // chunks [0, 8) [8, 16) [16, 20)
    ASSERT_TRUE(rechunked.Create(w8, TableId("w"), 1).ok());
    Table* t8 = *rechunked.Find(TableId("w"), TableType::kDense);
    std::vector<float> flat, flat_state;
    for (int64_t i = 0; i < wt->dense->num_chunks(); ++i) {
      const DenseChunk& c = *wt->dense->chunk(i);
      flat.insert(flat.end(), c.params.begin(), c.params.end());
      flat_state.insert(flat_state.end(), c.state.begin(), c.state.end());  // adagrad: one slot
    }
    flat[13] = 1.25f;
    for (int64_t i = 0, at = 0; i < t8->dense->num_chunks(); ++i) {
      DenseChunk& c = *t8->dense->chunk(i);
      std::copy_n(flat.begin() + at, c.params.size(), c.params.begin());
      std::copy_n(flat_state.begin() + at, c.state.size(), c.state.begin());
      at += static_cast<int64_t>(c.params.size());
    }
    auto shard = WriteShard(d, 0, 1, 30, rechunked);
    ASSERT_TRUE(shard.ok()) << shard.status();
    ASSERT_TRUE(WriteManifest(d, 30, {*shard}, "sync", 3).ok());
  }
  std::tie(rc, out) = Shell(tool + " export " + d + " w " + d + "/w30 --since 20 --state");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("1 of 3 chunk(s) changed: 8 of 20 values"), std::string::npos) << out;

  // Bad requests: a step not kept, a step after the checkpoint, export without --since.
  std::tie(rc, out) = Shell(tool + " export " + d + " emb " + d + "/x --since 15");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--since 15: no checkpoint of step 15 in " + d + " (it keeps steps 10, 20, 30)"),
            std::string::npos)
      << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " emb " + d + "/x --since 10 --step 10");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("0 of 6 row(s) new or changed, 0 deleted"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " emb " + d + "/x --since 40");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--since 40 is after the checkpoint exported (step 30)"), std::string::npos) << out;
  std::tie(rc, out) = Shell(tool + " export " + d + " emb " + d + "/x");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("usage"), std::string::npos) << out;
}

}  // namespace
}  // namespace ferry::ps
