// Requests waiting for the disk tier's rows (server_impl.h, "waiting for the disk tier's rows").
#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "internal/server_impl.h"

namespace ferry::ps {

bool ServerImpl::WaitForDisk(Request& req) {
  const Kind kind = req.h()->kind();
  // Neither changes nor reads a table: never behind anything.
  if (kind == Kind::Heartbeat || kind == Kind::Stats || kind == Kind::Waiting) return false;
  const bool sparse = kind == Kind::PullSparse || kind == Kind::PullSparseTables || kind == Kind::PushSparse ||
                      kind == Kind::PushSparseTables;
  auto behind = [&] { return !disk_waits_by_peer_.empty() && disk_waits_by_peer_.contains(std::string(req.peer())); };
  if (!sparse && !behind()) return false;
  std::vector<std::unique_ptr<ps::DiskReaders::Job>> jobs;
  if (sparse) {
    auto parts = SparseParts(*req.h());  // (a request it refuses is refused by its handler)
    if (parts.ok()) {
      for (const SparsePart& p : *parts) {
        ps::SparseShard& shard = *p.table->sparse;
        if (!shard.has_disk()) continue;
        std::vector<int64_t> scratch;
        const std::span<const int64_t> ids = View<int64_t>(req.payload[p.ids_frame], scratch);
        auto job = std::make_unique<ps::DiskReaders::Job>();
        // A failed look is met again, and answered, by the handler.
        if (!shard.ColdForReadAhead(ids, &job->ids).ok() || job->ids.empty()) continue;
        job->disk = disk_tier_.get();
        job->table_id = p.table->id;
        job->row_floats = shard.row_floats();
        job->shard = &shard;
        jobs.push_back(std::move(job));
      }
    }
  }
  if (jobs.empty() && !behind()) return false;
  int64_t bytes = 0;
  for (const auto& f : req.payload) bytes += static_cast<int64_t>(f.size());
  // At the bound, this thread waits for reads to end (and serves what waited for them).
  while (!disk_waits_.empty() &&
         (disk_waits_.size() >= kMaxDiskWaits || disk_wait_bytes_ + bytes > kMaxDiskWaitBytes)) {
    Count(kDiskTierIoThreadWaits);
    readers_->WaitForDone(std::chrono::milliseconds(100));
    FinishDiskReads();
  }
  if (jobs.empty() && !behind()) return false;
  auto wait = std::make_unique<DiskWait>();
  wait->pending = static_cast<int>(jobs.size());
  wait->bytes = bytes;
  int64_t rows = 0;
  for (auto& job : jobs) {
    job->mark = job->shard->BeginReadAhead();
    job->owner = wait.get();
    rows += static_cast<int64_t>(job->ids.size());
    readers_->Submit(std::move(job));
  }
  Count(kDiskTierRequestsHeld);
  Count(kDiskTierRowsReadAhead, rows);
  ++disk_waits_by_peer_[std::string(req.peer())];
  disk_wait_bytes_ += bytes;
  wait->req = std::move(req);
  disk_waits_.push_back(std::move(wait));
  disk_waiting_.store(static_cast<int64_t>(disk_waits_.size()), std::memory_order_relaxed);
  return true;
}

void ServerImpl::FinishDiskReads() {
  if (readers_ == nullptr) return;
  for (const auto& job : readers_->TakeDone()) {
    job->shard->EndReadAhead(job->mark, job->ids, job->rows.data(), job->steps.data(), job->found,
                             job->status.ok());  // (a failed read: its request's handler meets the failure)
    --static_cast<DiskWait*>(job->owner)->pending;
  }
  // In order of arrival; a connection's requests behind one still reading wait for it.
  absl::flat_hash_set<std::string> blocked;
  for (auto it = disk_waits_.begin(); it != disk_waits_.end();) {
    DiskWait& w = **it;
    std::string peer(w.req.peer());
    if (w.pending > 0 || blocked.contains(peer)) {
      blocked.insert(std::move(peer));
      ++it;
      continue;
    }
    std::unique_ptr<DiskWait> ready = std::move(*it);
    it = disk_waits_.erase(it);
    if (auto p = disk_waits_by_peer_.find(peer); --p->second == 0) disk_waits_by_peer_.erase(p);
    disk_wait_bytes_ -= ready->bytes;
    ready->req.read_ahead = true;
    DispatchAndAnswer(ready->req);  // (never waits again: disk_waits_ is not changed under this loop)
  }
  disk_waiting_.store(static_cast<int64_t>(disk_waits_.size()), std::memory_order_relaxed);
}

void ServerImpl::CheckDiskWaits(Clock::time_point now) {
  if (disk_waits_.empty()) return;
  const Clock::time_point oldest = disk_waits_.front()->req.arrived;
  if (now - oldest < std::chrono::seconds(10) || now - disk_wait_said_ < std::chrono::seconds(10)) return;
  disk_wait_said_ = now;
  const auto waited = std::chrono::duration_cast<std::chrono::seconds>(now - oldest).count();
  LogRateLimited(std::to_string(disk_waits_.size()) + " request(s) wait for rows being read from the disk tier " +
                 disk_tier_->path() + ", the oldest for " + std::to_string(waited) + " s (" +
                 std::to_string(readers_->in_flight()) + " read(s) in flight: a slow or hung disk?)");
}

}  // namespace ferry::ps
