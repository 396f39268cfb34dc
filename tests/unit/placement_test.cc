// Placement is stable (fixed values, independent of process and build) and balanced; table
// specs validate and parse.
#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ferry/table_spec.h"
#include "ferry/messages/placement.h"
#include "internal/init.h"

namespace ferry {
namespace {

TEST(Placement, TableIdIsFnv1a64OfTheName) {
  EXPECT_EQ(TableId(""), 14695981039346656037ull);
  EXPECT_EQ(TableId("a"), 0xaf63dc4c8601ec8cull);  // the published FNV-1a test vector
}

TEST(Placement, StableAcrossCalls) {
  // Fixed expectations: a change to the placement function changes these and breaks clusters
  // that mix old and new binaries, so it must be deliberate.
  EXPECT_EQ(placement::Mix64(0), 0xe220a8397b1dcdafull);
  for (int64_t id = 0; id < 1000; ++id) EXPECT_EQ(placement::IdServer(id, 7), placement::IdServer(id, 7));
}

TEST(Placement, DenseChunksBalancedWithinOne) {
  for (int servers = 1; servers <= 8; ++servers) {
    for (int64_t chunks : {1, 2, 3, 7, 64, 1000}) {
      std::vector<int> load(static_cast<size_t>(servers), 0);
      for (int64_t c = 0; c < chunks; ++c)
        ++load[static_cast<size_t>(placement::ChunkServer(TableId("t"), c, servers))];
      const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
      EXPECT_LE(*hi - *lo, 1) << servers << " servers, " << chunks << " chunks";
    }
  }
}

TEST(Placement, SparseIdsBalanced) {
  const int servers = 4;
  const int64_t n = 400000;
  std::vector<int64_t> load(servers, 0);
  // Sequential ids (the common case for vocabularies) must still spread evenly.
  for (int64_t id = 0; id < n; ++id) ++load[static_cast<size_t>(placement::IdServer(id, servers))];
  for (int64_t l : load) EXPECT_NEAR(static_cast<double>(l), n / servers, 0.01 * n / servers);
}

TEST(Placement, TheFirstMapKeepsTheRuleOfProtocol115ForServerCountsDividingTheSlots) {
  // Before slots (1.15 and earlier): an id on server mix64(id) mod S, chunk c of table t on
  // (mix64(t) mod S + c) mod S. A job of such a count keeps every row and chunk where it was.
  for (int servers : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 20, 24, 48}) {
    ASSERT_EQ(placement::kSlots % servers, 0) << servers;
    const placement::Placement first = placement::Placement::First(servers);
    for (int64_t id = -1000; id < 20000; id += 7) {
      const uint64_t h = placement::Mix64(static_cast<uint64_t>(id));
      const int old_rule = static_cast<int>(h % static_cast<uint64_t>(servers));
      ASSERT_EQ(placement::IdServer(id, servers), old_rule) << id;
      ASSERT_EQ(first.IdServer(id), old_rule) << id;
    }
    for (const char* name : {"w", "emb/user", "dense_0"}) {
      const uint64_t t = TableId(name);
      for (int64_t c : {0, 1, 2, 5039, 5040, 5041, 123456789}) {
        const int old_rule = static_cast<int>((placement::Mix64(t) % static_cast<uint64_t>(servers) +
                                               static_cast<uint64_t>(c)) % static_cast<uint64_t>(servers));
        ASSERT_EQ(placement::ChunkServer(t, c, servers), old_rule) << name << " chunk " << c;
        ASSERT_EQ(first.ChunkServer(t, c), old_rule) << name << " chunk " << c;
      }
    }
  }
}

TEST(Placement, TheFirstMapOfAnyCountIsTheFreeFunctionsAndBalancedToASlot) {
  for (int servers : {11, 13, 17, 100, 5040}) {
    const placement::Placement first = placement::Placement::First(servers);
    EXPECT_EQ(first.version(), 1u);
    for (int64_t id = 0; id < 5000; ++id) ASSERT_EQ(first.IdServer(id), placement::IdServer(id, servers));
    for (int64_t c = 0; c < 300; ++c) ASSERT_EQ(first.ChunkServer(7, c), placement::ChunkServer(7, c, servers));
    int lo = placement::kSlots, hi = 0;
    for (int r = 0; r < servers; ++r) lo = std::min(lo, first.SlotsOf(r)), hi = std::max(hi, first.SlotsOf(r));
    EXPECT_LE(hi - lo, 1) << servers;
  }
}

// Rows of `n` sequential ids whose server differs between a and b, over n.
double RowsMoved(const placement::Placement& a, const placement::Placement& b, int64_t n) {
  int64_t moved = 0;
  for (int64_t id = 0; id < n; ++id) moved += a.IdServer(id) != b.IdServer(id);
  return static_cast<double>(moved) / static_cast<double>(n);
}

TEST(Placement, AServerAddedTakesItsShareFromTheOthersAndNothingElseMoves) {
  placement::Placement p = placement::Placement::First(1);
  for (int servers = 1; servers < 24; ++servers) {
    auto grown = p.Grow();
    ASSERT_TRUE(grown.ok()) << grown.status();
    const placement::Placement next = *grown;
    EXPECT_EQ(next.version(), p.version() + 1);
    ASSERT_EQ(next.num_servers(), servers + 1);
    // Every slot that moved went to the new server; it got its fair share, the others kept the
    // floor or the ceiling of theirs.
    for (int s = 0; s < placement::kSlots; ++s) {
      if (next.SlotServer(s) != p.SlotServer(s)) {
        ASSERT_EQ(next.SlotServer(s), servers) << "slot " << s;
      }
    }
    const int moved = placement::Placement::SlotsMoved(p, next);
    EXPECT_EQ(moved, next.SlotsOf(servers));
    EXPECT_EQ(moved, placement::kSlots / (servers + 1));
    int lo = placement::kSlots, hi = 0;
    for (int r = 0; r <= servers; ++r) lo = std::min(lo, next.SlotsOf(r)), hi = std::max(hi, next.SlotsOf(r));
    EXPECT_LE(hi - lo, 1) << servers + 1 << " servers";
    // Rows: about 1/(S+1) of them move (the ideal), not the S/(S+1) a rule of "mod S" moves.
    const double rows = RowsMoved(p, next, 200000);
    EXPECT_NEAR(rows * (servers + 1), 1.0, 0.05) << servers << " -> " << servers + 1 << ": " << rows;
    p = next;
  }
}

TEST(Placement, AServerDrainedGivesItsSlotsToTheLeastLoadedAndNothingElseMoves) {
  const placement::Placement four = placement::Placement::First(4);
  auto drained = four.Drain(1);
  ASSERT_TRUE(drained.ok()) << drained.status();
  const placement::Placement three = *drained;
  EXPECT_EQ(three.version(), 2u);
  EXPECT_EQ(three.SlotsOf(1), 0);
  EXPECT_EQ(three.ActiveServers(), 3);
  EXPECT_EQ(three.num_servers(), 4);  // the ranks stay; rank 1 owns nothing
  for (int s = 0; s < placement::kSlots; ++s) {
    if (four.SlotServer(s) != 1) {
      ASSERT_EQ(three.SlotServer(s), four.SlotServer(s)) << "slot " << s;
    }
  }
  EXPECT_EQ(placement::Placement::SlotsMoved(four, three), placement::kSlots / 4);
  EXPECT_EQ(three.SlotsOf(0), placement::kSlots / 3);
  EXPECT_EQ(three.SlotsOf(2), placement::kSlots / 3);
  EXPECT_EQ(three.SlotsOf(3), placement::kSlots / 3);
  EXPECT_NEAR(RowsMoved(four, three, 200000) * 4, 1.0, 0.05);
  for (int64_t id = 0; id < 10000; ++id) ASSERT_NE(three.IdServer(id), 1);
  // Grown again, the new rank (4) takes a fair share; rank 1 stays empty.
  const placement::Placement back = *three.Grow();
  EXPECT_EQ(back.num_servers(), 5);
  EXPECT_EQ(back.SlotsOf(1), 0);
  EXPECT_EQ(back.SlotsOf(4), placement::kSlots / 4);
  EXPECT_NEAR(RowsMoved(three, back, 200000) * 4, 1.0, 0.05);
  // Refused: a rank that owns nothing, one out of range, the last one with slots.
  Status s = three.Drain(1).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("server 1 owns no slot of placement version 2"), std::string::npos) << s;
  EXPECT_EQ(three.Drain(7).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(three.Drain(-1).status().code(), StatusCode::kInvalidArgument);
  s = placement::Placement::First(1).Drain(0).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("the last one"), std::string::npos) << s;
}

// The most slots one server holds among any `window` consecutive slots (around the ring).
int MostInAWindow(const placement::Placement& p, int window) {
  int most = 0;
  for (int r = 0; r < p.num_servers(); ++r) {
    int in = 0;
    for (int s = 0; s < window; ++s) in += p.SlotServer(s) == r;
    most = std::max(most, in);
    for (int s = 0; s < placement::kSlots; ++s) {
      in += (p.SlotServer((s + window) % placement::kSlots) == r) - (p.SlotServer(s) == r);
      most = std::max(most, in);
    }
  }
  return most;
}

// A job that starts with S servers and adds one (not only growth one server at a time): the new
// server's slots are spread around the ring, so a table of S+1 chunks puts at most two on any
// server. Taking each donor's slots at an even pace along its own list put runs of S consecutive
// slots on the new server (10 of 11 after First(10).Grow(): a review found it).
TEST(Placement, AServerAddedToAFirstMapTakesSlotsSpreadAroundTheRing) {
  for (int servers = 2; servers <= 24; ++servers) {
    const placement::Placement first = placement::Placement::First(servers);
    auto grown = first.Grow();
    ASSERT_TRUE(grown.ok()) << grown.status();
    EXPECT_EQ(grown->SlotsOf(servers), placement::kSlots / (servers + 1)) << servers;
    EXPECT_EQ(placement::Placement::SlotsMoved(first, *grown), placement::kSlots / (servers + 1));
    EXPECT_LE(MostInAWindow(*grown, servers + 1), 2) << servers << " + 1 servers";
    auto again = grown->Grow();  // and once more
    ASSERT_TRUE(again.ok());
    EXPECT_LE(MostInAWindow(*again, servers + 2), 2) << servers << " + 2 servers";
  }
}

// A job whose first map gives slots to some of its servers (ferry-ps --active-servers): the
// others own none until Grow(rank) gives one a fair share, which moves only to it, about 1/(S+1)
// of the rows; drained again, the map is the first one's slots under a later version.
TEST(Placement, AServerOutsideTheFirstMapJoinsWithAFairShareAndLeavesAgain) {
  const placement::Placement two = placement::Placement::First(2, 3);
  EXPECT_EQ(two.version(), 1u);
  EXPECT_EQ(two.num_servers(), 3);
  EXPECT_EQ(two.ActiveServers(), 2);
  EXPECT_EQ(two.SlotsOf(2), 0);
  const placement::Placement first2 = placement::Placement::First(2);
  for (int s = 0; s < placement::kSlots; ++s) ASSERT_EQ(two.SlotServer(s), first2.SlotServer(s));
  auto grown = two.Grow(2);
  ASSERT_TRUE(grown.ok()) << grown.status();
  const placement::Placement three = *grown;
  EXPECT_EQ(three.version(), 2u);
  EXPECT_EQ(three.num_servers(), 3);  // no rank added: rank 2 took its share
  EXPECT_EQ(three.SlotsOf(2), placement::kSlots / 3);
  EXPECT_EQ(three.SlotsOf(0), placement::kSlots / 3);
  EXPECT_EQ(three.SlotsOf(1), placement::kSlots / 3);
  for (int s = 0; s < placement::kSlots; ++s) {
    if (three.SlotServer(s) != two.SlotServer(s)) ASSERT_EQ(three.SlotServer(s), 2) << "slot " << s;
  }
  EXPECT_NEAR(RowsMoved(two, three, 200000) * 3, 1.0, 0.05);
  EXPECT_LE(MostInAWindow(three, 3), 2);
  const placement::Placement back = *three.Drain(2);
  EXPECT_EQ(back.version(), 3u);
  EXPECT_EQ(back.SlotsOf(2), 0);
  EXPECT_EQ(back.ActiveServers(), 2);
  // Refused: a rank that owns slots, one out of range.
  Status s = three.Grow(1).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("server 1 owns slots of placement version 2"), std::string::npos) << s;
  s = two.Grow(3).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("server 3 is not one of the 3 servers"), std::string::npos) << s;
}

TEST(Placement, GrowingPastOneSlotAServerIsRefused) {
  auto p = placement::Placement::First(placement::kSlots - 1).Grow();
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->ActiveServers(), placement::kSlots);
  for (int r = 0; r < placement::kSlots; ++r) ASSERT_EQ(p->SlotsOf(r), 1) << r;
  const Status s = p->Grow().status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("no server can be added"), std::string::npos) << s;
}

TEST(Placement, InitialValuesIndependentOfServerCount) {
  TableSpec s;
  s.name = "w";
  s.shape = {100};
  s.init = InitType::kUniform;
  s.init_scale = 1.0f;
  s.seed = 3;
  std::vector<float> whole(100), parts(100);
  ps::InitDense(s, TableId("w"), 0, whole.data(), 100);
  ps::InitDense(s, TableId("w"), 0, parts.data(), 37);
  ps::InitDense(s, TableId("w"), 37, parts.data() + 37, 63);
  EXPECT_EQ(whole, parts);
  float lo = 1, hi = -1;
  for (float v : whole) lo = std::min(lo, v), hi = std::max(hi, v);
  EXPECT_LT(lo, -0.5f);
  EXPECT_GT(hi, 0.5f);
  EXPECT_GE(lo, -1.0f);
  EXPECT_LT(hi, 1.0f);
}

TEST(TableSpec, ParsesConsistency) {
  Consistency c;
  int32_t s = -1;
  ASSERT_TRUE(ParseConsistency("ssp:3", &c, &s).ok());
  EXPECT_EQ(c, Consistency::kSsp);
  EXPECT_EQ(s, 3);
  ASSERT_TRUE(ParseConsistency("sync", &c, &s).ok());
  EXPECT_EQ(c, Consistency::kSync);
  EXPECT_FALSE(ParseConsistency("ssp:", &c, &s).ok());
  EXPECT_FALSE(ParseConsistency("ssp:-1", &c, &s).ok());
  Status bad = ParseConsistency("eventual", &c, &s);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("eventual"), std::string::npos);
}

// What a Hello reply, a "moved" error or a Placement request carries (1.17) reads back as the
// map it was; anything else is refused, saying what is wrong.
TEST(Placement, FromOwnersRefusesAMalformedMap) {
  const placement::Placement grown = *placement::Placement::First(3).Drain(2);
  auto back = placement::Placement::FromOwners(grown.version(), grown.Owners(), 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version(), 2u);
  EXPECT_EQ(back->Owners(), grown.Owners());
  EXPECT_EQ(back->SlotsOf(2), 0);
  EXPECT_EQ(back->SlotsOf(0) + back->SlotsOf(1), placement::kSlots);
  for (int64_t id = 0; id < 2000; ++id) EXPECT_EQ(back->IdServer(id), grown.IdServer(id));

  std::vector<uint16_t> owners = grown.Owners();
  auto zero = placement::Placement::FromOwners(0, owners, 3);
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("version 0"), std::string::npos) << zero.status();
  owners.pop_back();
  auto shorter = placement::Placement::FromOwners(2, owners, 3);
  EXPECT_NE(shorter.status().message().find("lists 5039 slots, not 5040"), std::string::npos) << shorter.status();
  owners = grown.Owners();
  owners[4000] = 3;
  auto outside = placement::Placement::FromOwners(2, owners, 3);
  EXPECT_NE(outside.status().message().find("slot 4000 to server 3 of a job of 3"), std::string::npos)
      << outside.status();
  EXPECT_FALSE(placement::Placement::FromOwners(2, grown.Owners(), 0).ok());
  EXPECT_FALSE(placement::Placement::FromOwners(2, grown.Owners(), placement::kSlots + 1).ok());
}

TEST(TableSpec, ValidateNamesTheField) {
  TableSpec s;
  s.name = "w";
  EXPECT_NE(s.Validate().message().find("shape"), std::string::npos);
  s.shape = {4, 0};
  EXPECT_NE(s.Validate().message().find("shape[1]"), std::string::npos);
  s.shape = {4, 4};
  EXPECT_TRUE(s.Validate().ok());
  s.replicas_to_aggregate = 2;  // async table
  EXPECT_NE(s.Validate().message().find("replicas_to_aggregate"), std::string::npos);
  EXPECT_EQ(s.num_chunks(), 1);
  s.replicas_to_aggregate = 0;
  s.chunk_elems = 5;
  EXPECT_EQ(s.num_chunks(), 4);
}

}  // namespace
}  // namespace ferry
