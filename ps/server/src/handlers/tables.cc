// Handler of CreateTable: a table declared, made here at once or aside while the server serves.
#include "internal/server_impl.h"

#include <algorithm>
#include <cstdio>

namespace ferry::ps {

Status ServerImpl::OnCreateTable(Request& req) {
  TableSpec spec;
  FERRY_RETURN_IF_ERROR(wire::SpecFromWire(req.h()->spec(), &spec));
  FERRY_RETURN_IF_ERROR(ReplicaRefusal(spec));
  FERRY_RETURN_IF_ERROR(CheckRestoredHolds(spec.name));
  bool pending = false;
  auto declared = tables_.Declare(std::move(spec), req.h()->table_id(), workers_.count(), &pending,
                                  /*take_chunking=*/req.h()->minor() >= 9);
  if (!declared.ok()) {
    if (declared.status().code() == StatusCode::kResourceExhausted)
      LogRateLimited(declared.status().message() + "; refused");
    return declared.status();
  }
  std::unique_ptr<ps::Table> table = std::move(*declared);
  if (table == nullptr && !pending) {
    ReplyDeclared(req, *tables_.SpecOf(req.h()->table_id()));
    return Status::Ok();
  }
  if (table == nullptr) {  // being built: answered with it
    FERRY_RETURN_IF_ERROR(RoomToHold(req));
    req.held = true;
    builds_[req.h()->table_id()].waiting.push_back(std::move(req));
    return Status::Ok();
  }
  // Replication 2: the replica of the previous server's part of the table is made now, on this
  // thread (refused whole, the declaration too, when it does not fit its half of the budget).
  if (Replicating() && replicas_->Find(table->id) == nullptr) {
    Status s;
    try {
      s = replicas_->Create(table->spec, table->id, workers_.count());
    } catch (const std::bad_alloc&) {
      s = ResourceExhaustedError("out of memory");
    }
    if (!s.ok()) {
      tables_.Forget(table->id);
      return s.WithContext(Who() + ": table '" + table->spec.name + "': its replica of server " +
                           std::to_string(PrimaryRank()) + "'s part");
    }
  }
  const int64_t bytes = tables_.BuildBytes(*table);
  if (bytes < ps::kBuildAsideBytes) {
    if (Status s = tables_.Build(*table, workers_.count()); !s.ok()) {
      tables_.Forget(table->id);
      return s;
    }
    const TableSpec made = table->spec;
    tables_.Adopt(std::move(table));
    ReplyDeclared(req, made);
    return Status::Ok();
  }
  Building& b = builds_[table->id];
  b.started = Clock::now();
  b.bytes = bytes;
  b.table = std::move(table);
  req.held = true;
  b.waiting.push_back(std::move(req));
  builder_.Submit(b.table.get(), workers_.count());
  tables_being_created_.store(static_cast<int64_t>(builds_.size()), std::memory_order_relaxed);
  return Status::Ok();
}

void ServerImpl::ReplyDeclared(Request& req, const TableSpec& spec) {
  flatbuffers::FlatBufferBuilder fbb(512);
  auto wspec = wire::SpecToWire(fbb, spec);
  wire::HeaderBuilder b = BeginReply(fbb, Kind::CreateTable, req.h()->request_id());
  b.add_spec(wspec);
  wire::FinishHeaderBuffer(fbb, b.Finish());
  Send(req, wire::ToFrame(fbb));
}

Status ServerImpl::CheckRestoredHolds(const std::string& name) const {
  if (restored_tables_.empty() || std::ranges::binary_search(restored_tables_, name)) return Status::Ok();
  std::string held;
  for (const std::string& t : restored_tables_) held += (held.empty() ? "'" : ", '") + wire::Printable(t) + "'";
  return FailedPreconditionError("table '" + wire::Printable(name) + "' is not in the checkpoint of step " +
                                 std::to_string(restored_step_) + " this server restored, which holds " + held +
                                 ": a resumed job declares the tables it saved (another model needs another "
                                 "--checkpoint-dir, or servers started without --restore)");
}

void ServerImpl::FinishBuilds() {
  for (auto& [table, status] : builder_.TakeDone()) {
    auto it = builds_.find(table->id);
    if (it == builds_.end()) continue;  // cannot happen: every submitted table is in builds_
    Building b = std::move(it->second);
    builds_.erase(it);
    tables_being_created_.store(static_cast<int64_t>(builds_.size()), std::memory_order_relaxed);  // before replies
    const TableSpec made = b.table->spec;
    const std::string& name = made.name;
    const double seconds = std::chrono::duration<double>(Clock::now() - b.started).count();
    if (status.ok()) {
      tables_.Adopt(std::move(b.table));
      std::fprintf(stderr, "ferry-ps %d: created table '%s' (%lld MiB here) in %.1f s\n", options_.rank,
                   wire::Printable(name).c_str(), static_cast<long long>(b.bytes >> 20), seconds);
      for (Request& r : b.waiting) ReplyDeclared(r, made);
    } else {
      tables_.Forget(table->id);
      LogRateLimited("creating table '" + name + "' failed: " + status.message());
      for (Request& r : b.waiting) SendError(r, status.WithContext("CreateTable"));
    }
  }
}

}  // namespace ferry::ps
