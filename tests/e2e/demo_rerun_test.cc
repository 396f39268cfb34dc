// ferry-demo against servers that still hold the tables of an earlier run: it refuses with a
// message that names the tables and the two ways out (restart the servers, or --prefix), instead
// of training nothing and exiting 1 without a word; with --prefix it trains fresh tables.

#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "ferry/server.h"
#include "support/run_command.h"

namespace ferry {
namespace {

// Runs ferry-demo with `args` (at most 120 s); returns its exit status and stdout+stderr.
std::pair<int, std::string> RunDemo(const std::string& args) {
  return test::RunCommand(std::string(FERRY_DEMO_PATH) + " " + args, 120);
}

TEST(DemoRerun, SecondRunAgainstTheSameServersSaysWhyAndWhatToDo) {
  std::unique_ptr<Server> servers[2];
  std::string endpoints;
  for (int r = 0; r < 2; ++r) {
    ServerOptions o;
    o.bind = "tcp://127.0.0.1:0";
    o.rank = r;
    o.num_servers = 2;
    o.compute_threads = 1;
    auto s = Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    servers[r] = std::move(s).value();
    endpoints += (r ? "," : "") + servers[r]->endpoint();
  }
  const std::string args = "--servers " + endpoints + " --workers 2 --steps 60";

  auto [code, out] = RunDemo(args);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("trained 60 sync steps"), std::string::npos) << out;

  // The tables demo/w and demo/user_bias are still on the servers, trained to step 60.
  std::tie(code, out) = RunDemo(args);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("ALREADY_EXISTS"), std::string::npos) << out;
  EXPECT_NE(out.find("already hold tables demo/w and demo/user_bias"), std::string::npos) << out;
  EXPECT_NE(out.find("restart the ferry-ps processes"), std::string::npos) << out;
  EXPECT_NE(out.find("--prefix"), std::string::npos) << out;

  // Fresh tables beside the old ones: trains as the first run did.
  std::tie(code, out) = RunDemo(args + " --prefix run2/");
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("trained 60 sync steps"), std::string::npos) << out;
}

}  // namespace
}  // namespace ferry
