// A server's disk tier (ServerOptions::disk_tier_dir) against a damaged disk: a byte of the store's
// table file changed under a running server makes the pulls that need the rows there fail with
// DATA_LOSS naming the table and the file, never serve a wrong row, while rows elsewhere go on
// being served; and a checkpoint whose copy of the store is damaged is passed over at restore for
// the older one that verifies.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "support/cluster.h"
#include "support/temp_dir.h"

namespace ferry::test {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDim = 4;

TableSpec Emb() {
  TableSpec t = SgdSparseTable("emb", kDim, Consistency::kAsync);  // SGD at lr 1 from zeros
  t.max_rows = 10;
  t.disk_tier = true;
  return t;
}

// The table files (.sst) of a store or a copy of one, by name.
std::vector<fs::path> TableFiles(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".sst") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Changes the byte at `at` of `file` in place (the file's inode: a running store reads it).
void FlipByte(const fs::path& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << file;
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(at);
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << file;
}

// Pushes ids [from, to) once each with gradient 1 (each row then holds -1s).
void PushOnce(Client& w, int64_t from, int64_t to) {
  std::vector<float> grad(kDim, 1.0f);
  for (int64_t id = from; id < to; ++id) ASSERT_TRUE(w.PushSparse("emb", {&id, 1}, grad, 0).wait().ok()) << id;
}

TEST(DiskTierServer, ADamagedStoreFileFailsThePullsThatNeedItNamingTableAndFileAndServesNothingWrong) {
  TempDir dir("disk-tier-server");
  ServerOptions so;
  so.disk_tier_dir = (dir.path() / "tier").string();
  so.disk_tier_cache_bytes = 0;  // every read of a row on disk goes to the file
  so.checkpoint_dir = (dir.path() / "ckpt").string();
  auto c = LocalCluster::Start(1, /*tcp=*/false, so);
  ASSERT_EQ(1u, c.servers.size());
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(Emb()).ok());
  // Rows 0-9 fill the RAM tier; each later row, pushed no more often than them, goes on probation
  // and is demoted to the store by the next push: 10-198 on disk.
  PushOnce(*w, 0, 200);
  ASSERT_TRUE(w->Checkpoint(1).ok());  // (which writes them into a table file)
  const std::vector<fs::path> files = TableFiles(dir.path() / "tier" / "server-0");
  ASSERT_EQ(1u, files.size());
  FlipByte(files[0], 100);  // inside the first data block: the smallest ids

  std::vector<int64_t> cold = {10, 11, 12, 13};
  std::vector<float> rows(cold.size() * kDim, 7.0f);
  Status s = w->PullSparse("emb", cold, rows, 0).wait();
  EXPECT_EQ(StatusCode::kDataLoss, s.code()) << s;
  EXPECT_NE(std::string::npos, s.message().find("table 'emb'")) << s;
  EXPECT_NE(std::string::npos, s.message().find(files[0].filename().string())) << s;
  for (float v : rows) EXPECT_EQ(7.0f, v) << "a failed pull wrote values";
  // A push that needs those rows fails the same way and changes nothing.
  std::vector<float> grad(cold.size() * kDim, 1.0f);
  s = w->PushSparse("emb", cold, grad, 0).wait();
  EXPECT_EQ(StatusCode::kDataLoss, s.code()) << s;
  // The rows in RAM are served as before.
  std::vector<int64_t> hot = {0, 1, 2, 3, 4};
  std::vector<float> hot_rows(hot.size() * kDim);
  ASSERT_TRUE(w->PullSparse("emb", hot, hot_rows, 0).wait().ok());
  for (float v : hot_rows) EXPECT_EQ(-1.0f, v);
  EXPECT_GE(c.servers[0]->stats().counters.at("disk_tier_errors"), 2);
}

// The I/O thread never waits for the disk: on a disk whose every read takes 3 s, a pull of rows on
// disk waits for them while the server answers another worker's pulls (a plain table's, and rows
// of the same table in RAM) at once; and a connection's requests keep their order: a pull sent
// after a push that waits for the disk sees that push. No row is looked up on the I/O thread.
TEST(DiskTierServer, ARequestWaitingForTheDiskHoldsUpNeitherOtherWorkersNorItsOwnConnectionsOrder) {
  TempDir dir("disk-tier-server");
  ServerOptions so;
  so.disk_tier_dir = (dir.path() / "tier").string();
  so.disk_tier_read_delay = std::chrono::milliseconds(3000);  // (new ids: the cache's filters say absent)
  so.checkpoint_dir = (dir.path() / "ckpt").string();
  auto c = LocalCluster::Start(1, /*tcp=*/false, so);
  ASSERT_EQ(1u, c.servers.size());
  auto w0 = c.Connect(0, 2), w1 = c.Connect(1, 2);
  ASSERT_TRUE(w0->Declare(Emb()).ok());
  ASSERT_TRUE(w1->Declare(Emb()).ok());
  TableSpec plain = SgdSparseTable("plain", kDim, Consistency::kAsync);
  ASSERT_TRUE(w0->Declare(plain).ok());
  ASSERT_TRUE(w1->Declare(plain).ok());
  TableSpec emb2 = Emb();
  emb2.name = "emb2";
  ASSERT_TRUE(w0->Declare(emb2).ok());
  ASSERT_TRUE(w1->Declare(emb2).ok());
  PushOnce(*w0, 0, 200);  // 10-198 on disk, as above
  for (int64_t id = 0; id < 200; ++id) {
    std::vector<float> grad(kDim, 1.0f);
    ASSERT_TRUE(w0->PushSparse("emb2", {&id, 1}, grad, 0).wait().ok()) << id;
  }
  ASSERT_TRUE(w0->Checkpoint(1).ok());  // (in table files, not in the cache: read from disk from now on)
  auto stat = [&](const char* name) { return c.servers[0]->stats().counters.at(name); };
  const int64_t held_before = stat("disk_tier_requests_held");
  auto wait_held = [&](int64_t n) {  // until the server holds `n` more requests for the disk (10 s at most)
    for (int k = 0; k < 1000 && stat("disk_tier_requests_held") < held_before + n; ++k) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return stat("disk_tier_requests_held") >= held_before + n;
  };

  std::vector<int64_t> cold = {10, 11, 12, 13};
  std::vector<float> rows(cold.size() * kDim, 7.0f);
  Handle slow = w0->PullSparse("emb", cold, rows, 0);
  ASSERT_TRUE(wait_held(1)) << "the pull of rows on disk was not held for the disk readers";
  std::vector<int64_t> hot = {0, 1, 2, 3};
  std::vector<float> hot_rows(hot.size() * kDim), plain_rows(hot.size() * kDim);
  ASSERT_TRUE(w1->PullSparse("plain", hot, plain_rows, 0).wait().ok());
  ASSERT_TRUE(w1->PullSparse("emb", hot, hot_rows, 0).wait().ok());
  EXPECT_EQ(1, stat("disk_tier_requests_waiting")) << "the other worker's pulls waited for the disk";
  for (float v : hot_rows) EXPECT_EQ(-1.0f, v);
  ASSERT_TRUE(slow.wait().ok());
  for (float v : rows) EXPECT_EQ(-1.0f, v);

  // One connection: a push naming a row on disk (20) and one in RAM (0), then at once a pull of
  // the row in RAM: the pull is answered after the push, with its update (-1 - 1). (emb2: its
  // files' blocks are not in the cache, as emb's read above may be.)
  std::vector<int64_t> both = {20, 0};
  std::vector<float> grad(both.size() * kDim, 1.0f);
  Handle push = w0->PushSparse("emb2", both, grad, 0);
  std::vector<int64_t> zero = {0};
  std::vector<float> zero_row(kDim);
  Handle pull = w0->PullSparse("emb2", zero, zero_row, 0);
  ASSERT_TRUE(push.wait().ok());
  ASSERT_TRUE(pull.wait().ok());
  for (float v : zero_row) EXPECT_EQ(-2.0f, v) << "the pull overtook the push before it";
  EXPECT_GE(stat("disk_tier_requests_held"), held_before + 3);  // the push, and the pull behind it
  EXPECT_EQ(0, stat("disk_tier_rows_read_inline"));
  EXPECT_GE(stat("disk_tier_rows_read_ahead"), 5);
  EXPECT_EQ(0, stat("disk_tier_requests_waiting"));
}

TEST(DiskTierServer, ARestoreUsesTheOlderCheckpointWhenTheNewerCopyOfTheStoreIsDamaged) {
  TempDir dir("disk-tier-server");
  ServerOptions so;
  so.disk_tier_dir = (dir.path() / "tier").string();
  so.checkpoint_dir = (dir.path() / "ckpt").string();
  so.num_workers = 1;
  {
    auto c = LocalCluster::Start(1, /*tcp=*/false, so);
    auto w = c.Connect(0, 1);
    ASSERT_TRUE(w->Declare(Emb()).ok());
    PushOnce(*w, 0, 100);
    ASSERT_TRUE(w->Checkpoint(1).ok());
    PushOnce(*w, 0, 100);  // every row -2
    ASSERT_TRUE(w->Checkpoint(2).ok());
  }
  // The two copies share (link) the table files the store had at both checkpoints: damage one
  // that only the newer copy has.
  auto copy_of = [&](const std::string& shard) {
    for (const auto& e : fs::directory_iterator(dir.path() / "ckpt")) {
      if (e.path().filename().string().starts_with(shard + ".disk.")) return e.path();
    }
    ADD_FAILURE() << "no copy of the store beside " << shard;
    return fs::path();
  };
  const fs::path newer = copy_of("step-00000000000000000002-shard-00000-of-00001.ckpt"),
                 older = copy_of("step-00000000000000000001-shard-00000-of-00001.ckpt");
  std::vector<fs::path> only_newer;
  for (const fs::path& f : TableFiles(newer)) {
    if (!fs::exists(older / f.filename())) only_newer.push_back(f);
  }
  ASSERT_FALSE(only_newer.empty());
  FlipByte(only_newer.back(), 100);

  so.restore = true;
  auto c = LocalCluster::Start(1, /*tcp=*/false, so);
  ASSERT_EQ(1u, c.servers.size());
  EXPECT_EQ(1, c.servers[0]->restored_step());
  auto w = c.Connect(0, 1);
  ASSERT_TRUE(w->Declare(Emb()).ok());
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < 100; ++id) ids.push_back(id);
  std::vector<float> rows(ids.size() * kDim);
  ASSERT_TRUE(w->PullSparse("emb", ids, rows, 0).wait().ok());
  for (float v : rows) EXPECT_EQ(-1.0f, v) << "not the rows of step 1";
}

TEST(DiskTierServer, ACheckpointFolderInsideTheStoreFolderIsRefusedAtStart) {
  TempDir dir("disk-tier-server");
  ServerOptions so;
  so.bind = "tcp://127.0.0.1:0";
  so.disk_tier_dir = (dir.path() / "tier").string();
  so.checkpoint_dir = (dir.path() / "tier" / "ckpt").string();  // emptied with the store at every start
  auto server = Server::Start(so);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(StatusCode::kInvalidArgument, server.status().code());
  EXPECT_NE(std::string::npos, server.status().message().find("overlap")) << server.status();
  so.checkpoint_dir = (dir.path() / "ckpt").string();
  server = Server::Start(so);
  EXPECT_TRUE(server.ok()) << server.status();
}

}  // namespace
}  // namespace ferry::test
