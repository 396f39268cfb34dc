// Requests waiting for the disk tier's rows (server_impl.h, "waiting for the disk tier's rows").
#include <algorithm>
#include <cstdio>

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
        std::vector<int64_t> need;
        // A failed look is met again, and answered, by the handler.
        if (!shard.ColdForReadAhead(ids, &need).ok() || need.empty()) continue;
        // In as many pieces as there are readers (of kMinReadPiece ids at least), so that even one
        // request keeps several reads of the disk in flight.
        const size_t pieces = std::clamp<size_t>(need.size() / kMinReadPiece, 1, readers_->threads());
        const size_t per = (need.size() + pieces - 1) / pieces;
        for (size_t from = 0; from < need.size(); from += per) {
          auto job = std::make_unique<ps::DiskReaders::Job>();
          job->ids.assign(need.begin() + static_cast<std::ptrdiff_t>(from),
                          need.begin() + static_cast<std::ptrdiff_t>(std::min(need.size(), from + per)));
          job->disk = disk_tier_.get();
          job->table_id = p.table->id;
          job->row_floats = shard.row_floats();
          job->shard = &shard;
          // Its buffers made here, by this thread's allocator: a reader's own would keep their
          // memory (glibc gives each thread an arena of its own, trimmed only past 1 GiB here).
          job->rows.resize(job->ids.size() * static_cast<size_t>(job->row_floats));
          job->steps.resize(job->ids.size());
          job->found.assign(job->ids.size(), false);
          jobs.push_back(std::move(job));
        }
      }
    }
  }
  if (jobs.empty() && !behind()) return false;
  // What it holds while it waits: its payload and the rows read for it.
  int64_t bytes = 0, rows = 0;
  for (const auto& f : req.payload) bytes += static_cast<int64_t>(f.size());
  for (const auto& job : jobs) {
    rows += static_cast<int64_t>(job->ids.size());
    bytes += static_cast<int64_t>(job->ids.size()) * (job->row_floats * static_cast<int64_t>(sizeof(float)) + 16);
  }
  // At the bound, this thread waits for reads to end (and serves what waited for them).
  if (!disk_waits_.empty() &&
      (disk_waits_.size() >= kMaxDiskWaits || disk_wait_bytes_ + bytes > kMaxDiskWaitBytes)) {
    Count(kDiskTierIoThreadWaits);
    while (!disk_waits_.empty() &&
           (disk_waits_.size() >= kMaxDiskWaits || disk_wait_bytes_ + bytes > kMaxDiskWaitBytes)) {
      readers_->WaitForDone(std::chrono::milliseconds(100));
      FinishDiskReads();
    }
  }
  if (jobs.empty() && !behind()) return false;
  // Its place first (what may throw), then its reads: a read submitted always has its waiter.
  const std::string peer(req.peer());
  auto wait = std::make_unique<DiskWait>();
  DiskWait* waiting = wait.get();
  wait->bytes = bytes;
  wait->req = std::move(req);
  disk_waits_.push_back(std::move(wait));
  ++disk_waits_by_peer_[peer];
  disk_wait_bytes_ += bytes;
  disk_waiting_.store(static_cast<int64_t>(disk_waits_.size()), std::memory_order_relaxed);
  Count(kDiskTierRequestsHeld);
  Count(kDiskTierRowsReadAhead, rows);
  for (auto& job : jobs) {
    ps::SparseShard* shard = job->shard;
    const uint64_t mark = shard->BeginReadAhead();
    job->mark = mark;
    job->owner = waiting;
    try {
      readers_->Submit(std::move(job));
    } catch (...) {  // (out of memory: the request reads what it lacks on this thread)
      shard->EndReadAhead(mark, {}, nullptr, nullptr, {}, /*ok=*/false);
      continue;
    }
    ++waiting->pending;
  }
  // Behind its connection's request only, or its reads could not be submitted: served as soon as
  // nothing of its connection is before it (no read of its own will wake the loop for it).
  if (waiting->pending == 0) FinishDiskReads();
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
    disk_waiting_.store(static_cast<int64_t>(disk_waits_.size()), std::memory_order_relaxed);  // (before its reply)
    ready->req.read_ahead = true;
    try {
      DispatchAndAnswer(ready->req);  // (never waits again: disk_waits_ is not changed under this loop)
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ferry-ps %d: %s while serving a request that waited for the disk; continuing\n",
                   options_.rank, e.what());
    }
  }
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
