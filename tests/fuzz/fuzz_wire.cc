// Fuzz target: the message verifier (ferry/messages/wire.h) on any bytes. An input is one
// multipart message (fuzz_input.h); the header frame goes through VerifyHeader, then the payload
// through CheckPayloadShape and a CreateTable spec through SpecFromWire, as a server does before
// it touches a table. Nothing here may crash, read out of bounds or overflow (ASan + UBSan).
#include <cstddef>
#include <cstdint>

#include <zmq.hpp>

#include "ferry/messages/wire.h"
#include "ferry/table_spec.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto frames = ferry::fuzz::SplitFrames(data, size);
  if (frames.empty()) return 0;
  zmq::message_t header(frames[0].data(), frames[0].size());
  const ferry::wire::Header* h = nullptr;
  if (!ferry::wire::VerifyHeader(header, &h).ok() || h == nullptr) return 0;
  std::vector<zmq::message_t> payload;
  for (size_t i = 1; i < frames.size(); ++i) payload.emplace_back(frames[i].data(), frames[i].size());
  (void)ferry::wire::CheckPayloadShape(*h, payload).ok();
  if (h->spec() != nullptr) {
    ferry::TableSpec spec;
    (void)ferry::wire::SpecFromWire(h->spec(), &spec).ok();
  }
  if (h->kind() == ferry::wire::Kind::Error) (void)ferry::wire::ErrorStatus(*h).ok();
  return 0;
}
