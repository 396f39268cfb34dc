#include "internal/thread_pool.h"

#include <algorithm>

namespace ferry::ps {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { Work(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  start_cv_.SignalAll();
  for (auto& t : workers_) t.join();
}

void ThreadPool::Work(int index) {
  int64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t begin, end;
    {
      MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) start_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      if (index >= pieces_) continue;  // nothing for this helper this time
      fn = fn_;
      begin = index * piece_;
      end = std::min(n_, begin + piece_);
    }
    (*fn)(begin, end);
    {
      MutexLock lock(&mu_);
      if (--pending_ == 0) done_cv_.Signal();
    }
  }
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t max_pieces = static_cast<int64_t>(workers_.size()) + 1;
  const int64_t pieces = std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, max_pieces);
  if (pieces == 1) {
    fn(0, n);
    return;
  }
  const int64_t piece = (n + pieces - 1) / pieces;
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    piece_ = piece;
    pieces_ = pieces;
    pending_ = static_cast<int>(pieces - 1);
    ++generation_;
  }
  start_cv_.SignalAll();
  fn(0, std::min(n, piece));  // the caller's share: piece 0
  MutexLock lock(&mu_);
  while (pending_ != 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
}

}  // namespace ferry::ps
