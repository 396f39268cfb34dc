// ps/server/internal/disk_readers.h — threads that read the disk tier's rows for the server's
// I/O thread (issue 37): a request whose rows are on disk waits while they are read here, and the
// I/O thread serves the others; each read done wakes it (`notify`), and it takes the reads done.
//
// Thread-safety: Submit, TakeDone and WaitForDone may be called from any thread (the server calls
// them from its I/O thread); a job is the readers' from Submit until TakeDone returns it.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "ferry/mutex.h"
#include "ferry/status.h"
#include "internal/disk_tier.h"

namespace ferry::ps {

class SparseShard;

class DiskReaders {
 public:
  // One batched read of a table's rows (DiskTier::Read).
  struct Job {
    // Set by the submitter.
    DiskTier* disk = nullptr;
    uint64_t table_id = 0;
    int64_t row_floats = 0;
    std::vector<int64_t> ids;
    SparseShard* shard = nullptr;  // the submitter's: where the rows go (SparseShard::EndReadAhead)
    uint64_t mark = 0;             // SparseShard::BeginReadAhead's
    void* owner = nullptr;         // the submitter's: what waits for it
    // Set by the reader.
    std::vector<float> rows;
    std::vector<int64_t> steps;
    std::vector<bool> found;
    Status status;
    std::chrono::steady_clock::duration took{};
  };

  // `threads` readers; `notify` is called (from a reader) after each job is done.
  DiskReaders(int threads, std::function<void()> notify);
  ~DiskReaders();  // the jobs not started are dropped; those being read are finished first
  DiskReaders(const DiskReaders&) = delete;
  DiskReaders& operator=(const DiskReaders&) = delete;

  void Submit(std::unique_ptr<Job> job);
  // The jobs done since the last call, in the order they were done.
  std::vector<std::unique_ptr<Job>> TakeDone();
  // Waits until a job is done (at most `timeout`); whether one is.
  bool WaitForDone(std::chrono::milliseconds timeout);
  // Jobs submitted and not yet taken back.
  int64_t in_flight() const;
  size_t threads() const { return threads_.size(); }

 private:
  void Read();

  const std::function<void()> notify_;
  mutable Mutex mu_;
  CondVar work_cv_;  // readers wait for jobs
  CondVar done_cv_;  // WaitForDone waits for a job done
  std::deque<std::unique_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Job>> done_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry::ps
