// The server's memory budget (internal/memory_budget.h): a dense shard is charged when it is
// declared and a sparse row when it is created; what would go over is refused before anything is
// allocated, with how much was asked and how much is left, and leaves everything as it was.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "ferry/table_spec.h"
#include "internal/memory_budget.h"
#include "internal/table_registry.h"
#include "internal/tables.h"

namespace ferry::ps {
namespace {

TableSpec Dense(const std::string& name, int64_t elems, OptimizerType opt = OptimizerType::kSgd) {
  TableSpec spec;
  spec.name = name;
  spec.shape = {elems};
  spec.chunk_elems = elems;
  spec.optimizer.type = opt;
  return spec;
}

TableSpec Sparse(const std::string& name, int64_t dim) {
  TableSpec spec;
  spec.name = name;
  spec.type = TableType::kSparse;
  spec.dim = dim;
  spec.optimizer.type = OptimizerType::kAdagrad;  // one state slot: 2 * dim floats a row
  return spec;
}

// A fake cgroup tree under a temporary directory: Write("sys/fs/cgroup/memory/a/x", "1") makes
// the file and its folders.
class FakeCgroups : public testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() /
            ("ferry-cgroup-test-" + std::to_string(::getpid()) + "-" +
             testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& path, const std::string& text) {
    const std::filesystem::path p = root_ / path;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text << "\n";
  }
  int64_t Limit(const std::string& proc_cgroup, const std::string& mountinfo) {
    return MemoryBudget::CgroupLimit(proc_cgroup, mountinfo, root_.string());
  }
  std::filesystem::path root_;
};

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr char kV1None[] = "9223372036854771712";  // v1's "no limit"
// A cgroup v1 machine (Slurm, older Kubernetes nodes): memory's own hierarchy.
constexpr char kV1Mounts[] =
    "25 1 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,memory\n"
    "31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:14 - cgroup cgroup rw,cpu,cpuacct\n";
constexpr char kV1Job[] = "12:memory:/slurm/uid_1000/job_5\n11:cpu,cpuacct:/slurm/uid_1000/job_5\n";

// The case: a ferry-ps inside a v1 memory cgroup of 6 GiB on a bigger machine. The old
// code read only the hierarchy's root (no limit) and took 80% of the machine.
TEST_F(FakeCgroups, AV1LimitOnTheProcesssOwnCgroupCounts) {
  Write("sys/fs/cgroup/memory/memory.limit_in_bytes", kV1None);
  Write("sys/fs/cgroup/memory/slurm/memory.limit_in_bytes", kV1None);
  Write("sys/fs/cgroup/memory/slurm/uid_1000/memory.limit_in_bytes", kV1None);
  Write("sys/fs/cgroup/memory/slurm/uid_1000/job_5/memory.limit_in_bytes", std::to_string(6 * kGiB));
  EXPECT_EQ(Limit(kV1Job, kV1Mounts), 6 * kGiB);
}

TEST_F(FakeCgroups, TheLowestLimitOfTheCgroupAndItsAncestorsCounts) {
  Write("sys/fs/cgroup/memory/slurm/uid_1000/memory.limit_in_bytes", std::to_string(4 * kGiB));
  Write("sys/fs/cgroup/memory/slurm/uid_1000/job_5/memory.limit_in_bytes", std::to_string(6 * kGiB));
  EXPECT_EQ(Limit(kV1Job, kV1Mounts), 4 * kGiB);
  // None anywhere: no limit.
  Write("sys/fs/cgroup/memory/slurm/uid_1000/memory.limit_in_bytes", kV1None);
  Write("sys/fs/cgroup/memory/slurm/uid_1000/job_5/memory.limit_in_bytes", kV1None);
  EXPECT_EQ(Limit(kV1Job, kV1Mounts), 0);
}

TEST_F(FakeCgroups, V2ReadsMemoryMaxUpTheTree) {
  const std::string mounts = "35 1 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
  Write("sys/fs/cgroup/user.slice/memory.max", std::to_string(2 * kGiB));
  Write("sys/fs/cgroup/user.slice/app.scope/memory.max", "max");
  EXPECT_EQ(Limit("0::/user.slice/app.scope\n", mounts), 2 * kGiB);
  Write("sys/fs/cgroup/user.slice/app.scope/memory.max", std::to_string(kGiB));
  EXPECT_EQ(Limit("0::/user.slice/app.scope\n", mounts), kGiB);
  // In a cgroup namespace the process's cgroup is "/": the mount's own file.
  Write("sys/fs/cgroup/memory.max", std::to_string(3 * kGiB));
  EXPECT_EQ(Limit("0::/\n", mounts), 3 * kGiB);
}

TEST_F(FakeCgroups, AHybridMachineTakesTheLowerOfV1AndV2) {
  const std::string mounts = std::string(kV1Mounts) +
                             "40 25 0:35 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n";
  Write("sys/fs/cgroup/memory/slurm/uid_1000/job_5/memory.limit_in_bytes", std::to_string(6 * kGiB));
  Write("sys/fs/cgroup/unified/slurm/uid_1000/job_5/memory.max", std::to_string(5 * kGiB));
  EXPECT_EQ(Limit(std::string(kV1Job) + "0::/slurm/uid_1000/job_5\n", mounts), 5 * kGiB);
}

// A container sees a bind mount of its own subtree: the mount's root is its cgroup's path.
TEST_F(FakeCgroups, AMountOfASubtreeIsReadBelowItsRoot) {
  const std::string mounts =
      "50 40 0:27 /docker/abc /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n";
  Write("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(8 * kGiB));
  Write("sys/fs/cgroup/memory/child/memory.limit_in_bytes", std::to_string(7 * kGiB));
  EXPECT_EQ(Limit("9:memory:/docker/abc/child\n", mounts), 7 * kGiB);
  EXPECT_EQ(Limit("9:memory:/docker/abc\n", mounts), 8 * kGiB);
  // A path outside the mount's root (another namespace's view): the mount itself.
  EXPECT_EQ(Limit("9:memory:/elsewhere\n", mounts), 8 * kGiB);
  // A mount point with a space, escaped by the kernel as \040.
  Write("mnt/cg roup/memory.limit_in_bytes", std::to_string(kGiB));
  EXPECT_EQ(Limit("9:memory:/\n", "60 1 0:27 / /mnt/cg\\040roup rw - cgroup cgroup rw,memory\n"), kGiB);
}

TEST_F(FakeCgroups, NoCgroupsOrGarbageMeanNoLimit) {
  EXPECT_EQ(Limit("", ""), 0);
  EXPECT_EQ(Limit("garbage\n::\n12:memory\n", "x y z\n - \n1 2 3 4 5 - cgroup\n"), 0);
  Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "not a number");
  EXPECT_EQ(Limit("12:memory:relative/path\n", kV1Mounts), 0);  // a path without a leading '/' ends
  // This machine's own files parse (whatever they hold).
  EXPECT_GE(MemoryBudget::DefaultLimit(), 0);
}

TEST(MemoryBudget, TakesWhatFitsAndRefusesWhatDoesNot) {
  MemoryBudget b(1000);
  EXPECT_TRUE(b.TryTake(600));
  EXPECT_FALSE(b.TryTake(401));
  EXPECT_EQ(b.used(), 600);
  EXPECT_EQ(b.refusals(), 1);
  EXPECT_TRUE(b.TryTake(400));
  b.Give(1000);
  const Status s = b.Take(2 << 20, "table 'x'");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(
      s.message(),
      "table 'x' would take 2.0 MiB; the server's memory budget (--memory-budget-mb) has 0.0 MiB of 0.0 MiB left");
  EXPECT_GT(MemoryBudget::DefaultLimit(), int64_t{64} << 20);
  EXPECT_EQ(MemoryBudget(0).limit(), MemoryBudget::DefaultLimit());
}

TEST(MemoryBudget, DenseTablesAreChargedWhenDeclared) {
  TableRegistry tables(0, 1, /*memory_budget=*/int64_t{8} << 20);
  // 1M floats with Adam (two state slots): 12 MiB, over the 8 MiB budget; refused, nothing made.
  const TableSpec big = Dense("big", 1 << 20, OptimizerType::kAdam);
  Status s = tables.Create(big, TableId(big.name), 1);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("table 'big' (this server's shard) would take 12.0 MiB"), std::string::npos) << s;
  EXPECT_NE(s.message().find("has 8.0 MiB of 8.0 MiB left"), std::string::npos) << s;
  EXPECT_EQ(tables.Find(TableId(big.name)), nullptr);
  EXPECT_EQ(tables.budget().used(), 0);
  // 1M floats with SGD: 4 MiB fits; declaring it again charges nothing more.
  const TableSpec w = Dense("w", 1 << 20);
  ASSERT_TRUE(tables.Create(w, TableId(w.name), 1).ok());
  ASSERT_TRUE(tables.Create(w, TableId(w.name), 1).ok());
  EXPECT_EQ(tables.budget().used(), int64_t{4} << 20);
  // On two servers each is charged only for the chunks it holds.
  TableRegistry r0(0, 2, int64_t{8} << 20), r1(1, 2, int64_t{8} << 20);
  TableSpec halves = Dense("halves", 1 << 20);
  halves.chunk_elems = 1 << 18;
  ASSERT_TRUE(r0.Create(halves, TableId(halves.name), 1).ok());
  ASSERT_TRUE(r1.Create(halves, TableId(halves.name), 1).ok());
  EXPECT_EQ(r0.budget().used() + r1.budget().used(), int64_t{4} << 20);
}

// A dense table keeps its chunking for its life. A client of 1.9 (take_chunking) routes by the
// chunking the reply names: its declaration that differs only there is the same declaration,
// charged nothing more; an older client's is refused, naming the field.
TEST(TableRegistry, ADenseTableKeepsItsChunkingAndA19ClientTakesIt) {
  TableRegistry tables(0, 1, int64_t{64} << 20);
  TableSpec w = Dense("w", 1000);
  w.chunk_elems = 100;
  ASSERT_TRUE(tables.Create(w, TableId(w.name), 1).ok());
  const int64_t used = tables.budget().used();
  TableSpec other = w;
  other.chunk_elems = 30;
  bool pending = false;
  auto old = tables.Declare(other, TableId(w.name), 1, &pending, /*take_chunking=*/false);
  EXPECT_EQ(old.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(old.status().message().find("cannot change its chunk_elems 100 -> 30"), std::string::npos) << old.status();
  auto taken = tables.Declare(other, TableId(w.name), 1, &pending, /*take_chunking=*/true);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, nullptr) << "the table exists: nothing to build";
  ASSERT_NE(tables.SpecOf(TableId(w.name)), nullptr);
  EXPECT_EQ(tables.SpecOf(TableId(w.name))->chunk_elems, 100);
  EXPECT_EQ(tables.budget().used(), used);
  other.shape = {2000};  // anything else still conflicts
  EXPECT_EQ(tables.Declare(other, TableId(w.name), 1, &pending, true).status().code(), StatusCode::kAlreadyExists);
}

TEST(MemoryBudget, SparseRowsAreChargedAsCreatedAndARefusalChangesNothing) {
  const TableSpec spec = Sparse("emb", 64);
  SparseShard probe(spec, TableId(spec.name), 1);
  const int64_t row = probe.RowBytes();  // 2 * 64 floats + 24
  EXPECT_EQ(row, 2 * 64 * 4 + 24);
  MemoryBudget tight(10 * row);
  {
    SparseShard shard(spec, TableId(spec.name), 1, &tight);
    for (int64_t id = 0; id < 10; ++id) shard.FindOrCreate(id);
    EXPECT_EQ(tight.used(), 10 * row);
    shard.FindOrCreate(3);  // an existing row costs nothing
    EXPECT_EQ(tight.used(), 10 * row);
    try {
      shard.FindOrCreate(10);
      FAIL() << "row 11 went over the budget";
    } catch (const BudgetExceeded& e) {
      EXPECT_NE(std::string(e.what()).find("a new row of sparse table 'emb' would take"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(shard.size(), 10u);
    EXPECT_EQ(tight.used(), 10 * row);
    // A push whose new rows do not fit applies nothing, not even to the rows that exist.
    const std::vector<int64_t> ids = {1, 11};
    std::vector<float> grads(2 * 64, 1.0f);
    std::vector<RowIndex> scratch;
    const float before = shard.row(shard.FindOrCreate(1))[0];
    EXPECT_THROW(shard.ApplyRows(ids, grads.data(), &scratch), BudgetExceeded);
    EXPECT_EQ(shard.row(shard.FindOrCreate(1))[0], before);
    EXPECT_EQ(shard.steps(shard.FindOrCreate(1)), 0);
  }
  // A shard that goes gives its rows back.
  EXPECT_EQ(tight.used(), 0);
}

}  // namespace
}  // namespace ferry::ps

namespace ferry::ps {
namespace {

// Creation in steps (table_builder.h builds a large shard off the I/O thread): a declared table
// is pending until adopted: a second declaration of the same spec waits for it, another spec is
// refused, a request for it is told it is being created; a build given up (cancelled) gives its
// memory back and leaves no table.
TEST(TableRegistry, APendingTableIsComparedRefusedForUseAndCancellable) {
  TableRegistry tables(0, 1, /*memory_budget=*/int64_t{64} << 20);
  const TableSpec w = Dense("w", 1 << 20);  // 4 MiB
  bool pending = true;
  auto declared = tables.Declare(w, TableId("w"), 1, &pending);
  ASSERT_TRUE(declared.ok()) << declared.status();
  ASSERT_NE(*declared, nullptr);
  EXPECT_FALSE(pending);
  EXPECT_EQ(tables.budget().used(), int64_t{4} << 20);
  EXPECT_EQ(tables.pending(), 1u);

  auto again = tables.Declare(w, TableId("w"), 1, &pending);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, nullptr);
  EXPECT_TRUE(pending);
  auto other = tables.Declare(Dense("w", 8), TableId("w"), 1, &pending);
  EXPECT_EQ(other.status().code(), StatusCode::kAlreadyExists);
  auto find = tables.Find(TableId("w"), TableType::kDense);
  EXPECT_EQ(find.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(find.status().message().find("still being created"), std::string::npos) << find.status();

  std::atomic<bool> cancel{true};
  const Status built = tables.Build(**declared, 1, &cancel);
  EXPECT_EQ(built.code(), StatusCode::kCancelled) << built;
  EXPECT_EQ(tables.budget().used(), 0);
  tables.Forget(TableId("w"));
  EXPECT_EQ(tables.pending(), 0u);
  EXPECT_EQ(tables.Find(TableId("w")), nullptr);

  // Declared again, built and adopted: a table like any other.
  auto fresh = tables.Declare(w, TableId("w"), 1, &pending);
  ASSERT_TRUE(fresh.ok() && *fresh != nullptr);
  ASSERT_TRUE(tables.Build(**fresh, 1).ok());
  tables.Adopt(std::move(*fresh));
  EXPECT_TRUE(tables.Find(TableId("w"), TableType::kDense).ok());
  EXPECT_EQ(tables.pending(), 0u);
  EXPECT_EQ(tables.budget().used(), int64_t{4} << 20);
}

}  // namespace
}  // namespace ferry::ps
