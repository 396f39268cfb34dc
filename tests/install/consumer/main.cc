// A user's program against an installed Ferry: connects to the servers named on the command
// line, declares a dense and a sparse table, pushes and pulls, and checks what comes back.
// Exits 0 and prints "consumer: OK", or says what differed and exits 1.
#include <cstdio>
#include <string>
#include <vector>

#include <unistd.h>

#include "ferry/client.h"

namespace {

int Fail(const char* what, const ferry::Status& s) {
  std::fprintf(stderr, "consumer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  ferry::ClientOptions o;
  for (int i = 1; i < argc; ++i) o.servers.emplace_back(argv[i]);
  auto client = ferry::Client::Connect(o);
  if (!client.ok()) return Fail("connect", client.status());
  ferry::Client& c = **client;

  // Names of this process's own: several consumers may run against the same servers.
  const std::string tag = std::to_string(::getpid());
  const std::string w_name = "consumer_w_" + tag, emb_name = "consumer_emb_" + tag;
  ferry::TableSpec w;
  w.name = w_name;
  w.shape = {1000};
  w.chunk_elems = 300;  // spread over every server
  w.optimizer.learning_rate = 0.5f;
  if (auto s = c.Declare(w); !s.ok()) return Fail("declare dense", s);
  ferry::TableSpec emb;
  emb.name = emb_name;
  emb.type = ferry::TableType::kSparse;
  emb.dim = 2;
  emb.optimizer.learning_rate = 1.0f;
  if (auto s = c.Declare(emb); !s.ok()) return Fail("declare sparse", s);

  std::vector<float> grad(1000), values(1000);
  for (int i = 0; i < 1000; ++i) grad[i] = static_cast<float>(i);
  if (auto s = c.PushDense(w_name, grad, 0).wait(); !s.ok()) return Fail("push dense", s);
  if (auto s = c.PullDense(w_name, values, 1).wait(); !s.ok()) return Fail("pull dense", s);
  for (int i = 0; i < 1000; ++i) {
    if (values[i] != -0.5f * static_cast<float>(i)) {
      std::fprintf(stderr, "consumer: w[%d] = %g, expected %g\n", i, values[i], -0.5 * i);
      return 1;
    }
  }
  const std::vector<int64_t> ids = {5, 1 << 30};
  const std::vector<float> g = {1, 2, 3, 4};
  std::vector<float> rows(4);
  if (auto s = c.PushSparse(emb_name, ids, g, 0).wait(); !s.ok()) return Fail("push sparse", s);
  if (auto s = c.PullSparse(emb_name, ids, rows, 1).wait(); !s.ok()) return Fail("pull sparse", s);
  for (int i = 0; i < 4; ++i) {
    if (rows[i] != -g[i]) {
      std::fprintf(stderr, "consumer: row value %d = %g, expected %g\n", i, rows[i], -g[i]);
      return 1;
    }
  }
  std::printf("consumer: OK (%d servers)\n", c.num_servers());
  return 0;
}
