// ferry/cluster.h: the cluster as TF_CONFIG describes it, and every way TF_CONFIG can be wrong.
#include "ferry/cluster.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(TfConfig, ServersAreThePsListAndWorkersTheChiefThenTheWorkers) {
  const char* json = R"({"cluster": {"ps": ["ps-0.job.svc:2222", "tcp://127.0.0.1:2223"],
                                     "chief": ["chief-0:2222"], "worker": ["w-0:2222", "w-1:2222"]},
                         "task": {"type": "chief", "index": 0}})";
  auto c = ParseTfConfig(json);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->servers, (std::vector<std::string>{"tcp://ps-0.job.svc:2222", "tcp://127.0.0.1:2223"}));
  EXPECT_EQ(c->num_workers, 3);
  EXPECT_EQ(c->task_type, "chief");
  EXPECT_EQ(c->rank, 0);
  EXPECT_TRUE(c->bind.empty());
}

TEST(TfConfig, WithoutAChiefWorkerIndexIsTheRank) {
  auto c = ParseTfConfig(R"({"cluster": {"ps": ["a:1"], "worker": ["b:1", "c:1", "d:1"]},
                             "task": {"type": "worker", "index": 2}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_workers, 3);
  EXPECT_EQ(c->rank, 2);
}

TEST(TfConfig, AServerListensOnItsIpv4AddressOrOnEveryInterfaceForAName) {
  const char* cluster = R"("cluster": {"ps": ["ps-0.job.svc:2222", "127.0.0.1:7001"], "worker": ["w:1"]})";
  auto named = ParseTfConfig(std::string("{") + cluster + R"(, "task": {"type": "ps", "index": 0}})");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->rank, 0);
  EXPECT_EQ(named->bind, "tcp://0.0.0.0:2222");
  auto ip = ParseTfConfig(std::string("{") + cluster + R"(, "task": {"type": "ps", "index": 1}})");
  ASSERT_TRUE(ip.ok()) << ip.status();
  EXPECT_EQ(ip->rank, 1);
  EXPECT_EQ(ip->bind, "tcp://127.0.0.1:7001");
}

// Each malformed TF_CONFIG is refused with a message naming the part that is wrong.
TEST(TfConfig, RefusesWhatItCannotUseSayingWhere) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "not JSON"},
      {"[1, 2]", "not a JSON object"},
      {R"({"task": {"type": "worker", "index": 0}})", "cluster: missing"},
      {R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})",
       "cluster.ps: no parameter servers"},
      {R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})", "no \"chief\" or \"worker\""},
      {R"({"cluster": {"ps": ["a"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})",
       "cluster.ps[0]: 'a' has no port"},
      {R"({"cluster": {"ps": ["a:0"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})",
       "no port in [1, 65535]"},
      {R"({"cluster": {"ps": ["a:1", 7], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})",
       "cluster.ps[1]: is not"},
      {R"({"cluster": {"ps": "a:1", "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})",
       "cluster.ps: is not a list"},
      {R"({"cluster": {"ps": ["a:1"], "chief": ["c:1", "d:1"]}, "task": {"type": "chief", "index": 0}})",
       "at most one"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"], "evaluator": ["e:1"]}, )"
       R"("task": {"type": "worker", "index": 0}})",
       "no evaluator task"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"], "master": ["m:1"]}, "task": {"type": "worker", "index": 0}})",
       "cluster.master: unknown task type"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}})", "task: missing"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"index": 0}})", "task.type: missing"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": "0"}})",
       "task.index: missing, or not an integer"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "evaluator", "index": 0}})",
       "not one of ps, chief, worker"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 1}})",
       "task.index: 1 is outside cluster.worker (1 entries)"},
      {R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": -1}})", "task.index: -1"},
      // Each task at its own address (issue 35: two ps entries at one address were accepted).
      {R"({"cluster": {"ps": ["a:1", "b:1", "a:1"], "worker": ["c:1"]}, "task": {"type": "worker", "index": 0}})",
       "cluster.ps[2]: 'a:1' is listed twice (also cluster.ps[0])"},
      {R"({"cluster": {"ps": ["a:1", "tcp://a:1"], "worker": ["c:1"]}, "task": {"type": "ps", "index": 0}})",
       "cluster.ps[1]: 'tcp://a:1' is listed twice (also cluster.ps[0])"},
      {R"({"cluster": {"ps": ["a:1"], "chief": ["c:1"], "worker": ["a:1"]}, "task": {"type": "chief", "index": 0}})",
       "cluster.worker[0]: 'a:1' is listed twice (also cluster.ps[0])"},
  };
  for (const auto& [json, want] : cases) {
    auto c = ParseTfConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << json;
    EXPECT_NE(c.status().message().find("TF_CONFIG"), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find(want), std::string::npos) << "want '" << want << "' in: " << c.status();
  }
}

TEST(TfConfig, TheEnvironmentVariableIsReadWhenSet) {
  ::unsetenv("TF_CONFIG");
  auto none = ClusterFromEnvironment();
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ::setenv("TF_CONFIG", R"({"cluster": {"ps": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker", "index": 0}})",
           1);
  auto set = ClusterFromEnvironment();
  ::unsetenv("TF_CONFIG");
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_TRUE(set->has_value());
  EXPECT_EQ((*set)->servers, (std::vector<std::string>{"tcp://a:1"}));
}

}  // namespace
}  // namespace ferry
