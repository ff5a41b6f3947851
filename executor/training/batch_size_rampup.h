// Megatron's batch-size ramp-up (--rampup-batch-size <start> <increment> <ramp-up samples>): the global batch
// size and micro-batch count of each iteration as a function of the samples consumed before it, as
// Megatron-Core's RampupBatchsizeNumMicroBatchesCalculator gives them, and the iteration count of a
// sample-based run (Megatron's update_train_iters).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace megatune::executor {

struct BatchSizeRampup {
  std::int64_t start_global_batch_size = 0;
  std::int64_t batch_size_increment = 0;
  std::int64_t rampup_samples = 0;
};

class MicroBatchCalculator {
 public:
  // Megatron's calculator for --global-batch-size `global_batch_size`, --micro-batch-size `micro_batch_size`
  // and `data_parallel_size` ranks, ramped up by `rampup` when set. Throws UserError (one line naming the
  // flags) where Megatron's constructor asserts: a non-positive size, a start above the global batch, an
  // increment that does not divide their difference, no increment at all (start = global batch), or a
  // constant global batch that micro-batch x data-parallel size does not divide.
  MicroBatchCalculator(std::int64_t global_batch_size, std::int64_t micro_batch_size,
                       std::int64_t data_parallel_size, std::optional<BatchSizeRampup> rampup = std::nullopt);

  // The global batch of the iteration that starts after `consumed_samples` samples (Megatron's
  // get_current_global_batch_size after update_num_microbatches(consumed_samples)).
  std::int64_t global_batch_size(std::int64_t consumed_samples) const;
  // Its micro-batches per data-parallel rank (get_num_microbatches); UserError naming the iteration's batch
  // when micro-batch x data-parallel size does not divide it (Megatron's consistency check).
  int num_microbatches(std::int64_t consumed_samples) const;
  // Iterations of a --train-samples run (Megatron's update_train_iters): the ramp-up's iterations while the
  // consumed samples are at most the ramp-up samples and the train samples, then whole final global batches
  // (a partial last one is dropped).
  std::int64_t train_iters_for_samples(std::int64_t train_samples) const;
  // Samples consumed after `iterations` iterations from the start.
  std::int64_t samples_after(std::int64_t iterations) const;
  // The first iteration (1-based) that runs the final --global-batch-size (1 without a ramp-up).
  std::int64_t first_final_iteration() const;
  // Checks every batch the first `train_iters` iterations use (the consistency check Megatron runs at each
  // iteration), refusing the first that micro-batch x data-parallel size does not divide.
  void check_batches(std::int64_t train_iters) const;

  bool ramps() const { return rampup_.has_value(); }
  const std::optional<BatchSizeRampup>& rampup() const { return rampup_; }
  std::int64_t final_global_batch_size() const { return global_batch_size_; }
  std::int64_t micro_batch_size() const { return micro_batch_size_; }
  std::int64_t data_parallel_size() const { return data_parallel_size_; }
  // The ramp in one line for --dry-run and the run's first lines, e.g. "batch-size ramp-up: global batch
  // 16 -> 64 by 16 over 96 samples (micro-batches 1 -> 4 per data-parallel rank; ...)"; "" without one.
  std::string describe() const;

 private:
  std::int64_t global_batch_size_, micro_batch_size_, data_parallel_size_;
  std::optional<BatchSizeRampup> rampup_;
  double rampup_samples_per_increment_ = 0.0;
};

}  // namespace megatune::executor
