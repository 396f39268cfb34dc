// ps/server/internal/thread_pool.h — fork-join parallel loops for big updates and pulls.
// Thread-safety: ParallelFor may be called by one thread at a time (the server's I/O thread).
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "ferry/mutex.h"


namespace ferry::ps {

class ThreadPool {
 public:
  // `threads` helpers in addition to the calling thread (0: the caller does all the work).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs fn(begin, end) over [0, n) in contiguous pieces of at least `grain`, the caller taking
  // a share; returns when every piece is done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);
  int helpers() const { return static_cast<int>(workers_.size()); }

 private:
  void Work(int index);

  Mutex mu_;
  CondVar start_cv_;  // helpers wait for a new generation
  CondVar done_cv_;   // the caller waits for pieces to finish
  const std::function<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t piece_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pieces_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace ferry::ps
