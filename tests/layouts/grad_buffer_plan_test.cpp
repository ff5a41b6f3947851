// layouts::plan_grad_buffer: aligned offsets, buckets closing after a group at the limit, padded bucket ends;
// the distributed optimizer's shards and the elements of a range inside one rank's shards.
#include "layouts/grad_buffer_plan.h"

#include <gtest/gtest.h>

#include <climits>

namespace megatune::layouts {
namespace {

TEST(GradBufferPlan, BucketsCloseAfterAGroupAndPadTheirEnds) {
  // Group 0 holds 110 elements (>= the limit of 100): its bucket closes, padded to 128.
  const GradBufferPlan plan = plan_grad_buffer({{100, 0}, {10, 0}, {50, 1}, {70, 2}}, 100, 128);
  EXPECT_EQ(plan.offsets, (std::vector<std::int64_t>{0, 128, 256, 320}));
  EXPECT_EQ(plan.bucket_of, (std::vector<int>{0, 0, 1, 1}));
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].begin, 0);
  EXPECT_EQ(plan.buckets[0].end, 256);
  EXPECT_EQ(plan.buckets[0].parameter_elements, 110);
  EXPECT_EQ(plan.buckets[1].begin, 256);
  EXPECT_EQ(plan.buckets[1].end, 512);  // the last item's 70 elements take 128
  EXPECT_EQ(plan.buckets[1].first_entry, 2);
  EXPECT_EQ(plan.buckets[1].end_entry, 4);
  EXPECT_EQ(plan.total_elements, 512);
  // A group never splits, whatever the limit.
  EXPECT_EQ(plan_grad_buffer({{100, 0}, {10, 0}}, 1, 1).buckets.size(), 1u);
  EXPECT_THROW(plan_grad_buffer({{-1, 0}}, 1, 1), std::invalid_argument);
  EXPECT_THROW(plan_grad_buffer({{1, 0}}, 1, 0), std::invalid_argument);
}

TEST(GradBufferPlan, ShardsSplitEachBucketEvenly) {
  const GradBufferPlan plan = plan_grad_buffer({{100, 0}, {10, 0}, {50, 1}, {70, 2}}, 100, 128);
  EXPECT_EQ(grad_shard_begin(plan.buckets[1], 2, 1), 384);
  EXPECT_EQ(grad_shard_elements(plan.buckets[1], 2), 128);
  EXPECT_THROW(grad_shard_begin(plan.buckets[0], 2, 2), std::out_of_range);
  // The second item [128, 138) lies in rank 1's half of bucket 0; the third [256, 306) in rank 0's of
  // bucket 1; the last [320, 390) across both halves of bucket 1 (rank 0's ends at 384).
  EXPECT_EQ(elements_in_grad_shards(plan, 2, 0, 128, 138), 0);
  EXPECT_EQ(elements_in_grad_shards(plan, 2, 1, 128, 138), 10);
  EXPECT_EQ(elements_in_grad_shards(plan, 2, 0, 256, 306), 50);
  EXPECT_EQ(elements_in_grad_shards(plan, 2, 0, 320, 390), 64);
  EXPECT_EQ(elements_in_grad_shards(plan, 2, 1, 320, 390), 6);
  EXPECT_EQ(elements_in_grad_shards(plan, 1, 0, 0, 512), 512);
}

TEST(GradBufferPlan, MegatronsLimitAndPadding) {
  EXPECT_EQ(grad_bucket_limit(0, 8, true), 40'000'000);
  EXPECT_EQ(grad_bucket_limit(0, 64, true), 64'000'000);
  EXPECT_EQ(grad_bucket_limit(1000, 8, true), 1000);
  EXPECT_EQ(grad_bucket_limit(1000, 8, false), INT64_MAX);
  EXPECT_EQ(grad_bucket_end_multiple(3, true), 384);
  EXPECT_EQ(grad_bucket_end_multiple(3, false), 1);
}

}  // namespace
}  // namespace megatune::layouts
