// ps/internal/thread_pool.h — fork-join parallel loops for big updates and pulls.
// Thread-safety: ParallelFor may be called by one thread at a time (the server's I/O thread).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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

  std::mutex mu_;
  std::condition_variable start_cv_;  // helpers wait for a new generation
  std::condition_variable done_cv_;   // the caller waits for pieces to finish
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t n_ = 0, piece_ = 0, pieces_ = 0;                      // guarded by mu_
  int64_t generation_ = 0;                                      // guarded by mu_
  int pending_ = 0;                                             // guarded by mu_
  bool stop_ = false;                                           // guarded by mu_
  std::vector<std::thread> workers_;
};

}  // namespace ferry::ps
