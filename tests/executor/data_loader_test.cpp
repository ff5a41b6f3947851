// Tests PretrainingDataLoader: Megatron's sample order, dp slicing, resume from consumed samples.
#include "executor/data/data_loader.h"

#include <gtest/gtest.h>

#include <set>

#include "base/user_error.h"

namespace megatune::executor::data {
namespace {

// Sample k holds tokens k*1000 + i, labels k*1000 + i + 1, mask 1.
class CountingDataset final : public SampleDataset {
 public:
  CountingDataset(int64_t samples, int64_t sequence_length)
      : samples_(samples), sequence_length_(sequence_length) {}
  int64_t num_samples() const override { return samples_; }
  int64_t sequence_length() const override { return sequence_length_; }
  void get_sample(int64_t index, int32_t* tokens, int32_t* labels, float* loss_mask) const override {
    for (int64_t i = 0; i < sequence_length_; ++i) {
      tokens[i] = static_cast<int32_t>(index * 1000 + i);
      labels[i] = static_cast<int32_t>(index * 1000 + i + 1);
      loss_mask[i] = 1.0f;
    }
  }
  std::string description() const override { return "counting dataset"; }

 private:
  int64_t samples_;
  int64_t sequence_length_;
};

TEST(PretrainingDataLoader, SingleRankReadsConsecutiveSamples) {
  auto dataset = std::make_shared<CountingDataset>(20, 3);
  PretrainingDataLoader loader(dataset, {.global_batch_size = 4, .micro_batch_size = 2});
  EXPECT_EQ(loader.micro_batches_per_iteration(), 2);
  MicroBatch batch;
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.sample_indices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{0, 1, 2, 1000, 1001, 1002}));
  EXPECT_EQ(batch.labels[5], 1003);
  EXPECT_EQ(batch.loss_mask.size(), 6u);
  ASSERT_TRUE(loader.next(batch));
  EXPECT_EQ(batch.sample_indices, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(loader.consumed_samples(), 4);
  EXPECT_EQ(loader.remaining_iterations(), 4);
}

TEST(PretrainingDataLoader, DataParallelRanksSliceEachBlock) {
  // Megatron: each block of mbs * dp consecutive indices, rank r takes [r*mbs, (r+1)*mbs).
  auto dataset = std::make_shared<CountingDataset>(48, 2);
  const int64_t dp = 3;
  std::vector<PretrainingDataLoader> loaders;
  for (int64_t rank = 0; rank < dp; ++rank) {
    loaders.emplace_back(dataset, DataLoaderConfig{.global_batch_size = 12,
                                                   .micro_batch_size = 2,
                                                   .data_parallel_rank = rank,
                                                   .data_parallel_size = dp});
  }
  std::set<int64_t> seen;
  MicroBatch batch;
  for (int step = 0; step < 4; ++step) {
    for (int64_t rank = 0; rank < dp; ++rank) {
      ASSERT_TRUE(loaders[static_cast<size_t>(rank)].next(batch));
      const int64_t first = step * 6 + rank * 2;
      EXPECT_EQ(batch.sample_indices, (std::vector<int64_t>{first, first + 1}));
      seen.insert(batch.sample_indices.begin(), batch.sample_indices.end());
    }
  }
  EXPECT_EQ(seen.size(), 24u);  // two iterations of 12 samples, none twice
  EXPECT_EQ(loaders[0].consumed_samples(), 24);
}

TEST(PretrainingDataLoader, ResumeContinuesExactly) {
  auto dataset = std::make_shared<CountingDataset>(64, 2);
  const DataLoaderConfig config{
      .global_batch_size = 8, .micro_batch_size = 2, .data_parallel_rank = 1, .data_parallel_size = 2};
  PretrainingDataLoader uninterrupted(dataset, config);
  MicroBatch batch;
  std::vector<int64_t> expected;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(uninterrupted.next(batch));
    if (i >= 4) expected.insert(expected.end(), batch.sample_indices.begin(), batch.sample_indices.end());
  }
  PretrainingDataLoader first(dataset, config);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(first.next(batch));
  DataLoaderConfig resumed_config = config;
  resumed_config.consumed_samples = first.consumed_samples();  // 16: two iterations
  EXPECT_EQ(resumed_config.consumed_samples, 16);
  PretrainingDataLoader resumed(dataset, resumed_config);
  std::vector<int64_t> got;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(resumed.next(batch));
    got.insert(got.end(), batch.sample_indices.begin(), batch.sample_indices.end());
  }
  EXPECT_EQ(got, expected);
}

TEST(PretrainingDataLoader, StopsBeforeAnIncompleteBlock) {
  auto dataset = std::make_shared<CountingDataset>(5, 2);
  PretrainingDataLoader loader(dataset, {.global_batch_size = 2, .micro_batch_size = 2});
  MicroBatch batch;
  EXPECT_TRUE(loader.next(batch));
  EXPECT_TRUE(loader.next(batch));
  EXPECT_FALSE(loader.next(batch));
  EXPECT_EQ(loader.consumed_samples(), 4);
}

TEST(PretrainingDataLoader, BadConfigurationsAreUserErrors) {
  auto dataset = std::make_shared<CountingDataset>(100, 2);
  EXPECT_THROW(PretrainingDataLoader(dataset, {.global_batch_size = 6, .micro_batch_size = 4}), UserError);
  EXPECT_THROW(PretrainingDataLoader(dataset, {.global_batch_size = 8, .micro_batch_size = 0}), UserError);
  EXPECT_THROW(
      PretrainingDataLoader(
          dataset,
          {.global_batch_size = 8, .micro_batch_size = 2, .data_parallel_rank = 2, .data_parallel_size = 2}),
      UserError);
  EXPECT_THROW(
      PretrainingDataLoader(dataset, {.global_batch_size = 8, .micro_batch_size = 2, .consumed_samples = 3}),
      UserError);
  EXPECT_THROW(PretrainingDataLoader(
                   dataset, {.global_batch_size = 8, .micro_batch_size = 2, .consumed_samples = 200}),
               UserError);
}

}  // namespace
}  // namespace megatune::executor::data
