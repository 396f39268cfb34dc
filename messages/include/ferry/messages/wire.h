// ferry/messages/wire.h — building and verifying Ferry messages (see PROTOCOL.md).
//
// A message is [header][payload frames...]. The header is one FlatBuffers `Header` (generated
// from ferry.fbs at build time); payloads are raw little-endian arrays in their own frames.
// Everything received goes through VerifyHeader and CheckPayloadShape before it is used.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <flatbuffers/flatbuffers.h>
#include <zmq.hpp>

#include "ferry/status.h"
#include "ferry/table_spec.h"
#include "ferry/messages/ferry_generated.h"

namespace ferry::wire {

inline constexpr uint16_t kMajor = 1;
// 1.1: AllReduce; 1.2: Finish, used/dropped/held_us in replies; 1.3: Checkpoint, CommitCheckpoint,
// the restored step and the next collective id in the Hello reply; 1.4: the FTRL optimizer (l1, l2,
// beta); 1.5: PullSparseTables and PushSparseTables (every sparse table of a step in one message
// per server), the row lifecycle fields of TableSpec; 1.6: compressed tables (TableSpec's wire and
// topk_ratio: 16-bit value frames, top-k frames of dense pushes); 1.7: the AdamW optimizer, and
// OptimizerSpec's hyperparameters by key (`hyper`: the catalogue's weight_decay and later ones);
// 1.8: Waiting (what a server holds a worker's requests for: the client's long-wait lines); 1.9:
// dense calls in pieces, the CreateTable reply's spec; 1.10: a push call in pieces that touches a
// sync table is applied whole (Header call, piece, pieces); 1.11: the worker process's incarnation
// (Header incarnation), by which a restarted worker takes its rank over from its predecessor;
// 1.12: a Barrier that starts the job (Header start), which server 0 refuses while another worker
// is training already; 1.13: Checkpoint's previous_step, by which a server may save only what
// changed since the checkpoint the client committed last (a delta shard); 1.14: Changes (the change
// feed: a reader's rows and chunks changed since a cursor), and Hello's `resumes` (a restarted
// worker's replayed async steps are skipped where a server had taken them); 1.15: TableSpec's
// disk_tier (a sparse table whose rows beyond max_rows go to the server's disk, not away); 1.16: ids
// and chunks placed by slots (ferry/messages/placement.h; the same servers as before for counts
// that divide 5,040, other servers for 11, 13, 17, ...); 1.17: placement versions (the map every
// placed request names, "moved" errors with the server's map, the map in the Hello reply, and
// Placement: a server adopts a new map, taking over its new slots from a checkpoint); 1.18: Finish's
// `leaves` (a worker leaves a job in progress: no sync step and no collective waits for it again) and
// Hello's `joins_at` (a worker takes part in sync steps from that step on); 1.19: Placement's
// `prepare` (a server reads a hand-over's checkpoint ahead, while the job trains); 1.20: servers that
// own no slot leave (the clients speak only to the servers that own slots, and server 0; Heartbeat's
// `placement_version`: the map the worker holds; Checkpoint's `server_rank`: server 0 writes an empty
// shard for a server that owns no slot); 1.21: replicas (Replicate: a server forwards the updates it
// applies to its backup, and answers the push once the backup has them; Stats' `digests`); 1.22:
// failover (Snapshot: a replacement server takes its state from its peers before it listens;
// Hello's `replication`: a client waits for the replacement and sends it what was not answered;
// Replicate's `incarnation`: the primary's, so that a replaced one's late updates are refused);
// 1.23: sync tables replicated (Replicate's `sync_ops`, `sync_counts`); 1.24: MoveAsk (a move asked
// of server 0 while the job runs, handed to the workers by a Barrier that `takes_moves`); 1.25: a
// checkpoint's replay floors by table (ShardFile's `table_steps`), and the workers' steps a server
// reports are those it holds whole (a step of which it took one table's push and not another's is
// not done); 1.26: a worker's leave asked while the job runs (MoveAsk's and the Barrier reply's
// `move_leave_worker`), the step a worker leaves before (Finish's `leaves_at`), and the workers that
// leave or left with their steps in every Hello reply (`left_ranks`, `left_at`); 1.27: a worker
// that left joins again while the job runs (a Hello's joins_at 2^62: its new process waits;
// MoveAsk's and the Barrier reply's `move_rejoin_worker`; `rejoin_ranks`, `rejoin_at` in server 0's
// Hello reply)
inline constexpr uint16_t kMinor = 27;
// The first minor whose servers take a worker that waits to join again (Hello's joins_at
// kWaitsToRejoin) and whose server 0 hands its join (MoveAsk's `move_rejoin_worker`).
inline constexpr uint16_t kRejoinsSinceMinor = 27;
// A Hello's joins_at for a worker that left and whose new process waits to join again (1.27).
inline constexpr int64_t kWaitsToRejoin = int64_t{1} << 62;
// The first minor whose server 0 takes a worker's leave asked (MoveAsk's `move_leave_worker`) and
// keeps the step each worker left before.
inline constexpr uint16_t kAskedLeavesSinceMinor = 26;
// The first minor whose clients carry each shard's `table_steps` from the Checkpoint reply to the
// CommitCheckpoint (a server answers an earlier client's Checkpoint with the steps of before).
inline constexpr uint16_t kTableStepsSinceMinor = 25;
// The first minor whose server 0 takes a MoveAsk and hands it to a Barrier that takes moves.
inline constexpr uint16_t kMoveAsksSinceMinor = 24;
// The first minor with placement versions: an earlier client cannot follow a moved map.
inline constexpr uint16_t kPlacementVersionsSinceMinor = 17;
// The first minor whose servers know a worker that leaves (Finish's `leaves`) or joins later (Hello's
// `joins_at`).
inline constexpr uint16_t kLeavesSinceMinor = 18;
// The first minor whose servers read a hand-over's checkpoint ahead (Placement's `prepare`).
inline constexpr uint16_t kPrepareSinceMinor = 19;
// The first minor whose server 0 writes the shard of a server that owns no slot (Checkpoint's
// `server_rank`), and whose servers hear which map each worker holds from its heartbeats.
inline constexpr uint16_t kMembersSinceMinor = 20;
// The first minor whose servers keep replicas (Replicate, Stats' `digests`).
inline constexpr uint16_t kReplicasSinceMinor = 21;
// The first minor whose servers recover from a peer (Snapshot) and say so in their Hello reply.
inline constexpr uint16_t kFailoverSinceMinor = 22;
// The most frames one message may carry (header + payloads); more is refused.
inline constexpr size_t kMaxFrames = 1 + 4096;
// A header larger than this is refused before the verifier runs.
inline constexpr size_t kMaxHeaderBytes = 1 << 20;

static_assert(std::endian::native == std::endian::little, "payload frames are little-endian arrays");

std::string_view KindName(Kind kind);

// Verifies one header frame: size, FlatBuffers verifier, file identifier, major version and a
// known kind (one with a row in kinds.h). On success `*out` points into `frame` (valid while the
// frame lives). A frame whose
// bytes are not 8-byte aligned (ZeroMQ keeps small messages inline) is first moved into an
// aligned copy, since FlatBuffers reads scalars in place.
// A header of another major version that passes the FlatBuffers verifier is refused with
// FAILED_PRECONDITION ("protocol version 2.0 ..., this side speaks 1.3") but `*out` is set
// too: every major keeps `kind`, `request_id`, `error_code` and `error_message` where they are,
// so the receiver can still match it to a request and answer or report it.
Status VerifyHeader(zmq::message_t& frame, const Header** out);

// How a table's value frames are coded (1.6), as the receiver knows it from the table's spec.
struct TableCoding {
  ferry::WireFormat wire = ferry::WireFormat::kF32;
  float topk_ratio = 0.0f;  // dense pushes: top-k frames
};
// The coding of table `table_id` (an unknown table: the default; the table check refuses it).
using CodingOf = std::function<TableCoding(uint64_t table_id)>;

// Checks that the payload frames match the header's counts for its kind (the frames its row in
// kinds.h names; a kind without a row: none): frame count, and each frame's size equal to count
// x element size (overflow-safe), where a value's size is its table's (`coding`; none: every
// table float32) and a dense push of a top-k table carries TopKFrameBytes. Table-specific checks
// (known table, chunk lengths, row width, top-k indices)
// are the receiver's.
Status CheckPayloadShape(const Header& h, std::span<const zmq::message_t> payload, const CodingOf& coding = nullptr);

// Copies a finished builder into a frame (headers are small; payloads are never copied here).
zmq::message_t ToFrame(const flatbuffers::FlatBufferBuilder& fbb);

// `text` as valid UTF-8, whatever bytes it holds: well-formed UTF-8 is kept, every other byte
// (and every control character but tab and newline) becomes "\xNN". Error texts and log lines
// quote what a peer sent (a table name, a file name); this keeps them printable and decodable
// (a Python client decodes them as str).
std::string Printable(std::string_view text);

// A finished Error header answering `request_kind`/`request_id` with `status` (its message made
// Printable). A "moved" answer (PROTOCOL.md "Placement versions") also carries the server's map:
// its version and the server of each slot (`owners`, empty otherwise).
zmq::message_t MakeError(uint64_t request_id, Kind request_kind, const Status& status,
                         uint64_t placement_version = 0, std::span<const uint16_t> owners = {});
// A finished Reply header with no extra fields.
zmq::message_t MakeReply(uint64_t request_id, Kind request_kind, int64_t version = 0);
// What a push or pull reply reports besides the version (protocol 1.2).
struct ReplyInfo {
  int64_t version = 0;  // min version over the parts served / pushed
  int64_t used = 0;     // push: parts whose gradient counted (applied, or aggregated for the open step)
  int64_t dropped = 0;  // push: parts whose gradient was late (the step had closed) and was dropped
  int64_t held_us = 0;  // pull: how long the server held it waiting for its step
};
zmq::message_t MakeReply(uint64_t request_id, Kind request_kind, const ReplyInfo& info);

// Status carried by an Error header (code + message made Printable; unknown codes become
// kUnknown).
Status ErrorStatus(const Header& h);

// TableSpec <-> wire. FromWire validates what it reads.
flatbuffers::Offset<wire::TableSpec> SpecToWire(flatbuffers::FlatBufferBuilder& fbb, const ferry::TableSpec& spec);
Status SpecFromWire(const wire::TableSpec* in, ferry::TableSpec* out);

// A shard's table_steps (1.25, ShardFile): by table id, steps by worker rank, the tables of one
// record listed together; none when empty.
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::TableSteps>>> TableStepsToWire(
    flatbuffers::FlatBufferBuilder& fbb, const std::map<uint64_t, std::vector<int64_t>>& table_steps);

}  // namespace ferry::wire
