// Handlers of Checkpoint and CommitCheckpoint, and the file jobs that write them off the I/O
// thread.
#include "internal/server_impl.h"

#include <cstdio>
#include <filesystem>

#include "internal/checkpoint.h"

namespace ferry::ps {
namespace {

// A list of workers' steps from a request (`what` names it in errors): at most 65536, each in
// [-1, 2^62]; none when absent.
Status StepsFromWire(const flatbuffers::Vector<int64_t>* steps, const std::string& what, std::vector<int64_t>* out) {
  if (steps == nullptr) return Status::Ok();
  if (steps->size() > 65536) return InvalidArgumentError(what + " has more than 65536 entries");
  for (const int64_t w : *steps) {
    if (w < -1 || w > ps::kMaxStep) {
      return InvalidArgumentError(what + " holds " + std::to_string(w) + ", outside [-1, 2^62]");
    }
    out->push_back(w);
  }
  return Status::Ok();
}

}  // namespace

Status ServerImpl::CheckpointPossible() const {
  if (options_.checkpoint_dir.empty()) {
    return FailedPreconditionError(Who() + " was started without a checkpoint folder (ferry-ps --checkpoint-dir)");
  }
  if (job_req_) return UnavailableError(Who() + " is still busy with " + job_what_ + "; ask again once it is done");
  return Status::Ok();
}

Status ServerImpl::OnCheckpoint(Request& req) {
  const int64_t step = req.h()->step();
  if (const int other = req.h()->server_rank(); other != 0 && other != options_.rank) return StandInShard(req, other);
  FERRY_RETURN_IF_ERROR(CheckpointPossible());
  Status diverged = Status::Ok();  // the model has diverged: a checkpoint would hold it
  bool disk_tables = false;
  tables_.ForEach([&](const ps::Table& t) {
    if (diverged.ok()) diverged = Diverged(t);
    disk_tables = disk_tables || (t.sparse && t.sparse->has_disk());
  });
  FERRY_RETURN_IF_ERROR(diverged);
  // A sync checkpoint is a cut at one global step: every sync unit here must be at `step`.
  std::string off;
  ForEachSyncUnit([&](ps::Table& t, int64_t chunk, int64_t version, ps::SyncSlots&) {
    if (!off.empty() || version == step) return;
    off = "table '" + t.spec.name + "'" + (chunk >= 0 ? " chunk " + std::to_string(chunk) : "") + " is at step " +
          std::to_string(version);
  });
  if (!off.empty()) {
    return FailedPreconditionError(Who() + ": " + off + ", not " + std::to_string(step) +
                                   ": a sync checkpoint is a cut at one global step, taken after the workers' "
                                   "pull for that step and before their push of it");
  }
  const auto t0 = Clock::now();
  // A delta of this process's previous shard when the client committed that checkpoint last, the
  // chain is short enough, and what changed is a small enough share of a full shard. A server with
  // a disk tier writes full shards: such a table is copied whole (its RAM tier, and its store by
  // hard links), which is what a delta would hold of it.
  const bool deltas = options_.checkpoint_deltas > 0 && !disk_tables;
  const int64_t previous = req.h()->previous_step();
  std::optional<ps::DeltaOf> delta;
  {
    MutexLock lock(&job_mu_);
    // (A step saved again is no delta: it would overwrite the very file it is a delta of.)
    if (deltas && previous >= 0 && previous == saved_.step && step > previous &&
        saved_.deltas < options_.checkpoint_deltas &&
        static_cast<double>(saved_.chain_bytes + ps::DeltaBytes(tables_)) <=
            options_.checkpoint_delta_share * static_cast<double>(saved_.base_bytes)) {
      delta = ps::DeltaOf{saved_.step, saved_.file};
    }
    saved_.step = -1;  // until this one is on disk: the changes counted so far go into it
  }
  // The store is copied in the same pause as the RAM tiers (a consistent cut): its rows in RAM
  // are flushed to a file, and its files linked into the checkpoint folder.
  std::optional<ps::DiskStoreCopy> disk;
  if (disk_tables) {
    auto copy = ps::CopyDiskTier(*disk_tier_, options_.checkpoint_dir, options_.rank, options_.num_servers, step);
    if (!copy.ok()) return copy.status().WithContext(Who() + ": the checkpoint of step " + std::to_string(step));
    disk = std::move(*copy);
  }
  ps::ShardImage image = ps::SnapshotShard(tables_, delta ? &*delta : nullptr, deltas, disk ? &*disk : nullptr);
  // What it holds of each worker's steps; from a client that carries them to the manifest (1.25),
  // by table share, and the workers' steps it holds whole (else those of before: a manifest
  // without table_steps replays by these alone). The asking worker asks between its steps, after
  // its pushes, which this server has taken (a peer's requests are served in order): its steps
  // are whole.
  std::map<uint64_t, std::vector<int64_t>> table_steps;
  std::vector<int64_t> worker_steps = workers_.KnownDone();
  if (req.h()->minor() >= wire::kTableStepsSinceMinor) {
    table_steps = ps::TakenByTable(tables_, workers_.count());
    for (size_t r = 0; r < worker_steps.size(); ++r) {
      const bool asks = static_cast<int>(r) == req.h()->rank() && step >= worker_steps[r];
      if (workers_.pushed(static_cast<int>(r)) && !asks) {
        worker_steps[r] = ps::WholeStep(worker_steps[r], static_cast<int>(r), table_steps);
      }
    }
  }
  const int64_t snapshot_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
  const uint64_t id = req.h()->request_id();
  RunFileJob(std::move(req), "the checkpoint of step " + std::to_string(step),
             [this, step, id, snapshot_us, delta, image = std::move(image),
              map_version = tables_.placement().version(), disk_folder = disk ? disk->folder : std::string(),
              worker_steps = std::move(worker_steps),
              table_steps = std::move(table_steps)]() mutable -> StatusOr<zmq::message_t> {
               // Room first: the shards of the checkpoints this one's commit will remove.
               for (int64_t old :
                    ps::MakeRoom(options_.checkpoint_dir, options_.rank, options_.keep_checkpoints, disk_folder)) {
                 std::printf("ferry-ps %d: removed its shard of the checkpoint of step %lld to make room (it keeps "
                             "%d)\n",
                             options_.rank, static_cast<long long>(old), options_.keep_checkpoints);
               }
               const auto w0 = Clock::now();
               FERRY_ASSIGN_OR_RETURN(ps::ShardFile f,
                                      ps::WriteShardImage(options_.checkpoint_dir, options_.rank, options_.num_servers,
                                                          step, std::move(image)));
               // The shard in place names this copy alone: an earlier save's of the step goes.
               if (!disk_folder.empty()) ps::RemoveOtherDiskCopies(options_.checkpoint_dir, f.name, disk_folder);
               const double write_s = std::chrono::duration<double>(Clock::now() - w0).count();
               Count(kCheckpointsSaved);
               {
                 MutexLock lock(&job_mu_);
                 saved_.step = step;
                 saved_.file = f;
                 if (delta) {
                   ++saved_.deltas;
                   saved_.chain_bytes += f.bytes;
                 } else {
                   saved_ = {step, f, 0, f.bytes, 0};
                 }
               }
               const std::string kind = delta ? "a delta of step " + std::to_string(delta->step) : "full";
               std::printf("ferry-ps %d: checkpoint of step %lld: %s (%s), %.1f MB in %.3f s (serving paused %.1f "
                           "ms)\n",
                           options_.rank, static_cast<long long>(step), f.name.c_str(), kind.c_str(),
                           static_cast<double>(f.bytes) / 1e6, write_s, static_cast<double>(snapshot_us) / 1e3);
               std::fflush(stdout);
               flatbuffers::FlatBufferBuilder fbb(256);
               auto name = fbb.CreateString(f.name);
               auto tables = wire::TableStepsToWire(fbb, table_steps);
               std::vector<flatbuffers::Offset<wire::ShardFile>> files = {
                   wire::CreateShardFile(fbb, name, f.bytes, f.crc32, {}, tables)};
               auto vec = fbb.CreateVector(files);
               auto steps = fbb.CreateVector(worker_steps);  // what the image holds of each worker's steps
               wire::HeaderBuilder b = BeginReply(fbb, Kind::Checkpoint, id);
               b.add_version(step);
               b.add_shards(vec);
               b.add_worker_steps(steps);
               b.add_snapshot_us(snapshot_us);
               b.add_placement_version(map_version);  // 1.17: the map the shard was written under
               wire::FinishHeaderBuffer(fbb, b.Finish());
               return wire::ToFrame(fbb);
             });
  return Status::Ok();
}

// 1.20: a server that owns no slot holds nothing a checkpoint keeps, and may have left the job:
// server 0 writes its shard, empty, so that the manifest lists one shard per server as before
// (and every reader, older ones too, reads it). Written here on the I/O thread: a few bytes, while
// server 0's own shard may be on the file job's.
Status ServerImpl::StandInShard(Request& req, int rank) {
  const int64_t step = req.h()->step();
  if (options_.rank != 0) {
    return InvalidArgumentError(Who() + " was asked for the shard of server " + std::to_string(rank) +
                                ": only server 0 writes the shard of a server that owns no slot");
  }
  if (rank < 0 || rank >= options_.num_servers) {
    return InvalidArgumentError("no server " + std::to_string(rank) + " in a job of " +
                                std::to_string(options_.num_servers));
  }
  if (options_.checkpoint_dir.empty()) return CheckpointPossible();
  const placement::Placement& map = tables_.placement();
  if (const int slots = map.SlotsOf(rank); slots > 0) {
    return FailedPreconditionError("server " + std::to_string(rank) + " owns " + std::to_string(slots) +
                                   " slots of placement version " + std::to_string(map.version()) +
                                   ": it writes its own shard");
  }
  FERRY_ASSIGN_OR_RETURN(ps::ShardFile f, ps::WriteShardImage(options_.checkpoint_dir, rank, options_.num_servers,
                                                              step, ps::EmptyShard()));
  std::printf("ferry-ps %d: checkpoint of step %lld: %s, the shard of server %d, which owns no slot (empty)\n",
              options_.rank, static_cast<long long>(step), f.name.c_str(), rank);
  std::fflush(stdout);
  flatbuffers::FlatBufferBuilder fbb(256);
  std::vector<flatbuffers::Offset<wire::ShardFile>> files = {
      wire::CreateShardFile(fbb, fbb.CreateString(f.name), f.bytes, f.crc32)};
  auto vec = fbb.CreateVector(files);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::Checkpoint, req.h()->request_id());
  b.add_version(step);
  b.add_shards(vec);
  b.add_placement_version(map.version());
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Send(req, wire::ToFrame(fbb));
  return Status::Ok();
}

int64_t ServerImpl::WorkerStepKnown(int rank) const {
  const int64_t done = workers_.done(rank);
  if (done <= 0 || !workers_.pushed(rank)) return done;  // (a restored record is whole)
  return ps::WholeStep(done, rank, ps::TakenByTable(tables_, workers_.count()));
}

std::string ServerImpl::CheckpointMeaning(int64_t step) const {
  int sync = 0, other = 0;
  tables_.ForEach([&](const ps::Table& t) { ++(t.spec.consistency == Consistency::kSync ? sync : other); });
  const std::string at = std::to_string(step);
  if (other == 0) return "sync: every server at global step " + at;
  if (sync == 0) return "async/ssp: each server's tables as they were when it saved (trainer step " + at + ")";
  return "sync tables at global step " + at +
         " on every server; async/ssp tables as each server had them when it saved";
}

Status ServerImpl::OnCommitCheckpoint(Request& req) {
  const Header& h = *req.h();
  FERRY_RETURN_IF_ERROR(CheckpointPossible());
  FERRY_RETURN_IF_ERROR(SamePlacement(h));
  std::vector<ps::ShardFile> shards;
  // What the shards' lists expand to is bounded: a few bytes of a request can name one list of
  // steps for many shards or tables (a table counts as 8 steps: its map entry).
  constexpr int64_t kMaxEntries = int64_t{1} << 22;
  int64_t entries = 0;
  auto charge = [&](int64_t n) {
    entries += n;
    return entries <= kMaxEntries ? Status::Ok()
                                  : InvalidArgumentError("the shards' worker_steps and table_steps hold more than " +
                                                         std::to_string(kMaxEntries) + " entries in all");
  };
  if (h.shards()) {
    for (const auto* f : *h.shards()) {
      ps::ShardFile file{f->file() ? f->file()->str() : "", f->bytes(), f->crc32(), {}, {}, {}};
      // 1.13: what its server knew of each worker's steps
      FERRY_RETURN_IF_ERROR(charge(f->worker_steps() ? f->worker_steps()->size() : 0));
      FERRY_RETURN_IF_ERROR(StepsFromWire(f->worker_steps(), "a shard's worker_steps", &file.worker_steps));
      if (f->table_steps()) {  // 1.25: each async/ssp table's share on its server
        for (const auto* t : *f->table_steps()) {
          std::vector<int64_t> steps;
          FERRY_RETURN_IF_ERROR(StepsFromWire(t->steps(), "a shard's table_steps", &steps));
          if (!t->table_ids()) continue;
          for (const uint64_t table_id : *t->table_ids()) {
            FERRY_RETURN_IF_ERROR(charge(static_cast<int64_t>(steps.size()) + 8));
            if (!file.table_steps.try_emplace(table_id, steps).second) {
              return InvalidArgumentError("a shard's table_steps names table id " + std::to_string(table_id) +
                                          " twice");
            }
          }
        }
      }
      shards.push_back(std::move(file));
    }
  }
  FERRY_RETURN_IF_ERROR(ps::CheckShardList(h.step(), shards));
  std::vector<int64_t> worker_steps;  // (none from a 1.10 client: the manifest has none)
  FERRY_RETURN_IF_ERROR(StepsFromWire(h.worker_steps(), "worker_steps", &worker_steps));
  const int64_t step = h.step();
  const uint64_t id = h.request_id();
  RunFileJob(std::move(req), "the manifest of step " + std::to_string(step),
             [this, step, id, shards = std::move(shards), meaning = CheckpointMeaning(step),
              worker_steps = std::move(worker_steps),
              map = tables_.placement()]() mutable -> StatusOr<zmq::message_t> {
               // Each shard must be on disk as its server reported it.
               for (const auto& f : shards) {
                 const std::string path = options_.checkpoint_dir + "/" + f.name;
                 std::error_code ec;
                 const uintmax_t size = std::filesystem::file_size(path, ec);
                 if (ec || size != f.bytes) {
                   return FailedPreconditionError(Who() + ": " + path + (ec ? " is missing (" + ec.message() + ")" :
                                                  " has " + std::to_string(size) + " bytes, its server wrote " +
                                                  std::to_string(f.bytes)) +
                                                  ": do all servers share the checkpoint folder?");
                 }
               }
               // A delta shard's manifest entry names its chain (from the file's first block).
               for (auto& f : shards) {
                 FERRY_ASSIGN_OR_RETURN(f, ps::WithChain(options_.checkpoint_dir, std::move(f)));
               }
               FERRY_RETURN_IF_ERROR(
                   ps::WriteManifest(options_.checkpoint_dir, step, shards, meaning, options_.keep_checkpoints,
                                     worker_steps, &map));
               return wire::MakeReply(id, Kind::CommitCheckpoint, step);
             });
  return Status::Ok();
}

void ServerImpl::RunFileJob(Request req, std::string what, std::function<StatusOr<zmq::message_t>()> work) {
  job_req_ = std::move(req);
  job_what_ = std::move(what);
  job_thread_ = std::thread([this, work = std::move(work)] {
    StatusOr<zmq::message_t> reply = InternalError("the file job threw");
    try {
      reply = work();
    } catch (const std::exception& e) {
      reply = ResourceExhaustedError(Who() + ": " + e.what());
    }
    {
      MutexLock lock(&job_mu_);
      job_done_ = std::move(reply);
    }
    waker_.Notify();
  });
}

void ServerImpl::FinishFileJob() {
  std::optional<StatusOr<zmq::message_t>> done;
  {
    MutexLock lock(&job_mu_);
    done.swap(job_done_);
  }
  if (!done) return;
  job_thread_.join();
  Request req = std::move(*job_req_);
  job_req_.reset();
  if (done->ok()) return Send(req, std::move(**done));
  std::fprintf(stderr, "ferry-ps %d: %s failed: %s\n", options_.rank, job_what_.c_str(),
               done->status().message().c_str());
  SendError(req, done->status().WithContext(std::string(wire::KindName(req.h()->kind()))));
}

}  // namespace ferry::ps
