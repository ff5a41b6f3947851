// plan_grad_buffer and the shard arithmetic of the distributed optimizer's bucket shards.
#include "layouts/grad_buffer_plan.h"

#include <algorithm>
#include <climits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "layouts/parameter_table.h"

namespace megatune::layouts {
namespace {

std::int64_t round_up(std::int64_t x, std::int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

}  // namespace

std::int64_t grad_bucket_limit(std::int64_t bucket_size_elements, int group_size, bool overlap) {
  if (!overlap) return INT64_MAX;
  return bucket_size_elements > 0 ? bucket_size_elements
                                  : std::max<std::int64_t>(40'000'000, 1'000'000LL * group_size);
}

std::int64_t grad_bucket_end_multiple(int group_size, bool distributed_optimizer) {
  return distributed_optimizer ? std::lcm<std::int64_t>(group_size, 128) : 1;
}

GradBufferPlan plan_grad_buffer(const std::vector<GradBufferItem>& items, std::int64_t bucket_limit,
                                std::int64_t end_multiple) {
  if (end_multiple < 1)
    throw std::invalid_argument("gradient buffer: bucket end multiple " + std::to_string(end_multiple) +
                                " is below 1");
  GradBufferPlan plan;
  const int n = static_cast<int>(items.size());
  plan.offsets.resize(n);
  plan.bucket_of.resize(n);
  std::int64_t cursor = 0;
  GradBufferBucket bucket;
  for (int i = 0; i < n; ++i) {
    if (items[i].numel < 0)
      throw std::invalid_argument("gradient buffer: parameter " + std::to_string(i) + " has numel < 0");
    plan.offsets[i] = cursor;
    cursor += aligned_elements(items[i].numel);
    bucket.parameter_elements += items[i].numel;
    plan.bucket_of[i] = static_cast<int>(plan.buckets.size());
    const bool group_ends = i + 1 == n || items[i + 1].group != items[i].group;
    if ((group_ends && bucket.parameter_elements >= bucket_limit) || i + 1 == n) {
      bucket.end_entry = i + 1;
      bucket.end = cursor = round_up(cursor, end_multiple);
      plan.buckets.push_back(bucket);
      bucket = GradBufferBucket{cursor, cursor, 0, i + 1, i + 1};
    }
  }
  plan.total_elements = cursor;
  return plan;
}

std::int64_t grad_shard_elements(const GradBufferBucket& bucket, int group_size) {
  return bucket.numel() / group_size;
}

std::int64_t grad_shard_begin(const GradBufferBucket& bucket, int group_size, int rank) {
  if (rank < 0 || rank >= group_size)
    throw std::out_of_range("rank " + std::to_string(rank) + " outside a data-parallel group of " +
                            std::to_string(group_size));
  return bucket.begin + rank * grad_shard_elements(bucket, group_size);
}

std::int64_t elements_in_grad_shards(const GradBufferPlan& plan, int group_size, int rank, std::int64_t begin,
                                     std::int64_t end) {
  std::int64_t inside = 0;
  for (const GradBufferBucket& b : plan.buckets) {
    const std::int64_t lo = grad_shard_begin(b, group_size, rank);
    const std::int64_t hi = lo + grad_shard_elements(b, group_size);
    inside += std::max<std::int64_t>(0, std::min(hi, end) - std::max(lo, begin));
  }
  return inside;
}

}  // namespace megatune::layouts
