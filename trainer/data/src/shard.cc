#include "ferry/data/shard.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "random.h"

namespace ferry::data {

Status ShardSpec::Validate() const {
  if (num_shards < 1 || rank < 0 || rank >= num_shards) {
    return InvalidArgumentError("shard rank " + std::to_string(rank) + " of " + std::to_string(num_shards) +
                                ": need num_shards >= 1 and 0 <= rank < num_shards");
  }
  return Status::Ok();
}

int64_t ShardSize(int64_t num_examples, ShardSpec shard) {
  if (num_examples <= shard.rank) return 0;
  return (num_examples - shard.rank + shard.num_shards - 1) / shard.num_shards;
}

std::vector<int64_t> EpochPermutation(int64_t num_examples, int64_t epoch, const ShuffleOptions& options) {
  std::vector<int64_t> order(static_cast<size_t>(std::max<int64_t>(num_examples, 0)));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!options.shuffle) return order;
  internal::SplitMix64 rng(internal::HashPair(options.seed, static_cast<uint64_t>(epoch)));
  // Fisher–Yates, back to front.
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng.Below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

StatusOr<std::vector<int64_t>> EpochIndices(int64_t num_examples, ShardSpec shard, int64_t epoch,
                                            const ShuffleOptions& options) {
  FERRY_RETURN_IF_ERROR(shard.Validate());
  if (num_examples < 0)
    return InvalidArgumentError("EpochIndices: num_examples " + std::to_string(num_examples) + " < 0");
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(ShardSize(num_examples, shard)));
  if (!options.shuffle) {
    for (int64_t i = shard.rank; i < num_examples; i += shard.num_shards) mine.push_back(i);
    return mine;
  }
  const std::vector<int64_t> order = EpochPermutation(num_examples, epoch, options);
  for (int64_t p = shard.rank; p < num_examples; p += shard.num_shards) mine.push_back(order[static_cast<size_t>(p)]);
  return mine;
}

void AppendLeftShare(std::span<const int64_t> left_slice, int index, int present, std::vector<int64_t>* out) {
  const auto size = static_cast<int64_t>(left_slice.size());
  const int64_t begin = size * index / present, end = size * (index + 1) / present;
  out->insert(out->end(), left_slice.begin() + begin, left_slice.begin() + end);
}

std::span<const int64_t> StepSlice(std::span<const int64_t> order, int64_t step_in_epoch, int64_t steps_per_epoch,
                                   int64_t step_examples) {
  const int64_t first = step_in_epoch * step_examples;
  const int64_t n = step_in_epoch + 1 == steps_per_epoch ? static_cast<int64_t>(order.size()) - first : step_examples;
  return order.subspan(static_cast<size_t>(first), static_cast<size_t>(n));
}

std::vector<int64_t> StepBatch(int rank, std::span<const int> present,
                               std::span<const std::vector<int64_t>* const> orders, int64_t step_in_epoch,
                               int64_t steps_per_epoch, int64_t step_examples) {
  const std::span<const int64_t> own =
      StepSlice(*orders[static_cast<size_t>(rank)], step_in_epoch, steps_per_epoch, step_examples);
  std::vector<int64_t> batch(own.begin(), own.end());
  const int index = static_cast<int>(std::find(present.begin(), present.end(), rank) - present.begin());
  for (size_t w = 0; w < orders.size(); ++w) {
    if (std::find(present.begin(), present.end(), static_cast<int>(w)) != present.end()) continue;
    AppendLeftShare(StepSlice(*orders[w], step_in_epoch, steps_per_epoch, step_examples), index,
                    static_cast<int>(present.size()), &batch);
  }
  return batch;
}

}  // namespace ferry::data
