// ferry-trainer: one worker of a Ferry training job (or, with --local, the whole job in one
// process without servers — the reference). See `ferry-trainer --help` and trainer.h.
//
//   ferry-trainer --servers tcp://127.0.0.1:7470,tcp://127.0.0.1:7471 --rank 0 --num-workers 2
//                 --hidden 256,128 --optimizer adam --lr 0.001 --batch 64 --epochs 1
//   ferry-trainer --local --batch 128 --steps 500
#include <cstdio>
#include <memory>

#include "messages/internal/transport.h"
#include "ferry/client.h"
#include "ferry/data/fashion_mnist.h"
#include "trainer/trainer/device.h"
#include "trainer/trainer/options.h"
#include "trainer/trainer/trainer.h"

namespace {

int Fail(const char* what, const ferry::Status& s) {
  std::fprintf(stderr, "ferry-trainer: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ferry;
  auto parsed = trainer::ParseTrainerFlags(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "ferry-trainer: %s\n%s", parsed.status().message().c_str(), trainer::TrainerUsage().c_str());
    return 2;
  }
  const trainer::TrainerOptions& options = *parsed;
  transport::TuneAllocatorForLargeMessages();
  if (options.help) {
    std::printf("%s", trainer::TrainerUsage().c_str());
    return 0;
  }

  std::string choice;
  auto device = trainer::CreateDevice(options.device, options.gpu, &choice);
  if (!device.ok()) return Fail("device", device.status());
  std::printf("%s\n", choice.c_str());

  auto train = data::LoadFashionMnist(data::FashionMnistSplit::kTrain, options.data_dir);
  if (!train.ok()) return Fail("training data", train.status());
  auto test = data::LoadFashionMnist(data::FashionMnistSplit::kTest, options.data_dir);
  if (!test.ok()) return Fail("test data", test.status());

  std::unique_ptr<Client> client;
  if (!options.local) {
    ClientOptions co;
    co.servers = options.servers;
    co.rank = options.rank;
    co.num_workers = options.num_workers;
    auto c = Client::Connect(co);
    if (!c.ok()) return Fail("connect", c.status());
    client = std::move(*c);
  }

  trainer::Datasets ds{&*train, &*test};
  auto report = trainer::RunTraining(options, device->get(), client.get(), ds, {}, stdout);
  if (!report.ok()) return Fail("training", report.status());
  std::printf("done: %lld steps in %.2f s (%.0f examples/s on this worker)", static_cast<long long>(report->steps),
              report->wall_s, report->examples_per_sec);
  if (report->eval_accuracy >= 0) {
    std::printf("; test loss %.4f, accuracy %.4f", report->eval_loss, report->eval_accuracy);
  }
  std::printf("\n");
  return 0;
}
