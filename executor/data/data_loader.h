// PretrainingDataLoader: yields this data-parallel rank's micro-batches in Megatron's order
// (MegatronPretrainingSampler: consecutive global sample indices, each block of micro_batch_size *
// data_parallel_size sliced by dp rank), resumable from consumed_samples.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "executor/data/sample_dataset.h"

namespace megatune::executor::data {

struct MicroBatch {
  int64_t micro_batch_size = 0;
  int64_t sequence_length = 0;
  std::vector<int32_t> tokens;          // (micro_batch_size, sequence_length) row-major
  std::vector<int32_t> labels;          // (micro_batch_size, sequence_length)
  std::vector<float> loss_mask;         // (micro_batch_size, sequence_length), 1 = counts in the loss
  std::vector<int64_t> sample_indices;  // (micro_batch_size) global sample index of each row
};

struct DataLoaderConfig {
  int64_t global_batch_size = 0;  // --global-batch-size
  int64_t micro_batch_size = 0;   // --micro-batch-size
  int64_t data_parallel_rank = 0;
  int64_t data_parallel_size = 1;
  int64_t consumed_samples = 0;  // where to resume (the checkpoint's consumed samples)
};

class PretrainingDataLoader {
 public:
  // Throws UserError if global batch is not a multiple of micro batch * dp size, the rank is out of range
  // or consumed_samples is not a multiple of micro batch * dp size or lies past the dataset.
  PretrainingDataLoader(std::shared_ptr<const SampleDataset> dataset, DataLoaderConfig config);

  // Fills `batch` (buffers are reused) with the next micro-batch of this rank and advances the position by
  // micro_batch_size * data_parallel_size samples. Returns false (batch untouched) when fewer than that
  // remain in the dataset (Megatron drops the last incomplete block).
  bool next(MicroBatch& batch);

  // Samples consumed by all dp ranks together; after each full iteration a multiple of the global batch.
  // Store it in the checkpoint and pass it back as DataLoaderConfig::consumed_samples to resume.
  int64_t consumed_samples() const { return consumed_samples_; }
  int64_t micro_batches_per_iteration() const;  // global / (micro * dp)
  // Whole iterations the dataset still holds from the current position.
  int64_t remaining_iterations() const;
  const DataLoaderConfig& config() const { return config_; }
  const SampleDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const SampleDataset> dataset_;
  DataLoaderConfig config_;
  int64_t consumed_samples_ = 0;
};

}  // namespace megatune::executor::data
