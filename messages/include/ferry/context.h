// ferry/context.h — the transport context shared by servers and clients in one process.
//
// A Context owns the ZeroMQ context (its I/O threads). Servers and clients that talk over
// `inproc://` endpoints must share one Context; over tcp:// or ipc:// each may have its own.
// Thread-safety: a Context may be shared by any number of threads; it must outlive every server
// and client built on it (they hold a shared_ptr, so this is automatic).
#pragma once

#include <memory>

namespace ferry {

class Context {
 public:
  // io_threads: ZeroMQ background I/O threads (1 is enough below ~1 GB/s per process).
  static std::shared_ptr<Context> Create(int io_threads = 1);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  struct Impl;  // defined by the transport, opaque here
  Impl& impl() const { return *impl_; }

 private:
  explicit Context(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry
