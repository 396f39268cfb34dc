#include "internal/disk_readers.h"

namespace ferry::ps {

DiskReaders::DiskReaders(int threads, std::function<void()> notify) : notify_(std::move(notify)) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Read(); });
}

DiskReaders::~DiskReaders() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (auto& t : threads_) t.join();
}

void DiskReaders::Submit(std::unique_ptr<Job> job) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(job));
    ++in_flight_;
  }
  work_cv_.Signal();
}

std::vector<std::unique_ptr<DiskReaders::Job>> DiskReaders::TakeDone() {
  MutexLock lock(&mu_);
  in_flight_ -= static_cast<int64_t>(done_.size());
  return std::exchange(done_, {});
}

bool DiskReaders::WaitForDone(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (done_.empty()) {
    if (!done_cv_.WaitUntil(&mu_, deadline)) return !done_.empty();
  }
  return true;
}

int64_t DiskReaders::in_flight() const {
  MutexLock lock(&mu_);
  return in_flight_;
}

void DiskReaders::Read() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queue_.empty()) work_cv_.Wait(&mu_);
      if (stop_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    job->rows.resize(job->ids.size() * static_cast<size_t>(job->row_floats));
    job->steps.resize(job->ids.size());
    job->status = job->disk->Read(job->table_id, job->ids, job->rows.data(), job->steps.data(), &job->found);
    job->took = std::chrono::steady_clock::now() - start;
    {
      MutexLock lock(&mu_);
      done_.push_back(std::move(job));
    }
    done_cv_.SignalAll();
    notify_();
  }
}

}  // namespace ferry::ps
