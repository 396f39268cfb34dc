// ferry-ckpt against a checkpoint written by the server's code: `list` names every table, and
// `dump` writes .npy files that numpy (Debian's /usr/bin/python3) loads with the right dtype,
// shape and bits.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "internal/checkpoint.h"
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

TEST(CkptTool, ListsTablesAndDumpsThemForNumpy) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Debian's python3 with python3-numpy is needed to read the .npy files back";
  }
  test::TempDir tmp("ckpt-tool");
  const fs::path dir = tmp.path();
  fs::remove_all(dir);  // the checkpoint writer makes it
  TableRegistry tables(0, 1);
  TableSpec w;
  w.name = "w";
  w.shape = {4, 5};
  w.chunk_elems = 6;
  TableSpec emb;
  emb.name = "emb";
  emb.type = TableType::kSparse;
  emb.dim = 3;
  emb.optimizer.type = OptimizerType::kAdagrad;  // rows carry state too; only the values are dumped
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

// --step picks any checkpoint kept; --state dumps the optimizer's state beside the parameters.
TEST(CkptTool, PicksAnyCheckpointKeptAndDumpsOptimizerState) {
  if (std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "Debian's python3 with python3-numpy is needed to read the .npy files back";
  }
  test::TempDir tmp("ckpt-tool-state");
  const fs::path dir = tmp.path();
  fs::remove_all(dir);
  TableRegistry tables(0, 1);
  TableSpec w;
  w.name = "w";
  w.shape = {4, 5};
  w.chunk_elems = 6;
  w.optimizer.type = OptimizerType::kAdam;  // 2 slots
  TableSpec emb;
  emb.name = "emb";
  emb.type = TableType::kSparse;
  emb.dim = 3;
  emb.optimizer.type = OptimizerType::kAdagrad;  // 1 slot
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

}  // namespace
}  // namespace ferry::ps
