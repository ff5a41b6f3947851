// Megatron's param_and_grad_buffer arithmetic for one region of a model chunk: each parameter's aligned
// offset, the buckets (closing after an entry group once they hold at least the bucket limit, each end
// padded to a multiple), and a data-parallel rank's shard of a bucket. The executor lays its gradient buffers
// out with it; the step program uses it for what a rank holds of FSDP's sharded gradients.
#pragma once
#include <cstdint>
#include <vector>

namespace megatune::layouts {

// One parameter in buffer order: its elements and its entry group (buckets close only between groups).
struct GradBufferItem {
  std::int64_t numel = 0;
  int group = 0;
};

// A bucket: a range of the region's buffer and the items in it.
struct GradBufferBucket {
  std::int64_t begin = 0, end = 0;      // elements [begin, end) of the region, end padded
  std::int64_t parameter_elements = 0;  // numel of its parameters, no padding
  int first_entry = 0, end_entry = 0;   // its items [first_entry, end_entry), in buffer order
  std::int64_t numel() const { return end - begin; }
};

struct GradBufferPlan {
  std::vector<std::int64_t> offsets;  // per item: its first element (kParameterAlignElements aligned)
  std::vector<int> bucket_of;         // per item: its bucket
  std::vector<GradBufferBucket> buckets;
  std::int64_t total_elements = 0;  // padding included
};

// Megatron's bucket limit: bucket_size_elements when set, else max(40M, 1M x the group's size); one bucket
// per region (no limit) unless the buckets overlap the backward.
std::int64_t grad_bucket_limit(std::int64_t bucket_size_elements, int group_size, bool overlap);
// Megatron's padding of a bucket's end: lcm(group size, 128) under the distributed optimizer, else none.
std::int64_t grad_bucket_end_multiple(int group_size, bool distributed_optimizer);

// The region's layout: items placed in order, each start aligned; a bucket closes after a group once its
// parameters reach `bucket_limit` elements (and after the last item), its end padded to `end_multiple`.
// Throws std::invalid_argument for a negative numel or a multiple below 1.
GradBufferPlan plan_grad_buffer(const std::vector<GradBufferItem>& items, std::int64_t bucket_limit,
                                std::int64_t end_multiple);

// The distributed optimizer's shard of a bucket held by rank `rank` of a group of `group_size`: numel /
// group_size elements from begin + rank * that.
std::int64_t grad_shard_elements(const GradBufferBucket& bucket, int group_size);
std::int64_t grad_shard_begin(const GradBufferBucket& bucket, int group_size, int rank);

// The elements of [begin, end) of the region that lie in rank `rank`'s shards of the plan's buckets.
std::int64_t elements_in_grad_shards(const GradBufferPlan& plan, int group_size, int rank, std::int64_t begin,
                                     std::int64_t end);

}  // namespace megatune::layouts
