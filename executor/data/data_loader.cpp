// PretrainingDataLoader: Megatron's MegatronPretrainingSampler order, dp-sliced micro-batches, resumable.
#include "executor/data/data_loader.h"

#include "base/user_error.h"

namespace megatune::executor::data {

PretrainingDataLoader::PretrainingDataLoader(std::shared_ptr<const SampleDataset> dataset,
                                             DataLoaderConfig config)
    : dataset_(std::move(dataset)), config_(config), consumed_samples_(config.consumed_samples) {
  if (!dataset_) throw std::invalid_argument("PretrainingDataLoader needs a dataset");
  if (config_.micro_batch_size < 1) {
    throw UserError("--micro-batch-size must be positive, got " + std::to_string(config_.micro_batch_size));
  }
  if (config_.data_parallel_size < 1 || config_.data_parallel_rank < 0 ||
      config_.data_parallel_rank >= config_.data_parallel_size) {
    throw UserError("data-parallel rank " + std::to_string(config_.data_parallel_rank) + " is outside the " +
                    std::to_string(config_.data_parallel_size) + " data-parallel ranks");
  }
  const int64_t block = config_.micro_batch_size * config_.data_parallel_size;
  if (config_.global_batch_size < block || config_.global_batch_size % block != 0) {
    throw UserError("--global-batch-size " + std::to_string(config_.global_batch_size) +
                    " is not a multiple of --micro-batch-size x data-parallel size = " +
                    std::to_string(block) + "; change one of them");
  }
  if (consumed_samples_ < 0 || consumed_samples_ % block != 0) {
    throw UserError("consumed samples " + std::to_string(consumed_samples_) +
                    " (from the checkpoint) is not a multiple of " + "micro-batch x data-parallel size = " +
                    std::to_string(block) + "; resume with the batch sizes the checkpoint was saved with");
  }
  if (consumed_samples_ > dataset_->num_samples()) {
    throw UserError("consumed samples " + std::to_string(consumed_samples_) +
                    " (from the checkpoint) lie past the " + std::to_string(dataset_->num_samples()) +
                    " samples of " + dataset_->description() +
                    "; resume with the same data, --train-iters and --global-batch-size");
  }
}

bool PretrainingDataLoader::next(MicroBatch& batch) {
  const int64_t mbs = config_.micro_batch_size;
  const int64_t block = mbs * config_.data_parallel_size;
  if (consumed_samples_ + block > dataset_->num_samples()) return false;
  const int64_t s = dataset_->sequence_length();
  batch.micro_batch_size = mbs;
  batch.sequence_length = s;
  batch.tokens.resize(static_cast<size_t>(mbs * s));
  batch.labels.resize(static_cast<size_t>(mbs * s));
  batch.loss_mask.resize(static_cast<size_t>(mbs * s));
  batch.sample_indices.resize(static_cast<size_t>(mbs));
  const int64_t first = consumed_samples_ + config_.data_parallel_rank * mbs;
  for (int64_t row = 0; row < mbs; ++row) {
    const int64_t sample = first + row;
    const size_t at = static_cast<size_t>(row * s);
    batch.sample_indices[static_cast<size_t>(row)] = sample;
    dataset_->get_sample(sample, batch.tokens.data() + at, batch.labels.data() + at,
                         batch.loss_mask.data() + at);
  }
  consumed_samples_ += block;
  return true;
}

int64_t PretrainingDataLoader::micro_batches_per_iteration() const {
  return config_.global_batch_size / (config_.micro_batch_size * config_.data_parallel_size);
}

int64_t PretrainingDataLoader::remaining_iterations() const {
  return (dataset_->num_samples() - consumed_samples_) / config_.global_batch_size;
}

}  // namespace megatune::executor::data
