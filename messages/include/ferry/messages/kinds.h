// ferry/messages/kinds.h — every message kind, one row each: what the schema's `Kind` enum
// (ferry.fbs) does not say about it. Both ends read the rows: VerifyHeader knows a kind by its
// row, CheckPayloadShape checks the frames its row names (wire.h), the server dispatches the
// kinds routed to it, the client reports the version of the replies that carry one and says what
// a slow answer waits for.
//
// Adding a kind: its value in ferry.fbs, its row in kKinds below and, for a request, its handler's
// row in the server (HandlerOf, ps/server/src/server.cc). Nothing else enumerates kinds: a value
// without a row is refused as unknown, Wire.EveryKindHasOneRow fails for it, and a request row
// without a handler stops the server's build (a static_assert beside its routes).
// Thread-safety: constants.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "ferry/messages/ferry_generated.h"

namespace ferry::wire {

// The payload frames a kind carries after its header (CheckPayloadShape checks them).
enum class Payload : uint8_t {
  kNone,              // none
  kSliceNames,        // none: its `slices` name the dense chunks it reads
  kSliceValues,       // one value frame per `slices` entry (the table's format; top-k frames for a top-k table)
  kIds,               // one frame of `num_ids` int64 ids
  kIdsAndRows,        // ids, then `num_ids` x `dim` values in the table's format
  kTablesIds,         // per `sparse` entry: its ids
  kTablesIdsAndRows,  // per `sparse` entry: its ids, then its rows
  kDoubles,           // one frame of `num_ids` float64 values
  kUnchecked,         // replies: the receiver checks them against its request
};

// Where a kind goes, and when a server takes it.
enum class Route : uint8_t {
  kBeforeHello,  // to a server, taken before the client's Hello (the handshake itself, Stats, 1.24 MoveAsk)
  kPeer,         // to a server, from another server of the job (1.21 Replicate, 1.22 Snapshot): no Hello, no
                 // worker's rank
  kWorker,       // to a server, from a worker that has said Hello: its rank and step are checked
  kReply,        // to a client (a server refuses it)
};

// What a server waits for before it answers (the client names it when an answer is slow).
enum class Wait : uint8_t {
  kNothing,
  kServer,      // nothing but itself: is it running, at that address?
  kStep,        // a sync pull: every worker's push of the step before; ssp: the slowest clock
  kAllWorkers,  // every worker to arrive (collectives)
};

struct KindInfo {
  Kind kind;
  uint16_t minor;        // the protocol minor version that added it (1.minor)
  Route route;
  Payload payload;
  bool reports_version;  // its reply's `version` is the lowest version of the parts served
  Wait wait;
  // 1.17: it names chunks or ids, placed by the client's map (Header placement_version), and a
  // server of another map refuses it whole as "moved" (PROTOCOL.md, "Placement versions").
  bool placed;
};

// clang-format off
inline constexpr KindInfo kKinds[] = {
  // kind                  minor route                payload                      version wait         placed
  {Kind::Hello,             0, Route::kBeforeHello, Payload::kNone,              false, Wait::kServer,     false},
  {Kind::Stats,             0, Route::kBeforeHello, Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::CreateTable,       0, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::PullDense,         0, Route::kWorker,      Payload::kSliceNames,        true,  Wait::kStep,       true},
  {Kind::PushDense,         0, Route::kWorker,      Payload::kSliceValues,       true,  Wait::kNothing,    true},
  {Kind::PushPullDense,     0, Route::kWorker,      Payload::kSliceValues,       true,  Wait::kStep,       true},
  {Kind::PullSparse,        0, Route::kWorker,      Payload::kIds,               true,  Wait::kStep,       true},
  {Kind::PushSparse,        0, Route::kWorker,      Payload::kIdsAndRows,        true,  Wait::kNothing,    true},
  {Kind::Clock,             0, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Barrier,           0, Route::kWorker,      Payload::kNone,              false, Wait::kAllWorkers, false},
  {Kind::AllReduce,         1, Route::kWorker,      Payload::kDoubles,           false, Wait::kAllWorkers, false},
  {Kind::Finish,            2, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Checkpoint,        3, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::CommitCheckpoint,  3, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Heartbeat,         3, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::PullSparseTables,  5, Route::kWorker,      Payload::kTablesIds,         true,  Wait::kStep,       true},
  {Kind::PushSparseTables,  5, Route::kWorker,      Payload::kTablesIdsAndRows,  true,  Wait::kNothing,    true},
  {Kind::Waiting,           8, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Changes,          14, Route::kBeforeHello, Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Placement,        17, Route::kWorker,      Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Replicate,        21, Route::kPeer,        Payload::kUnchecked,         false, Wait::kServer,     false},
  {Kind::Snapshot,         22, Route::kPeer,        Payload::kNone,              false, Wait::kServer,     false},
  {Kind::MoveAsk,          24, Route::kBeforeHello, Payload::kNone,              false, Wait::kNothing,    false},
  {Kind::Reply,             0, Route::kReply,       Payload::kUnchecked,         false, Wait::kNothing,    false},
  {Kind::Error,             0, Route::kReply,       Payload::kUnchecked,         false, Wait::kNothing,    false},
};
// clang-format on

namespace detail {
// kKinds' row of each enum value (-1: none), built once at compile time.
inline constexpr std::array<int16_t, 256> kKindRow = [] {
  std::array<int16_t, 256> row{};
  row.fill(-1);
  for (size_t i = 0; i < std::size(kKinds); ++i) row[static_cast<uint8_t>(kKinds[i].kind)] = static_cast<int16_t>(i);
  return row;
}();
constexpr bool OneRowEach() {
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    if (kKinds[i].kind == Kind::Invalid || kKindRow[static_cast<uint8_t>(kKinds[i].kind)] != static_cast<int16_t>(i)) {
      return false;
    }
  }
  return true;
}
static_assert(OneRowEach(), "a kind has two rows in kKinds, or Invalid has one");
}  // namespace detail

// The row of `kind`; nullptr for a kind this side does not know (VerifyHeader refuses it).
constexpr const KindInfo* FindKind(Kind kind) {
  const int16_t i = detail::kKindRow[static_cast<uint8_t>(kind)];
  return i < 0 ? nullptr : &kKinds[i];
}

}  // namespace ferry::wire
