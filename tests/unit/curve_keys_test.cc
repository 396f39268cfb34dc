// ferry/curve.h: a job's key folder is written owner-only and never over existing keys, and
// every way a key file can be wrong (too open, malformed, halves of different keypairs, a key
// for two workers, a missing rank) is refused naming the file and line.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "ferry/curve.h"
#include "support/temp_dir.h"

namespace ferry {
namespace {

class CurveKeys : public testing::Test {
 protected:
  void SetUp() override {
    if (!curve::Available()) GTEST_SKIP() << "this libzmq was built without CURVE";
    ASSERT_TRUE(curve::WriteJobKeys(dir_, 3).ok());
  }
  // Replaces the file's text, keeping it owner-only.
  void Rewrite(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::trunc) << text;
    chmod(path.c_str(), 0600);
  }
  std::string Read(const std::string& name) const {
    std::ifstream in(dir_ + "/" + name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  test::TempDir tmp_{"keys"};
  const std::string dir_ = (tmp_.path() / "keys").string();
};

TEST_F(CurveKeys, AFolderLoadsForServersAndEachWorker) {
  struct stat st {};
  ASSERT_EQ(stat(dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  for (const char* name : {"server.key", "server.pub", "workers.pub", "worker-0.key", "worker-2.key"}) {
    ASSERT_EQ(stat((dir_ + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
  auto server = curve::LoadServerKeys(dir_);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_EQ(server->workers.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    auto worker = curve::LoadClientKeys(dir_, r);
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_EQ(worker->server_public, server->server.public_key);
    EXPECT_EQ(worker->client.public_key, server->workers[static_cast<size_t>(r)]);
    EXPECT_EQ(curve::Encode(curve::Decode(worker->client.public_key)), worker->client.public_key);
  }
  EXPECT_NE(server->workers[0], server->workers[1]);
  EXPECT_EQ(curve::LoadClientKeys(dir_, 3).status().code(), StatusCode::kNotFound);
}

TEST_F(CurveKeys, ExistingKeysAreNeverOverwritten) {
  const std::string before = Read("server.key");
  const Status s = curve::WriteJobKeys(dir_, 3);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(Read("server.key"), before);
}

TEST_F(CurveKeys, ASecretKeyOthersMayReadIsRefused) {
  ASSERT_EQ(chmod((dir_ + "/worker-1.key").c_str(), 0644), 0);
  auto keys = curve::LoadClientKeys(dir_, 1);
  ASSERT_FALSE(keys.ok());
  EXPECT_EQ(keys.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(keys.status().message().find("mode 0644"), std::string::npos) << keys.status();
  EXPECT_NE(keys.status().message().find("chmod 600 " + dir_ + "/worker-1.key"), std::string::npos) << keys.status();
  ASSERT_EQ(chmod((dir_ + "/server.key").c_str(), 0640), 0);
  EXPECT_EQ(curve::LoadServerKeys(dir_).status().code(), StatusCode::kPermissionDenied);
}

TEST_F(CurveKeys, BrokenFilesAreNamedWithTheirLine) {
  const std::string key0 = Read("worker-0.key"), key1 = Read("worker-1.key");
  auto line = [](const std::string& text, const std::string& field) {
    const size_t at = text.find(field + " = ");
    return text.substr(at, text.find('\n', at) - at);
  };
  struct Case {
    const char* file;
    std::string text;
    const char* says;
  };
  const Case cases[] = {
      {"worker-0.key", "# comment\npublic-key = short\nsecret-key = short\n",
       "worker-0.key (public key): a CURVE key is 40"},
      {"worker-0.key", "hello there\n", "worker-0.key:1: want 'public-key = KEY'"},
      {"worker-0.key", line(key0, "public-key") + "\n" + line(key1, "secret-key") + "\n", "not the secret key's"},
      {"worker-0.key", line(key0, "public-key") + "\n", "want both a public-key and a secret-key line"},
      {"worker-0.key", key0 + line(key0, "public-key") + "\n", "public-key given twice"},
      {"server.pub", "", "no public-key line"},
      {"server.pub", "public-key = " + std::string(40, '~') + "\n", "is not Z85 text"},
      {"server.pub", "public-key = abc\n", "server.pub: a CURVE key is 40 Z85 characters, not 3"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    const std::string saved = Read(c.file);
    Rewrite(c.file, c.text);
    auto keys = curve::LoadClientKeys(dir_, 0);
    ASSERT_FALSE(keys.ok());
    EXPECT_NE(keys.status().message().find(c.says), std::string::npos) << keys.status();
    Rewrite(c.file, saved);
  }
  ASSERT_TRUE(curve::LoadClientKeys(dir_, 0).ok());
}

TEST_F(CurveKeys, TheWorkerListMustNameEachRankOnceWithItsOwnKey) {
  auto server = curve::LoadServerKeys(dir_);
  ASSERT_TRUE(server.ok());
  const auto& w = server->workers;
  const struct {
    std::string text;
    const char* says;
  } cases[] = {
      {"0 " + w[0] + "\n2 " + w[2] + "\n", "lists 2 workers but not worker 1"},
      {"0 " + w[0] + "\n1 " + w[0] + "\n", "workers 0 and 1 have the same key"},
      {"0 " + w[0] + "\n0 " + w[1] + "\n", "worker 0 listed twice"},
      {"x " + w[0] + "\n", "workers.pub:1: rank 'x' is not in [0, 65535]"},
      {"0\n", "workers.pub:1: want 'RANK KEY'"},
      {"# nobody\n", "lists no worker"},
      {"0 " + server->server.public_key + "\n", "a worker has the servers' key"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    Rewrite("workers.pub", c.text);
    auto keys = curve::LoadServerKeys(dir_);
    ASSERT_FALSE(keys.ok());
    EXPECT_NE(keys.status().message().find(c.says), std::string::npos) << keys.status();
  }
}

}  // namespace
}  // namespace ferry
