#include "ferry/context.h"

#include "ferry/messages/transport.h"

namespace ferry {

std::shared_ptr<Context> Context::Create(int io_threads) {
  return std::shared_ptr<Context>(new Context(std::make_unique<Impl>(io_threads < 1 ? 1 : io_threads)));
}

Context::Context(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Context::~Context() = default;

}  // namespace ferry
