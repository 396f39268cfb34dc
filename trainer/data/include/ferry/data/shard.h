// ferry/data/shard.h — which examples each worker reads, and in what order, per epoch.
//
// The rule, for a dataset of N examples split over M workers:
//   1. The epoch order is a permutation of [0, N): the identity when shuffling is off, otherwise a
//      Fisher–Yates shuffle driven by a SplitMix64 stream seeded from (seed, epoch). Every worker
//      computes the same permutation, with no communication.
//   2. Position p of that order goes to worker p % M (round-robin, "strided" sharding).
// So every example is read by exactly one worker exactly once per epoch, shard sizes differ by at
// most one (ShardSize), and the orders are bitwise reproducible on every platform (integer-only
// arithmetic; no std::uniform_int_distribution, whose output is implementation-defined).
//
// Streaming sources that cannot be permuted (CriteoReader) use step 2 alone on line numbers.
//
// Sync training note: when N % M != 0 the first N % M workers hold one example more. A trainer
// that must run the same number of steps on every worker should plan
// ceil(ShardSize(N, {0, M}) / batch) steps and let a short shard run a smaller (possibly empty)
// last batch, or drop the remainder and accept that a few examples are skipped that epoch.
//
// Thread-safety: all functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ferry/status.h"

namespace ferry::data {

// This worker's part of the data: rank in [0, num_shards).
struct ShardSpec {
  int rank = 0;
  int num_shards = 1;

  // INVALID_ARGUMENT unless num_shards >= 1 and 0 <= rank < num_shards.
  Status Validate() const;
};

// How the epoch order is drawn.
struct ShuffleOptions {
  bool shuffle = true;  // false: ascending index order
  uint64_t seed = 0;    // with `epoch`, selects the permutation
};

// Number of examples shard `shard` gets out of `num_examples` (>= 0): those positions p with
// p % num_shards == rank, i.e. ceil((num_examples - rank) / num_shards). Requires a valid shard.
int64_t ShardSize(int64_t num_examples, ShardSpec shard);

// The example indices shard `shard` visits in epoch `epoch`, in visiting order (see the rule at
// the top). Size ShardSize(num_examples, shard). INVALID_ARGUMENT for an invalid shard or
// num_examples < 0. Cost: O(num_examples) time and memory when shuffling (each worker builds
// the whole permutation), O(shard size) otherwise.
StatusOr<std::vector<int64_t>> EpochIndices(int64_t num_examples, ShardSpec shard, int64_t epoch,
                                            const ShuffleOptions& options);

// The full epoch order (all shards interleaved): a permutation of [0, num_examples).
std::vector<int64_t> EpochPermutation(int64_t num_examples, int64_t epoch,
                                      const ShuffleOptions& options);

// A sync worker that left a job in progress (ferry-trainer --leave) reads no more: each step, the
// slice of its shard it would have read, `left_slice`, is split among the `present` workers that
// remain, in their rank order. Appends to `out` the part of the worker at `index` in that order:
// the contiguous positions [size * index / present, size * (index + 1) / present) of the slice.
// Together the workers that remain read each example of the slice once. Requires
// 0 <= index < present.
void AppendLeftShare(std::span<const int64_t> left_slice, int index, int present, std::vector<int64_t>* out);

// The slice of a shard's epoch order read at step `step_in_epoch` of an epoch of
// `steps_per_epoch` steps of `step_examples` each: positions [k * step_examples, (k + 1) *
// step_examples), and the epoch's last step takes what is left of the shard (a trainer plans
// ceil(smallest shard / step_examples) steps, so that is 1 .. step_examples + 1 examples).
std::span<const int64_t> StepSlice(std::span<const int64_t> order, int64_t step_in_epoch, int64_t steps_per_epoch,
                                   int64_t step_examples);

// What worker `rank` reads at step `step_in_epoch` (StepSlice), when only the workers in
// `present` (ascending; `rank` among them) take part in the step: its own slice, then its part
// (AppendLeftShare) of the slice of each worker of [0, orders.size()) not in `present`, in rank
// order. orders[w] is worker w's epoch order (EpochIndices); only those of `rank` and of the
// absent workers are read (the others may be null).
std::vector<int64_t> StepBatch(int rank, std::span<const int> present,
                               std::span<const std::vector<int64_t>* const> orders, int64_t step_in_epoch,
                               int64_t steps_per_epoch, int64_t step_examples);

}  // namespace ferry::data
