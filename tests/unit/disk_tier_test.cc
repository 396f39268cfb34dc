// The disk tier's store (internal/disk_tier.h, issue 37): rows go to RocksDB and come back bit for
// bit with their update counts; lookups of ids not there say so; overwrites, erasures, ordered
// scans, dropping a table; an earlier store is wiped and a folder of other files refused; a file
// corrupted byte by byte gives DATA_LOSS naming the table and the file, never a wrong row; a full
// disk gives RESOURCE_EXHAUSTED and the rows written before it still read back; a checkpoint by
// hard links holds the rows. The tier in a shard gives the bits of a shard that keeps every row
// in RAM. A server's checkpoint holds the rows of both tiers (the store's copy by hard links) and
// restores them into any number of servers; a copy missing a file or with a byte changed is not
// used (the older checkpoint is), naming the file.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
#include "ferry/messages/placement.h"
#include "internal/checkpoint.h"
#include "internal/disk_tier.h"
#include "internal/init.h"
#include "internal/table_registry.h"
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
  s.disk_tier = max_rows > 0;  // (ShardSpec(0): the shard with every row in RAM)
  return s;
}

// What a pull of `ids` serves from `shard` (promoting first when it has a disk).
// A shard of ShardSpec(max_rows, evict_after_steps) with the tier, in a store of its own.
struct TieredShard {
  explicit TieredShard(int64_t max_rows, int64_t evict_after_steps = 0)
      : dir("disk-tier"),
        disk(OpenStore(dir.path() / "store")),
        spec(ShardSpec(max_rows, evict_after_steps)),
        shard(spec, kShardTable, 1) {
    attached = disk != nullptr && shard.AttachDisk(disk.get()).ok();
  }
  test::TempDir dir;
  std::unique_ptr<DiskTier> disk;
  const TableSpec spec;  // (before the shard, which keeps a reference)
  SparseShard shard;
  bool attached = false;
};

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
  // A push of a new row writes nothing (pushed no more often than any row in RAM, it is on
  // probation beside them); the next call, which must write it to the store to demote it, fails
  // with the disk's error, before any update.
  shard.ApplyRows(std::vector<int64_t>{11, 12, 15}, grads.data(), &scratch);
  const auto before = AllRows(shard, nullptr);
  try {
    shard.ApplyRows(std::vector<int64_t>{11, 12}, grads.data(), &scratch);
    return say("a push that needed a demotion went through on a full disk", 1);
  } catch (const DiskTierError& e) {
    if (e.status().code() != StatusCode::kResourceExhausted ||
        e.status().message().find("table 'emb'") == std::string::npos) {
      return say("the demotion's error: " + e.status().ToString(), 1);
    }
  }
  if (AllRows(shard, nullptr) != before || shard.Find(15) == kNoRow) {
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

// A look without I/O (what the server's I/O thread does before handing a read to the disk
// readers) finds the rows in RocksDB's write buffers and block cache, never calls a row that is on
// disk absent, and leaves to Read what needs the disk.
TEST(DiskTier, ReadCachedNeverCallsARowOnDiskAbsentAndLeavesTheDiskToRead) {
  test::TempDir dir("disk-tier");
  auto tier = OpenTier(dir.path() / "store", /*cache=*/64 << 10);  // 64 KiB, about 1 MiB of rows
  ASSERT_TRUE(tier);
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 20000; ++i) ids.push_back(i * 3);
  ASSERT_TRUE(WriteIds(*tier, ids).ok());
  std::vector<int64_t> ask = {0, 3, 1, 5997, -5};  // 1 and -5 were never written
  auto look = [&](std::vector<DiskTier::Lookup>* state) {
    std::vector<float> rows(ask.size() * kFloats);
    std::vector<int64_t> steps(ask.size());
    Status s = tier->ReadCached(kTable, ask, rows.data(), steps.data(), state);
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < ask.size(); ++i) {
      if ((*state)[i] != DiskTier::Lookup::kFound) continue;
      const auto want = RowOf(ask[i]);
      EXPECT_EQ(0, std::memcmp(want.data(), &rows[i * kFloats], kFloats * sizeof(float))) << ask[i];
      EXPECT_EQ(StepsOf(ask[i]), steps[i]) << ask[i];
    }
  };
  using L = DiskTier::Lookup;
  std::vector<L> state;
  look(&state);  // in the write buffer: all answered
  EXPECT_EQ((std::vector<L>{L::kFound, L::kFound, L::kAbsent, L::kFound, L::kAbsent}), state);
  ASSERT_TRUE(tier->Compact().ok());  // in a table file now
  Status s;
  std::vector<int64_t> others(ids.begin() + 10000, ids.end());
  EXPECT_EQ(10000, ReadAndCheck(*tier, others, &s));  // the cache then holds other blocks than ask's
  ASSERT_TRUE(s.ok()) << s;
  look(&state);
  for (size_t i : {0u, 1u, 3u}) EXPECT_EQ(L::kNeedsDisk, state[i]) << "id " << ask[i];
  for (size_t i : {2u, 4u}) EXPECT_NE(L::kFound, state[i]) << "id " << ask[i];
  EXPECT_EQ(3, ReadAndCheck(*tier, ask, &s));  // what Read then finds, its blocks now in the cache
  ASSERT_TRUE(s.ok()) << s;
  look(&state);
  EXPECT_EQ((std::vector<L>{L::kFound, L::kFound, L::kAbsent, L::kFound, L::kAbsent}), state);
  // Without a block cache nothing is known without I/O.
  auto bare = OpenTier(dir.path() / "bare", /*cache=*/0);
  ASSERT_TRUE(bare);
  ASSERT_TRUE(WriteIds(*bare, ids).ok());
  std::vector<float> rows(ask.size() * kFloats);
  std::vector<int64_t> steps(ask.size());
  ASSERT_TRUE(bare->ReadCached(kTable, ask, rows.data(), steps.data(), &state).ok());
  EXPECT_EQ(std::vector<L>(ask.size(), L::kNeedsDisk), state);
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
    // The RAM tier, and the rows of the last call on probation beside it.
    ASSERT_LE(tiered.size(), 40u + ids.size()) << "step " << step;
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

TEST(DiskTierShard, ACallOfMoreRowsThanTheRamTierHoldsTakesThemAllAndTheTierShrinksBack) {
  test::TempDir dir("disk-tier");
  std::unique_ptr<DiskTier> disk = OpenStore(dir.path() / "store");
  ASSERT_TRUE(disk);
  const TableSpec tiered_spec = ShardSpec(/*max_rows=*/8), ram_spec = ShardSpec(0);
  SparseShard shard(tiered_spec, kShardTable, 1), ram(ram_spec, kShardTable, 1);
  ASSERT_TRUE(shard.AttachDisk(disk.get()).ok());
  std::vector<RowIndex> scratch;
  auto push = [&](const std::vector<int64_t>& ids, float g) {
    std::vector<float> grads(ids.size() * kDim, g);
    shard.ApplyRows(ids, grads.data(), &scratch);
    ram.ApplyRows(ids, grads.data(), &scratch);
  };
  std::vector<int64_t> twenty, thirty;
  for (int64_t id = 0; id < 20; ++id) twenty.push_back(id);
  for (int64_t id = 0; id < 30; ++id) thirty.push_back(id);
  // 20 rows made 4 at a time: the first 8 fill the RAM tier, and each later 4, pushed no more
  // often than the rows in RAM, are on probation beside them until the next call demotes them:
  // rows 8-15 on disk, 16-19 on probation.
  for (size_t k = 0; k < twenty.size(); k += 4) {
    push({twenty.begin() + static_cast<std::ptrdiff_t>(k), twenty.begin() + static_cast<std::ptrdiff_t>(k + 4)}, 0.5f);
  }
  ASSERT_EQ(12u, shard.size());
  ASSERT_EQ(8, shard.lifecycle().demoted);
  // A push of 30 distinct ids (8 cold, 12 in RAM, 10 new) through a RAM tier of 8 rows: every
  // update applied (a sync step is applied whole), the tier above max_rows until the next call.
  push(thirty, 1.0f);
  EXPECT_EQ(30u, shard.size());
  EXPECT_EQ(0, shard.lifecycle().not_admitted);
  // A pull of 40 ids, the 30 above and 10 never pushed: every row it names stays, none is read.
  std::vector<int64_t> pull = thirty;
  for (int64_t id = 100; id < 110; ++id) pull.push_back(id);  // never pushed: initial values
  const auto a = PullRows(shard, pull), b = PullRows(ram, pull);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  push({3, 17}, 0.25f);  // the rows on probation it does not name are demoted first
  EXPECT_EQ(9u, shard.size());
  const auto got = AllRows(shard, disk.get()), want = AllRows(ram, nullptr);
  EXPECT_EQ(30u, got.size());
  for (const auto& [id, row] : got) {
    ASSERT_TRUE(want.count(id)) << id;
    EXPECT_EQ(want.at(id).first, row.first) << "id " << id;
    EXPECT_EQ(0, std::memcmp(want.at(id).second.data(), row.second.data(), row.second.size() * sizeof(float)))
        << "id " << id;
  }
}

TEST(DiskTierShard, AnIdAgedOutStartsAnewNotFromItsStaleCopy) {
  TieredShard tiered(/*max_rows=*/3, /*evict_after_steps=*/3);
  ASSERT_TRUE(tiered.attached);
  SparseShard& shard = tiered.shard;
  std::vector<RowIndex> scratch;
  std::vector<float> grads(2 * kDim, 1.0f);
  auto push = [&](std::vector<int64_t> ids) { shard.ApplyRows(ids, grads.data(), &scratch); };
  push({1});
  push({2, 3});                           // the RAM tier of 3 rows full
  for (int k = 0; k < 3; ++k) push({4});  // row 4, no more pushed than them at first: on probation
  push({2, 3});                           // row 4 demoted (the call does not name it)
  push({4});                              // promoted, more pushed than row 1 (the least): row 1 demoted
  ASSERT_EQ(kNoRow, shard.Find(1));
  for (int k = 0; k < 2; ++k) push({1});  // promoted onto probation, pushed again
  push({2});                              // row 1 demoted again
  push({1});  // promoted, now pushed more often than row 3: a row of the RAM tier, its stale copy on disk
  ASSERT_NE(kNoRow, shard.Find(1));
  const int64_t promoted = shard.lifecycle().promoted;
  for (int k = 0; k < 8; ++k) push({50});  // the others age out of RAM
  ASSERT_EQ(kNoRow, shard.Find(1)) << "row 1 was not aged out";
  EXPECT_GT(shard.lifecycle().evicted_age, 0);
  const auto pulled = PullRows(shard, {1});
  std::vector<float> initial(kDim);
  shard.InitialRow(1, initial.data());
  EXPECT_EQ(0, std::memcmp(initial.data(), pulled.data(), kDim * sizeof(float))) << "an aged-out row came back";
  EXPECT_EQ(promoted, shard.lifecycle().promoted);
}

// The RAM tier keeps the most pushed rows (the filter's counts), not the most recent: 16 rows
// pushed 10 times stay in a tier of 64 while 2,000 rows pushed once each pass through it, where
// the least recently touched rows would have gone after 48 of them.
TEST(DiskTierShard, TheRamTierKeepsTheMostPushedRowsThroughAStreamOfRowsPushedOnce) {
  TieredShard tiered(/*max_rows=*/64);
  ASSERT_TRUE(tiered.attached);
  SparseShard& shard = tiered.shard;
  std::vector<RowIndex> scratch;
  std::vector<float> grads(16 * kDim, 0.5f);
  std::vector<int64_t> hot;
  for (int64_t id = 100000; id < 100016; ++id) hot.push_back(id);
  for (int k = 0; k < 10; ++k) shard.ApplyRows(hot, grads.data(), &scratch);
  for (int64_t id = 0; id < 2000; ++id) shard.ApplyRows(std::vector<int64_t>{id}, grads.data(), &scratch);
  EXPECT_GT(shard.lifecycle().demoted, 1900);
  for (int64_t id : hot) EXPECT_NE(kNoRow, shard.Find(id)) << "row " << id << " was demoted";
  shard.ApplyRows(hot, grads.data(), &scratch);
  EXPECT_EQ(0, shard.lifecycle().promoted);  // every one in RAM
}

// Pulls alone (an evaluation) do not let rows on probation pile up: past max(max_rows / 8, twice
// the pull's ids) of them, a pull demotes those it does not name.
TEST(DiskTierShard, PullsAloneKeepTheRowsOnProbationWithinMaxRows) {
  TieredShard tiered(/*max_rows=*/16);
  ASSERT_TRUE(tiered.attached);
  SparseShard& shard = tiered.shard;
  std::vector<RowIndex> scratch;
  std::vector<float> grads(kDim, 0.5f);
  for (int64_t id = 0; id < 400; ++id) shard.ApplyRows(std::vector<int64_t>{id}, grads.data(), &scratch);
  for (int64_t from = 16; from < 400; from += 8) {  // 8 cold rows a pull, each onto probation
    std::vector<int64_t> ids;
    for (int64_t id = from; id < from + 8; ++id) ids.push_back(id);
    const auto rows = PullRows(shard, ids);
    ASSERT_LE(shard.size(), 16u + 2u * 8u + 8u) << "after pulling " << from;
  }
  EXPECT_GT(shard.lifecycle().promoted, 300);
}

// Rows read ahead on another thread (the server's disk readers) give the bits of a shard with
// every row in RAM, although other calls promote, update and demote the same rows while the reads
// run: what such a write changed under a read is not kept, and a write after the read drops it.
TEST(DiskTierShard, RowsReadAheadGiveTheBitsOfEverythingInRamThoughWritesRaceTheReads) {
  test::TempDir dir("disk-tier");
  std::unique_ptr<DiskTier> disk = OpenStore(dir.path() / "store", /*cache=*/0);  // every id to the reader
  ASSERT_TRUE(disk);
  const TableSpec tiered_spec = ShardSpec(/*max_rows=*/20), ram_spec = ShardSpec(0);
  SparseShard tiered(tiered_spec, kShardTable, 1), ram(ram_spec, kShardTable, 1);
  ASSERT_TRUE(tiered.AttachDisk(disk.get()).ok());
  std::mt19937_64 g(41);
  std::uniform_int_distribution<int64_t> any(0, 199);
  std::uniform_real_distribution<float> grad(-1.0f, 1.0f);
  std::vector<RowIndex> scratch;
  auto push = [&](const std::vector<int64_t>& ids) {
    std::vector<float> grads(ids.size() * kDim);
    for (float& x : grads) x = grad(g);
    tiered.ApplyRows(ids, grads.data(), &scratch);
    ram.ApplyRows(ids, grads.data(), &scratch);
  };
  auto some = [&](int n) {
    std::vector<int64_t> ids;
    for (int k = 0; k < n; ++k) ids.push_back(any(g));
    return ids;
  };
  for (int k = 0; k < 30; ++k) push(some(12));  // most of [0, 200) on disk
  const int64_t inline_before = tiered.lifecycle().read_inline;
  int64_t read_ahead = 0;
  for (int step = 0; step < 200; ++step) {
    const std::vector<int64_t> ids = some(10);
    // What the I/O thread does: look without I/O, hand the rest to a reader.
    std::vector<int64_t> need;
    ASSERT_TRUE(tiered.ColdForReadAhead(ids, &need).ok());
    const uint64_t mark = tiered.BeginReadAhead();
    std::vector<float> rows(need.size() * static_cast<size_t>(tiered.row_floats()));
    std::vector<int64_t> steps(need.size());
    std::vector<bool> found;
    ASSERT_TRUE(disk->Read(kShardTable, need, rows.data(), steps.data(), &found).ok());
    // Before the read is back, other requests' pushes (half of them naming its ids) promote,
    // update and demote rows it read.
    for (int k = 0; k < 2; ++k) {
      std::vector<int64_t> other = some(6);
      if (k == 0) other.insert(other.end(), ids.begin(), ids.begin() + 3);
      push(other);
    }
    tiered.EndReadAhead(mark, need, rows.data(), steps.data(), found, /*ok=*/true);
    read_ahead += static_cast<int64_t>(need.size());
    if (step % 2 == 0) {
      push(ids);
    } else {
      const auto a = PullRows(tiered, ids), b = PullRows(ram, ids);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "step " << step;
    }
  }
  auto got = AllRows(tiered, disk.get()), want = AllRows(ram, nullptr);
  for (const auto& [id, row] : got) {
    ASSERT_TRUE(want.count(id)) << id;
    EXPECT_EQ(want[id].first, row.first) << "id " << id;
    EXPECT_EQ(0, std::memcmp(want[id].second.data(), row.second.data(), row.second.size() * sizeof(float)))
        << "id " << id;
  }
  EXPECT_GT(read_ahead, 200);
  // The read-ahead served calls (the racing pushes read on their own, as nothing read ahead for them).
  EXPECT_GT(tiered.lifecycle().promoted - (tiered.lifecycle().read_inline - inline_before), 100);
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

// ---- Checkpoints of a table with a disk tier ----------------------------------------------------

TableSpec TieredSpec(int64_t max_rows) {
  TableSpec s = ShardSpec(max_rows);
  s.disk_tier = true;
  return s;
}

// A server's tables (rank of n) with a store of their own in `dir`.
struct TieredServer {
  TieredServer(const fs::path& dir, int rank, int n) : registry(rank, n) {
    store = OpenStore(dir / ("store-" + std::to_string(rank) + "-of-" + std::to_string(n)));
    if (store) registry.SetDiskTier(store.get());
  }
  std::unique_ptr<DiskTier> store;
  TableRegistry registry;
  // Server 0 of 1's table "emb" with a RAM tier of 20 rows and the disk tier.
  bool DeclareTable() {
    if (!store) return false;
    Status s = registry.Create(TieredSpec(20), TableId("emb"), 1);
    EXPECT_TRUE(s.ok()) << s;
    return s.ok();
  }
  SparseShard& shard() { return *registry.Find(TableId("emb"), TableType::kSparse).value()->sparse; }
  // Every row of the table, both tiers: (steps, floats) by id.
  std::map<int64_t, std::pair<int64_t, std::vector<float>>> Rows() {
    std::map<int64_t, std::pair<int64_t, std::vector<float>>> rows;
    Status s = store->ForEachRow(TableId("emb"), [&](int64_t id, int64_t steps, const float* row) {
      rows[id] = {steps, std::vector<float>(row, row + shard().row_floats())};
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s;
    shard().ForEachRow([&](int64_t id, RowIndex r) {
      rows[id] = {shard().steps(r), std::vector<float>(shard().row(r), shard().row(r) + shard().row_floats())};
    });
    return rows;
  }
};

// Pushes of 40 rounds of 15 ids of [0, 400) (and pulls of 10 between them), into a RAM tier of
// 20 rows: most rows on disk, some promoted back, stale copies shadowed.
void Train(TieredServer& server, uint64_t seed, int rounds = 40) {
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int64_t> any(0, 399);
  std::vector<RowIndex> scratch;
  for (int k = 0; k < rounds; ++k) {
    std::vector<int64_t> ids;
    for (int i = 0; i < 15; ++i) ids.push_back(any(g));
    std::vector<float> grads(ids.size() * kDim);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>((i * 7 + k) % 13) - 0.06f;
    server.shard().ApplyRows(ids, grads.data(), &scratch);
    PullRows(server.shard(), std::vector<int64_t>(ids.begin(), ids.begin() + 10));
  }
}

// The copies of the store beside server 0 of 1's shard of `step` (<shard>.disk.<generation>).
std::vector<fs::path> CopiesOf(const fs::path& ckpt, int64_t step) {
  char shard[64];
  std::snprintf(shard, sizeof shard, "step-%020lld-shard-00000-of-00001.ckpt.disk.", static_cast<long long>(step));
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    if (e.path().filename().string().starts_with(shard)) out.push_back(e.path());
  }
  return out;
}

// Server 0 of 1 saves its shard of `step` into `dir` and commits it.
void Save(TieredServer& server, const fs::path& dir, int64_t step, int keep = 3) {
  auto f = WriteShard(dir.string(), 0, 1, step, server.registry);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE(WriteManifest(dir.string(), step, {*f}, "sync: step " + std::to_string(step), keep).ok());
}

TEST(DiskTierCheckpoint, HoldsBothTiersByHardLinksAndRestoresIntoAnyServerCount) {
  test::TempDir dir("disk-tier-ckpt");
  TieredServer server(dir.path(), 0, 1);
  ASSERT_TRUE(server.DeclareTable());
  Train(server, 1);
  const auto want = server.Rows();
  ASSERT_GT(want.size(), 200u);
  ASSERT_GT(server.shard().lifecycle().promoted, 0);
  const fs::path ckpt = dir.path() / "ckpt";
  Save(server, ckpt, 40);
  // The copy's table files are the store's own, linked: nothing was copied.
  ASSERT_EQ(1u, CopiesOf(ckpt, 40).size());
  const fs::path copy = CopiesOf(ckpt, 40)[0];
  int linked = 0;
  for (const auto& e : fs::directory_iterator(copy)) {
    if (e.path().extension() == ".sst") {
      EXPECT_GE(fs::hard_link_count(e.path()), 2u) << e.path();
      ++linked;
    }
  }
  EXPECT_GT(linked, 0);
  Train(server, 2);  // the live store moves on; the checkpoint does not
  ASSERT_NE(want, server.Rows());

  auto data = ReadCheckpoint(ckpt.string());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_LT(data->tables.at(TableId("emb")).rows.size(), want.size()) << "the RAM tier's rows only";
  for (int n : {1, 3}) {
    std::map<int64_t, std::pair<int64_t, std::vector<float>>> got;
    for (int r = 0; r < n; ++r) {
      TieredServer restored(dir.path() / ("restore-" + std::to_string(n)), r, n);
      ASSERT_TRUE(restored.store);
      ASSERT_TRUE(RestoreShard(*data, r, 1, &restored.registry).ok());
      EXPECT_LE(restored.shard().size(), 20u);
      // A restored row is in one tier: no stale copy on disk under a RAM row (the shard would not
      // know to erase it when the id ages out).
      std::vector<int64_t> in_ram;
      restored.shard().ForEachRow([&](int64_t id, RowIndex) { in_ram.push_back(id); });
      std::vector<float> rows(in_ram.size() * restored.shard().row_floats());
      std::vector<int64_t> steps(in_ram.size());
      std::vector<bool> found;
      ASSERT_TRUE(restored.store->Read(TableId("emb"), in_ram, rows.data(), steps.data(), &found).ok());
      EXPECT_EQ(0, std::count(found.begin(), found.end(), true)) << "rows in RAM with a copy on disk";
      for (auto& [id, row] : restored.Rows()) {
        EXPECT_EQ(r, placement::IdServer(id, n)) << "id " << id << " restored on the wrong server";
        EXPECT_TRUE(got.emplace(id, std::move(row)).second) << "id " << id << " twice";
      }
    }
    EXPECT_EQ(want, got) << "restored into " << n << " servers";
  }
  // A server without a store cannot restore it, and says so.
  TableRegistry plain(0, 1);
  Status s = RestoreShard(*data, 0, 1, &plain);
  EXPECT_EQ(StatusCode::kFailedPrecondition, s.code()) << s;
  EXPECT_NE(std::string::npos, s.message().find("--disk-tier-dir")) << s;
}

TEST(DiskTierCheckpoint, ACopyMissingAFileOrWithAByteChangedIsPassedOverForTheOlderCheckpoint) {
  test::TempDir dir("disk-tier-ckpt");
  TieredServer server(dir.path(), 0, 1);
  ASSERT_TRUE(server.DeclareTable());
  const fs::path ckpt = dir.path() / "ckpt";
  Train(server, 1);
  Save(server, ckpt, 10);
  const auto older = server.Rows();
  Train(server, 2);
  Save(server, ckpt, 20);
  ASSERT_EQ(1u, CopiesOf(ckpt, 20).size());
  const fs::path copy = CopiesOf(ckpt, 20)[0];
  std::vector<fs::path> tables;
  for (const auto& e : fs::directory_iterator(copy)) {
    if (e.path().extension() == ".sst") tables.push_back(e.path());
  }
  ASSERT_FALSE(tables.empty());
  std::sort(tables.begin(), tables.end());
  auto restored_rows = [&](const CheckpointData& data) {
    TieredServer restored(dir.path() / ("restore-" + std::to_string(data.step)), 0, 1);
    EXPECT_TRUE(RestoreShard(data, 0, 1, &restored.registry).ok());
    return restored.Rows();
  };

  // A byte of a table file changed (a copy of the file: the store's own is the same inode).
  const fs::path victim = tables.back();
  const fs::path saved = dir.path() / "saved.sst";
  fs::copy_file(victim, saved);
  fs::remove(victim);
  fs::copy_file(saved, victim);
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c = 0;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  std::vector<std::string> skipped;
  auto data = ReadCheckpoint(ckpt.string(), &skipped);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(10, data->step);
  ASSERT_EQ(1u, skipped.size());
  EXPECT_NE(std::string::npos, skipped[0].find(victim.filename().string())) << skipped[0];
  EXPECT_EQ(older, restored_rows(*data));

  // The file missing.
  fs::remove(victim);
  skipped.clear();
  data = ReadCheckpoint(ckpt.string(), &skipped);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(10, data->step);
  ASSERT_EQ(1u, skipped.size());
  EXPECT_NE(std::string::npos, skipped[0].find(victim.string() + ": missing")) << skipped[0];

  // Put back whole, the newer checkpoint verifies again.
  fs::copy_file(saved, victim);
  data = ReadCheckpoint(ckpt.string());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(20, data->step);
}

TEST(DiskTierCheckpoint, OldCheckpointsTakeTheirCopiesOfTheStoreWithThem) {
  test::TempDir dir("disk-tier-ckpt");
  TieredServer server(dir.path(), 0, 1);
  ASSERT_TRUE(server.DeclareTable());
  const fs::path ckpt = dir.path() / "ckpt";
  for (int64_t step = 1; step <= 4; ++step) {
    Train(server, static_cast<uint64_t>(step), 5);
    Save(server, ckpt, step, /*keep=*/2);
  }
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpt)) {
    const std::string n = e.path().filename().string();
    names.insert(n.substr(0, n.find(".disk.") == std::string::npos ? n.size() : n.find(".disk.") + 5));
  }
  EXPECT_EQ((std::set<std::string>{"CURRENT", "MANIFEST-00000000000000000003", "MANIFEST-00000000000000000004",
                                   "step-00000000000000000003-shard-00000-of-00001.ckpt",
                                   "step-00000000000000000003-shard-00000-of-00001.ckpt.disk",
                                   "step-00000000000000000004-shard-00000-of-00001.ckpt",
                                   "step-00000000000000000004-shard-00000-of-00001.ckpt.disk"}),
            names);
  EXPECT_EQ(1u, CopiesOf(ckpt, 3).size());
  // A step saved again: the new copy is made beside the one the committed shard names, which
  // goes once the new shard is in place.
  const fs::path before = CopiesOf(ckpt, 4).at(0);
  Train(server, 9, 5);
  Save(server, ckpt, 4, /*keep=*/2);
  ASSERT_EQ(1u, CopiesOf(ckpt, 4).size());
  EXPECT_NE(before, CopiesOf(ckpt, 4)[0]);
  auto data = ReadCheckpoint(ckpt.string());
  ASSERT_TRUE(data.ok()) << data.status();
  TieredServer restored(dir.path() / "restore", 0, 1);
  ASSERT_TRUE(RestoreShard(*data, 0, 1, &restored.registry).ok());
  EXPECT_EQ(server.Rows(), restored.Rows());
}

}  // namespace
}  // namespace ferry::ps
