// ferry-ps --bind: ports outside [0, 65535], non-numeric or negative ports are refused with an
// error (ZeroMQ alone would keep the low 16 bits and bind somewhere else), both by the checking
// function and by the ferry-ps binary itself.

#include <cstdio>
#include <string>
#include <tuple>
#include <utility>

#include <gtest/gtest.h>

#include "internal/bind_endpoint.h"
#include "support/ps_process.h"
#include "support/run_command.h"

namespace ferry::ps {
namespace {

TEST(BindEndpoint, AcceptsTcpPortsInRangeAndIpc) {
  for (const char* e : {"tcp://127.0.0.1:0", "tcp://127.0.0.1:7000", "tcp://0.0.0.0:65535", "tcp://*:1",
                        "tcp://127.0.0.1:*", "tcp://[::1]:7000", "tcp://lo:7000", "tcp://localhost:7000",
                        "ipc:///tmp/ferry-ps-0"}) {
    EXPECT_TRUE(CheckBindEndpoint(e).ok()) << e << ": " << CheckBindEndpoint(e);
  }
  EXPECT_EQ(BindAddress("tcp://localhost:7000"), "tcp://127.0.0.1:7000");
  EXPECT_EQ(BindAddress("tcp://[::1]:7000"), "tcp://[::1]:7000");
}

TEST(BindEndpoint, RefusesAHostNameSayingWhatToWrite) {
  // ZeroMQ alone fails with "No such device" for a name that is not an interface.
  Status s = CheckBindEndpoint("tcp://node-17.example:7000");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'node-17.example' is neither an IP address nor a network interface"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("tcp://0.0.0.0:PORT"), std::string::npos) << s;
}

TEST(BindEndpoint, FerryPsListensOnLoopbackForLocalhost) {
  ferry::test::ChildProcess ps(FERRY_PS_PATH, {"ferry-ps", "--bind", "tcp://localhost:0"});
  EXPECT_EQ(ps.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << "endpoint: '" << ps.endpoint() << "'";
}

TEST(BindEndpoint, RefusesBadPortsWithTheReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"tcp://127.0.0.1:65536", "port 65536 is above 65535"},
      {"tcp://127.0.0.1:70000", "port 70000 is above 65535"},
      {"tcp://127.0.0.1:99999999999999999999999", "is above 65535"},
      {"tcp://127.0.0.1:-1", "port '-1' is not a number"},
      {"tcp://127.0.0.1:http", "port 'http' is not a number"},
      {"tcp://127.0.0.1:70 00", "is not a number"},
      {"tcp://127.0.0.1:", "missing port number"},
      {"tcp://127.0.0.1", "missing :PORT"},
      {"tcp://:7000", "missing HOST"},
      {"ipc://", "empty ipc path"},
      {"udp://127.0.0.1:7000", "want tcp://HOST:PORT or ipc://PATH"},
      {"127.0.0.1:7000", "want tcp://HOST:PORT or ipc://PATH"},
  };
  for (const auto& [endpoint, why] : cases) {
    Status s = CheckBindEndpoint(endpoint);
    ASSERT_FALSE(s.ok()) << "accepted " << endpoint;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(endpoint), std::string::npos) << s;
    EXPECT_NE(s.message().find(why), std::string::npos) << s;
  }
}

// Runs `ferry-ps ARGS` for at most 10 s; returns its exit status and stderr+stdout.
std::pair<int, std::string> RunPsArgs(const std::string& args) {
  return ferry::test::RunCommand(std::string(FERRY_PS_PATH) + " " + args, 10);
}

// Runs `ferry-ps --bind endpoint`.
std::pair<int, std::string> RunPs(const std::string& endpoint) { return RunPsArgs("--bind '" + endpoint + "'"); }

TEST(FerryPsFlags, AnUnknownFlagIsCalledUnknownWhereverItStands) {
  // It used to say "--nope needs a value (or unknown flag)" when last on the line.
  for (const char* args : {"--nope", "--nope 1", "--rank 0 --nope"}) {
    auto [code, out] = RunPsArgs(args);
    EXPECT_EQ(code, 2) << args << ": " << out;
    EXPECT_NE(out.find("unknown flag --nope"), std::string::npos) << args << ": " << out;
    EXPECT_EQ(out.find("needs a value"), std::string::npos) << args << ": " << out;
  }
  auto [near_code, near] = RunPsArgs("--max-wait 5");
  EXPECT_EQ(near_code, 2) << near;
  EXPECT_NE(near.find("unknown flag --max-wait (did you mean --max-wait-s?)"), std::string::npos) << near;
  auto [code, out] = RunPsArgs("--rank");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--rank needs a value"), std::string::npos) << out;
}

TEST(BindEndpoint, FerryPsRefusesAPortAbove65535) {
  // Before the check, this bound port 70000 - 65536 = 4464 and ran until `timeout` killed it (124).
  auto [code, out] = RunPs("tcp://127.0.0.1:70000");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("port 70000 is above 65535"), std::string::npos) << out;
  EXPECT_EQ(out.find("listening"), std::string::npos) << out;

  std::tie(code, out) = RunPs("tcp://127.0.0.1:-1");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("is not a number"), std::string::npos) << out;
}

}  // namespace
}  // namespace ferry::ps
