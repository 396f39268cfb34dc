// The disk tier's store (internal/disk_tier.h, issue 37): rows go to RocksDB and come back bit for
// bit with their update counts; lookups of ids not there say so; overwrites, erasures, ordered
// scans, dropping a table; an earlier store is wiped and a folder of other files refused; a file
// corrupted byte by byte gives DATA_LOSS naming the table and the file, never a wrong row; a full
// disk gives RESOURCE_EXHAUSTED and the rows written before it still read back; a checkpoint by
// hard links holds the rows.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <vector>

#include <gtest/gtest.h>
#include <rocksdb/db.h>

#include "ferry/table_spec.h"
#include "internal/disk_tier.h"
#include "internal/init.h"
#include "internal/tables.h"
#include "support/temp_dir.h"

namespace ferry::ps {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kTable = 7;
constexpr int64_t kFloats = 12;  // a dim-4 Adam row: values, then two state slots

// Row i's floats: distinct bits per id and element, a NaN payload and a denormal among them.
std::vector<float> RowOf(int64_t id) {
  std::vector<float> row(kFloats);
  for (int64_t e = 0; e < kFloats; ++e) row[static_cast<size_t>(e)] = static_cast<float>(id % 100003) * 0.5f + e;
  uint32_t nan_bits = 0x7fc00000u | static_cast<uint32_t>(id & 0xffff), denormal_bits = 1;
  std::memcpy(&row[kFloats - 1], &nan_bits, 4);
  std::memcpy(&row[kFloats - 2], &denormal_bits, 4);
  return row;
}

// Row id's update count: distinct per id (wrapping, as INT64_MIN's would overflow).
int64_t StepsOf(int64_t id) { return static_cast<int64_t>(static_cast<uint64_t>(id) * 3 + 1); }

// A store in `dir` (null on failure, which the test reports).
std::unique_ptr<DiskTier> OpenStore(const fs::path& dir, int64_t cache = int64_t{8} << 20) {
  DiskTier::Options o;
  o.path = dir.string();
  o.block_cache_bytes = cache;
  std::unique_ptr<DiskTier> tier;
  Status s = DiskTier::Open(o, &tier);
  EXPECT_TRUE(s.ok()) << s;
  return tier;
}

// A store with the table kTable.
std::unique_ptr<DiskTier> OpenTier(const fs::path& dir, int64_t cache = int64_t{8} << 20) {
  std::unique_ptr<DiskTier> tier = OpenStore(dir, cache);
  if (tier) {
    Status s = tier->AddTable(kTable, "emb", kFloats);
    EXPECT_TRUE(s.ok()) << s;
  }
  return tier;
}

Status WriteIds(DiskTier& tier, const std::vector<int64_t>& ids) {
  std::vector<float> rows;
  std::vector<int64_t> steps;
  for (int64_t id : ids) {
    auto r = RowOf(id);
    rows.insert(rows.end(), r.begin(), r.end());
    steps.push_back(StepsOf(id));
  }
  return tier.Write(kTable, ids, steps, rows.data());
}

// Reads `ids` and checks every row found against RowOf; returns how many were found.
int64_t ReadAndCheck(DiskTier& tier, const std::vector<int64_t>& ids, Status* s) {
  std::vector<float> rows(ids.size() * kFloats, -1.0f);
  std::vector<int64_t> steps(ids.size(), -1);
  std::vector<bool> found;
  *s = tier.Read(kTable, ids, rows.data(), steps.data(), &found);
  if (!s->ok()) return 0;
  int64_t n = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!found[i]) continue;
    ++n;
    const auto want = RowOf(ids[i]);
    EXPECT_EQ(0, std::memcmp(want.data(), &rows[i * kFloats], kFloats * sizeof(float))) << "id " << ids[i];
    EXPECT_EQ(StepsOf(ids[i]), steps[i]) << "id " << ids[i];
  }
  return n;
}

TEST(DiskTier, RowsComeBackBitForBitAndAbsentIdsAreNotFound) {
  test::TempDir dir("disk-tier");
  auto tier = OpenTier(dir.path() / "store");
  ASSERT_TRUE(tier);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 5000; ++i) ids.push_back(i * 7919 - 1000000);
  ids.push_back(INT64_MIN);
  ids.push_back(INT64_MAX);
  ASSERT_TRUE(WriteIds(*tier, ids).ok());
  ASSERT_TRUE(tier->Flush().ok());  // half from files, half from RAM
  std::vector<int64_t> more = {0, 1, -1, 42};
  ASSERT_TRUE(WriteIds(*tier, more).ok());

  std::vector<int64_t> ask = {INT64_MIN, 5, 0, -1000000, INT64_MAX, 1, 42, -1, 13};  // 5, 13 absent
  Status s;
  std::vector<float> rows(ask.size() * kFloats);
  std::vector<int64_t> steps(ask.size());
  std::vector<bool> found;
  ASSERT_TRUE(tier->Read(kTable, ask, rows.data(), steps.data(), &found).ok());
  EXPECT_EQ((std::vector<bool>{true, false, true, true, true, true, true, true, false}), found);
  EXPECT_EQ(7, ReadAndCheck(*tier, ask, &s));
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(static_cast<int64_t>(ids.size()), ReadAndCheck(*tier, ids, &s));

  const DiskTier::Stats st = tier->stats();
  EXPECT_EQ(3, st.reads);
  EXPECT_EQ(static_cast<int64_t>(2 * ask.size() + ids.size()), st.rows_asked);
  EXPECT_EQ(static_cast<int64_t>(7 + 7 + ids.size()), st.rows_found);
  EXPECT_EQ(static_cast<int64_t>(ids.size() + more.size()), st.rows_written);
  int64_t timed = 0;
  for (int64_t c : st.read_us) timed += c;
  EXPECT_EQ(3, timed);

  Status unknown = tier->Read(99, ask, rows.data(), steps.data(), &found);
  EXPECT_EQ(StatusCode::kNotFound, unknown.code()) << unknown;
}

TEST(DiskTier, OverwriteEraseScanAndDrop) {
  test::TempDir dir("disk-tier");
  auto tier = OpenTier(dir.path() / "store");
  ASSERT_TRUE(tier);
  ASSERT_TRUE(tier->AddTable(8, "other", 3).ok());
  EXPECT_EQ(StatusCode::kAlreadyExists, tier->AddTable(8, "other", 3).code());
  ASSERT_TRUE(WriteIds(*tier, {5, -3, 9, 100}).ok());
  // Another table's row under the same id stays apart.
  const float other[3] = {1, 2, 3};
  const int64_t one_id[1] = {5}, one_step[1] = {77};
  ASSERT_TRUE(tier->Write(8, one_id, one_step, other).ok());
  // Overwrite 9 with 100's row and steps: RowOf(9) no longer reads back.
  const auto r100 = RowOf(100);
  const int64_t nine[1] = {9}, steps100[1] = {301};
  ASSERT_TRUE(tier->Write(kTable, nine, steps100, r100.data()).ok());
  const int64_t erase[2] = {-3, 12345};
  ASSERT_TRUE(tier->Erase(kTable, erase).ok());

  std::vector<int64_t> seen_ids, seen_steps;
  Status s = tier->ForEachRow(kTable, [&](int64_t id, int64_t steps, const float* row) {
    seen_ids.push_back(id);
    seen_steps.push_back(steps);
    const auto want = RowOf(id == 9 ? 100 : id);
    EXPECT_EQ(0, std::memcmp(want.data(), row, kFloats * sizeof(float))) << id;
    return Status::Ok();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ((std::vector<int64_t>{5, 9, 100}), seen_ids);
  EXPECT_EQ((std::vector<int64_t>{16, 301, 301}), seen_steps);
  // fn's error stops the scan and comes back.
  int calls = 0;
  s = tier->ForEachRow(kTable, [&](int64_t, int64_t, const float*) {
    ++calls;
    return InternalError("stop");
  });
  EXPECT_EQ(StatusCode::kInternal, s.code());
  EXPECT_EQ(1, calls);

  float got[3] = {};
  int64_t got_steps = 0;
  std::vector<bool> found;
  ASSERT_TRUE(tier->Read(8, one_id, got, &got_steps, &found).ok());
  EXPECT_TRUE(found[0]);
  EXPECT_EQ(77, got_steps);
  EXPECT_EQ(3.0f, got[2]);

  ASSERT_TRUE(tier->DropTable(8).ok());
  EXPECT_EQ(StatusCode::kNotFound, tier->Read(8, one_id, got, &got_steps, &found).code());
  ASSERT_TRUE(tier->AddTable(8, "other", 3).ok());  // anew, empty
  ASSERT_TRUE(tier->Read(8, one_id, got, &got_steps, &found).ok());
  EXPECT_FALSE(found[0]);
}

TEST(DiskTier, OpenWipesAnEarlierStoreAndRefusesOtherFiles) {
  test::TempDir dir("disk-tier");
  const fs::path store = dir.path() / "store";
  {
    auto tier = OpenTier(store);
    ASSERT_TRUE(tier);
    ASSERT_TRUE(WriteIds(*tier, {1, 2, 3}).ok());
    ASSERT_TRUE(tier->Flush().ok());
  }
  {
    auto tier = OpenTier(store);  // a server started again: its store starts empty
    ASSERT_TRUE(tier);
    Status s;
    EXPECT_EQ(0, ReadAndCheck(*tier, {1, 2, 3}, &s));
    EXPECT_TRUE(s.ok()) << s;
  }
  const fs::path mine = dir.path() / "mine";
  fs::create_directories(mine);
  std::ofstream(mine / "notes.txt") << "a user's file\n";
  DiskTier::Options o;
  o.path = mine.string();
  std::unique_ptr<DiskTier> tier;
  Status s = DiskTier::Open(o, &tier);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s;
  EXPECT_NE(std::string::npos, s.message().find("notes.txt")) << s;
  EXPECT_NE(std::string::npos, s.message().find(mine.string())) << s;
  EXPECT_TRUE(fs::exists(mine / "notes.txt"));
  EXPECT_FALSE(tier);
}

// Every byte changed, one at a time, in the middle of the data: each read gives the right rows or
// DATA_LOSS naming the table and the file, and at least one position is caught.
TEST(DiskTier, ACorruptFileIsDataLossNeverAWrongRow) {
  test::TempDir dir("disk-tier");
  auto tier = OpenTier(dir.path() / "store", /*cache=*/0);  // every read goes to the file
  ASSERT_TRUE(tier);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2000; ++i) ids.push_back(i);
  ASSERT_TRUE(WriteIds(*tier, ids).ok());
  ASSERT_TRUE(tier->Flush().ok());
  fs::path sst;
  for (const auto& e : fs::directory_iterator(dir.path() / "store")) {
    if (e.path().extension() == ".sst") sst = e.path();
  }
  ASSERT_FALSE(sst.empty());
  const auto size = static_cast<int64_t>(fs::file_size(sst));
  ASSERT_GT(size, 2000 * kFloats * 4);
  const int fd = ::open(sst.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  int caught = 0, tried = 0;
  // 96 bytes spread over the first 90% of the file (the data blocks; index and footer follow).
  for (int64_t k = 0; k < 96; ++k) {
    const off_t at = static_cast<off_t>(k * (size * 9 / 10) / 96 + 13);
    unsigned char b = 0;
    ASSERT_EQ(1, ::pread(fd, &b, 1, at));
    const unsigned char flipped = static_cast<unsigned char>(b ^ 0x5a);
    ASSERT_EQ(1, ::pwrite(fd, &flipped, 1, at));
    Status s;
    const int64_t n = ReadAndCheck(*tier, ids, &s);  // compares every row found
    ++tried;
    if (!s.ok()) {
      ++caught;
      EXPECT_EQ(StatusCode::kDataLoss, s.code()) << s;
      EXPECT_NE(std::string::npos, s.message().find("table 'emb'")) << s;
      EXPECT_NE(std::string::npos, s.message().find(sst.filename().string())) << s;
    } else {
      EXPECT_EQ(static_cast<int64_t>(ids.size()), n) << "byte " << at << ": rows lost without an error";
    }
    ASSERT_EQ(1, ::pwrite(fd, &b, 1, at));
  }
  ::close(fd);
  EXPECT_GT(caught, tried / 2) << "changed bytes in the data blocks went unnoticed";
  Status s;
  EXPECT_EQ(static_cast<int64_t>(ids.size()), ReadAndCheck(*tier, ids, &s));  // restored: all back
  EXPECT_TRUE(s.ok()) << s;
}

// ---- A shard with the tier ------------------------------------------------------------------

constexpr uint64_t kShardTable = 0x37;
constexpr int64_t kDim = 4;

TableSpec ShardSpec(int64_t max_rows, int64_t evict_after_steps = 0) {
  TableSpec s;
  s.name = "emb";
  s.type = TableType::kSparse;
  s.dim = kDim;
  s.optimizer.type = OptimizerType::kAdam;  // two state slots that must travel with the row
  s.optimizer.learning_rate = 0.01f;
  s.consistency = Consistency::kSync;
  s.init = InitType::kUniform;
  s.init_scale = 0.1f;
  s.seed = 11;
  s.max_rows = max_rows;
  s.evict_after_steps = evict_after_steps;
  return s;
}

// What a pull of `ids` serves from `shard` (promoting first when it has a disk).
std::vector<float> PullRows(SparseShard& shard, const std::vector<int64_t>& ids) {
  shard.PromoteForPull(ids);
  std::vector<float> out(ids.size() * kDim);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (const RowIndex r = shard.FindForPull(ids[i]); r != kNoRow) {
      std::memcpy(&out[i * kDim], shard.row(r), kDim * sizeof(float));
    } else {
      shard.InitialRow(ids[i], &out[i * kDim]);
    }
  }
  return out;
}

// Every row of the shard, RAM and disk, by id: (steps, floats).
std::map<int64_t, std::pair<int64_t, std::vector<float>>> AllRows(SparseShard& shard, DiskTier* disk) {
  std::map<int64_t, std::pair<int64_t, std::vector<float>>> rows;
  if (disk != nullptr) {
    Status s = disk->ForEachRow(kShardTable, [&](int64_t id, int64_t steps, const float* row) {
      rows[id] = {steps, std::vector<float>(row, row + shard.row_floats())};
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  shard.ForEachRow([&](int64_t id, RowIndex r) {  // RAM shadows the disk
    rows[id] = {shard.steps(r), std::vector<float>(shard.row(r), shard.row(r) + shard.row_floats())};
  });
  return rows;
}

// The full disk's writer, in a fresh process (RocksDB's background threads do not survive a
// fork): the store on the 1 MiB tmpfs of FERRY_DISK_TIER_FULL; what it says goes to stdout.
int FullDiskChild(const char* mnt) {
  auto say = [](const std::string& m, int code) {
    std::printf("%s\n", m.c_str());
    std::fflush(stdout);
    return code;
  };
  DiskTier::Options o;
  o.path = (fs::path(mnt) / "store").string();
  o.write_buffer_bytes = 1 << 20;
  std::unique_ptr<DiskTier> tier;
  if (Status s = DiskTier::Open(o, &tier); !s.ok()) return say("open: " + s.ToString(), 1);
  if (Status s = tier->AddTable(kTable, "emb", kFloats); !s.ok()) return say("add: " + s.ToString(), 1);
  const std::vector<int64_t> first = {1, 2, 3};
  if (Status s = WriteIds(*tier, first); !s.ok()) return say("first write: " + s.ToString(), 1);
  // A shard whose RAM tier of 4 rows is full before the disk fills.
  const TableSpec spec = ShardSpec(/*max_rows=*/4);
  SparseShard shard(spec, kShardTable, 1);
  if (Status s = shard.AttachDisk(tier.get()); !s.ok()) return say("attach: " + s.ToString(), 1);
  std::vector<RowIndex> scratch;
  std::vector<float> grads(4 * kDim, 1.0f);
  shard.ApplyRows(std::vector<int64_t>{11, 12, 13, 14}, grads.data(), &scratch);
  Status failed;
  for (int64_t batch = 0; batch < 400 && failed.ok(); ++batch) {
    std::vector<int64_t> ids;
    for (int64_t i = 0; i < 1000; ++i) ids.push_back(1000 + batch * 1000 + i);
    failed = WriteIds(*tier, ids);
    if (failed.ok()) failed = tier->Flush();
  }
  if (failed.ok()) return say("400 batches of 56 KB written to a 1 MiB tmpfs without an error", 1);
  if (failed.code() != StatusCode::kResourceExhausted) return say("not RESOURCE_EXHAUSTED: " + failed.ToString(), 1);
  if (failed.message().find(o.path) == std::string::npos) return say("the path is not named: " + failed.ToString(), 1);
  Status s;
  const int64_t n = ReadAndCheck(*tier, first, &s);
  if (!s.ok() || n != 3 || ::testing::Test::HasFailure()) {
    return say("the rows written before the disk filled: " + s.ToString() + ", found " + std::to_string(n), 1);
  }
  // A push that must demote a row to make room fails with the disk's error, before any update.
  const auto before = AllRows(shard, nullptr);
  try {
    shard.ApplyRows(std::vector<int64_t>{11, 12, 15}, grads.data(), &scratch);
    return say("a push that needed a demotion went through on a full disk", 1);
  } catch (const DiskTierError& e) {
    if (e.status().code() != StatusCode::kResourceExhausted ||
        e.status().message().find("table 'emb'") == std::string::npos) {
      return say("the demotion's error: " + e.status().ToString(), 1);
    }
  }
  if (AllRows(shard, nullptr) != before || shard.Find(15) != kNoRow) {
    return say("the refused push changed the shard", 1);
  }
  return say(failed.ToString(), 0);
}

// A 1 MiB tmpfs in a mount namespace of a child process (needs root; skipped otherwise).
TEST(DiskTier, AFullDiskIsResourceExhaustedAndEarlierRowsStillRead) {
  if (const char* mnt = std::getenv("FERRY_DISK_TIER_FULL")) std::exit(FullDiskChild(mnt));
  test::TempDir dir("disk-tier");
  const fs::path mnt = dir.path() / "small";
  fs::create_directories(mnt);
  const fs::path self = fs::read_symlink("/proc/self/exe");
  int pipefd[2];
  ASSERT_EQ(0, ::pipe(pipefd));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::close(pipefd[0]);
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    ::alarm(120);  // bounded, whatever happens
    if (::geteuid() != 0 || ::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0) {
      const char m[] = "cannot mount a small tmpfs (needs root and mount namespaces)\n";
      (void)!::write(1, m, sizeof m - 1);
      ::_exit(77);
    }
    ::setenv("FERRY_DISK_TIER_FULL", mnt.c_str(), 1);
    const char* argv[] = {self.c_str(), "--gtest_filter=DiskTier.AFullDiskIsResourceExhaustedAndEarlierRowsStillRead",
                          nullptr};
    ::execv(self.c_str(), const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ASSERT_EQ(pid, ::waitpid(pid, &status, 0));
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << ": " << said;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << said;
  EXPECT_EQ(0, WEXITSTATUS(status)) << said;
  EXPECT_NE(std::string::npos, said.find("RESOURCE_EXHAUSTED")) << said;
}

TEST(DiskTier, ACheckpointHoldsTheRowsByHardLinks) {
  test::TempDir dir("disk-tier");
  auto tier = OpenTier(dir.path() / "store");
  ASSERT_TRUE(tier);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 3000; ++i) ids.push_back(i * 31);
  ASSERT_TRUE(WriteIds(*tier, ids).ok());
  const fs::path cp = dir.path() / "cp";
  Status s = tier->Checkpoint(cp.string());
  ASSERT_TRUE(s.ok()) << s;
  s = tier->Checkpoint(cp.string());
  EXPECT_FALSE(s.ok()) << "a checkpoint into a folder that exists";
  EXPECT_NE(std::string::npos, s.message().find(cp.string())) << s;
  // Rows written after the checkpoint are not in it.
  ASSERT_TRUE(WriteIds(*tier, {7}).ok());
  int linked = 0;
  for (const auto& e : fs::directory_iterator(cp)) {
    if (e.path().extension() == ".sst" && fs::hard_link_count(e.path()) > 1) ++linked;
  }
  EXPECT_GT(linked, 0) << "no table file of the checkpoint is a hard link";

  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {{rocksdb::kDefaultColumnFamilyName, {}}, {"t7", {}}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::Status rs = rocksdb::DB::OpenForReadOnly(rocksdb::DBOptions(), cp.string(), cfs, &handles, &raw);
  ASSERT_TRUE(rs.ok()) << rs.ToString();
  std::unique_ptr<rocksdb::DB> db(raw);
  int64_t rows = 0;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), handles[1]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ASSERT_EQ(8u, it->key().size());
    const int64_t id = DiskTier::IdOfKey(it->key().data());
    ASSERT_NE(7, id);
    const auto want = RowOf(id);
    ASSERT_EQ(8 + kFloats * 4, static_cast<int64_t>(it->value().size()));
    EXPECT_EQ(0, std::memcmp(want.data(), it->value().data() + 8, kFloats * 4)) << id;
    ++rows;
  }
  EXPECT_TRUE(it->status().ok());
  EXPECT_EQ(static_cast<int64_t>(ids.size()), rows);
  it.reset();
  for (auto* h : handles) db->DestroyColumnFamilyHandle(h);
}

TEST(DiskTier, KeysSortAsIds) {
  const int64_t ids[] = {INT64_MIN, -5, -1, 0, 1, 2, 255, 256, INT64_MAX};
  for (size_t i = 0; i + 1 < std::size(ids); ++i) {
    const auto a = DiskTier::Key(ids[i]), b = DiskTier::Key(ids[i + 1]);
    EXPECT_LT(std::memcmp(a.data(), b.data(), 8), 0) << ids[i] << " " << ids[i + 1];
    EXPECT_EQ(ids[i], DiskTier::IdOfKey(a.data()));
  }
}


TEST(DiskTierShard, ARamTierOf40RowsGivesTheBitsOfEverythingInRam) {
  test::TempDir dir("disk-tier");
  std::unique_ptr<DiskTier> disk = OpenStore(dir.path() / "store");
  ASSERT_TRUE(disk);
  const TableSpec tiered_spec = ShardSpec(/*max_rows=*/40), ram_spec = ShardSpec(0);
  SparseShard tiered(tiered_spec, kShardTable, 1), ram(ram_spec, kShardTable, 1);
  ASSERT_TRUE(tiered.AttachDisk(disk.get()).ok());

  std::mt19937_64 g(37);
  std::uniform_int_distribution<int64_t> any(0, 599);
  std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
  std::vector<RowIndex> scratch;
  std::set<int64_t> pushed;
  for (int step = 0; step < 300; ++step) {
    std::vector<int64_t> ids;
    for (int k = 0; k < 16; ++k) ids.push_back(step % 3 == 0 ? any(g) % 30 : any(g));  // a hot set, and the rest
    ids.push_back(ids.front());  // a repeated id: applied twice, in order
    const auto a = PullRows(tiered, ids), b = PullRows(ram, ids);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "step " << step;
    std::vector<float> grads(ids.size() * kDim);
    for (float& x : grads) x = grad(g);
    tiered.ApplyRows(ids, grads.data(), &scratch);
    ram.ApplyRows(ids, grads.data(), &scratch);
    pushed.insert(ids.begin(), ids.end());
    ASSERT_LE(tiered.size(), 40u) << "step " << step;
  }
  EXPECT_GT(tiered.lifecycle().demoted, 1000);
  EXPECT_GT(tiered.lifecycle().promoted, 1000);
  EXPECT_EQ(0, tiered.lifecycle().evicted_capacity);
  EXPECT_EQ(0, tiered.lifecycle().not_admitted);

  // Every row pushed is held, in one tier or the other, with the bits and update count of the
  // shard that kept everything in RAM (which also made rows for pulls only: compare those pushed).
  auto got = AllRows(tiered, disk.get()), want = AllRows(ram, nullptr);
  EXPECT_EQ(pushed.size(), got.size());
  for (int64_t id : pushed) {
    ASSERT_TRUE(got.count(id)) << "id " << id << " was lost";
    EXPECT_EQ(want[id].first, got[id].first) << "id " << id;
    EXPECT_EQ(0, std::memcmp(want[id].second.data(), got[id].second.data(), want[id].second.size() * sizeof(float)))
        << "id " << id;
  }
}

TEST(DiskTierShard, APushOfMoreColdIdsThanTheRamTierHoldsChangesNothing) {
  test::TempDir dir("disk-tier");
  std::unique_ptr<DiskTier> disk = OpenStore(dir.path() / "store");
  ASSERT_TRUE(disk);
  const TableSpec spec = ShardSpec(/*max_rows=*/8);
  SparseShard shard(spec, kShardTable, 1);
  ASSERT_TRUE(shard.AttachDisk(disk.get()).ok());
  std::vector<RowIndex> scratch;
  std::vector<int64_t> first;
  for (int64_t id = 0; id < 20; ++id) first.push_back(id);
  for (size_t k = 0; k < first.size(); k += 4) {  // 20 rows made 4 at a time: 12 of them on disk
    std::vector<int64_t> four(first.begin() + static_cast<std::ptrdiff_t>(k),
                              first.begin() + static_cast<std::ptrdiff_t>(k + 4));
    std::vector<float> grads(four.size() * kDim, 0.5f);
    shard.ApplyRows(four, grads.data(), &scratch);
  }
  const auto before = AllRows(shard, disk.get());
  ASSERT_EQ(20u, before.size());
  std::vector<float> grads(first.size() * kDim, 1.0f);
  try {
    shard.ApplyRows(first, grads.data(), &scratch);
    FAIL() << "20 distinct ids in one push went through a RAM tier of 8 rows";
  } catch (const BudgetExceeded& e) {
    EXPECT_NE(std::string::npos, std::string(e.what()).find("max_rows=8")) << e.what();
  }
  EXPECT_EQ(before, AllRows(shard, disk.get())) << "a refused push changed rows";
  // And the shard goes on: a push that fits is applied.
  shard.ApplyRows(std::vector<int64_t>{3, 17}, grads.data(), &scratch);
  const auto after = AllRows(shard, disk.get());
  EXPECT_EQ(20u, after.size());
  EXPECT_EQ(before.at(3).first + 1, after.at(3).first);
  EXPECT_EQ(before.at(17).first + 1, after.at(17).first);
}

TEST(DiskTierShard, AnIdAgedOutStartsAnewNotFromItsStaleCopy) {
  test::TempDir dir("disk-tier");
  std::unique_ptr<DiskTier> disk = OpenStore(dir.path() / "store");
  ASSERT_TRUE(disk);
  const TableSpec spec = ShardSpec(/*max_rows=*/3, /*evict_after_steps=*/3);
  SparseShard shard(spec, kShardTable, 1);
  ASSERT_TRUE(shard.AttachDisk(disk.get()).ok());
  std::vector<RowIndex> scratch;
  std::vector<float> grads(2 * kDim, 1.0f);
  auto push = [&](std::vector<int64_t> ids) { shard.ApplyRows(ids, grads.data(), &scratch); };
  push({1});
  push({2, 3});
  push({4});  // row 1, the least recently touched, demoted
  ASSERT_EQ(1, shard.lifecycle().demoted);
  ASSERT_EQ(kNoRow, shard.Find(1));
  push({1});  // promoted (another row demoted): its stale copy stays on disk
  ASSERT_EQ(1, shard.lifecycle().promoted);
  ASSERT_NE(kNoRow, shard.Find(1));
  for (int k = 0; k < 8; ++k) push({50});  // the others age out of RAM
  ASSERT_EQ(kNoRow, shard.Find(1)) << "row 1 was not aged out";
  EXPECT_GT(shard.lifecycle().evicted_age, 0);
  const auto pulled = PullRows(shard, {1});
  std::vector<float> initial(kDim);
  shard.InitialRow(1, initial.data());
  EXPECT_EQ(0, std::memcmp(initial.data(), pulled.data(), kDim * sizeof(float))) << "an aged-out row came back";
  EXPECT_EQ(1, shard.lifecycle().promoted);
}

TEST(DiskTierShard, NeedsLifecycleSettingsAndNoFeed) {
  test::TempDir dir("disk-tier");
  std::unique_ptr<DiskTier> disk = OpenStore(dir.path() / "store");
  ASSERT_TRUE(disk);
  const TableSpec plain = ShardSpec(0), tiered = ShardSpec(4);
  SparseShard a(plain, kShardTable, 1);
  EXPECT_EQ(StatusCode::kFailedPrecondition, a.AttachDisk(disk.get()).code());
  SparseShard b(tiered, kShardTable, 1);
  ASSERT_TRUE(b.StartFeed().ok());
  EXPECT_EQ(StatusCode::kFailedPrecondition, b.AttachDisk(disk.get()).code());
  SparseShard c(tiered, kShardTable + 1, 1);
  ASSERT_TRUE(c.AttachDisk(disk.get()).ok());
  EXPECT_EQ(StatusCode::kFailedPrecondition, c.StartFeed().code());
}

}  // namespace
}  // namespace ferry::ps
