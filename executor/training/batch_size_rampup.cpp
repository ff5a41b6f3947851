// MicroBatchCalculator: Megatron-Core's constant and ramp-up micro-batch calculators.
#include "executor/training/batch_size_rampup.h"

#include <sstream>

#include "base/user_error.h"

namespace megatune::executor {

namespace {

std::string n(std::int64_t v) { return std::to_string(v); }

}  // namespace

MicroBatchCalculator::MicroBatchCalculator(std::int64_t global_batch_size, std::int64_t micro_batch_size,
                                           std::int64_t data_parallel_size,
                                           std::optional<BatchSizeRampup> rampup)
    : global_batch_size_(global_batch_size),
      micro_batch_size_(micro_batch_size),
      data_parallel_size_(data_parallel_size),
      rampup_(rampup) {
  if (global_batch_size_ <= 0)
    throw UserError("--global-batch-size must be positive, got " + n(global_batch_size_));
  if (micro_batch_size_ <= 0 || data_parallel_size_ <= 0)
    throw UserError("--micro-batch-size and the data-parallel size must be positive");
  const std::int64_t unit = micro_batch_size_ * data_parallel_size_;
  if (!rampup_) {
    if (global_batch_size_ % unit != 0)
      throw UserError("--global-batch-size " + n(global_batch_size_) +
                      " is not divisible by micro batch size (" + n(micro_batch_size_) +
                      ") times data parallel size (" + n(data_parallel_size_) + ")");
    return;
  }
  const BatchSizeRampup& r = *rampup_;
  const std::string flag = "--rampup-batch-size " + n(r.start_global_batch_size) + " " +
                           n(r.batch_size_increment) + " " + n(r.rampup_samples);
  if (r.start_global_batch_size <= 0)
    throw UserError(flag + ": the start batch size should be positive, got " + n(r.start_global_batch_size));
  if (r.batch_size_increment <= 0)
    throw UserError(flag + ": the batch size increment should be positive, got " + n(r.batch_size_increment));
  if (r.rampup_samples <= 0)
    throw UserError(flag +
                    ": the ramp-up samples should be positive (Megatron divides by their share per "
                    "increment), got " +
                    n(r.rampup_samples));
  const std::int64_t diff = global_batch_size_ - r.start_global_batch_size;
  if (diff < 0)
    throw UserError(flag + ": expected --global-batch-size (" + n(global_batch_size_) +
                    ") to be greater than or equal to the start batch size (" + n(r.start_global_batch_size) +
                    ")");
  if (diff % r.batch_size_increment != 0)
    throw UserError(flag + ": the global batch size interval (" + n(diff) +
                    ") is not divisible by the batch size increment (" + n(r.batch_size_increment) +
                    "); pick an increment that divides --global-batch-size minus the start");
  if (diff == 0)
    throw UserError(flag +
                    ": the start batch size equals --global-batch-size, a ramp-up of no increments "
                    "(Megatron divides by zero): drop --rampup-batch-size or start lower");
  // Megatron: rampup_samples / num_increments in floating point, the steps truncated from it.
  rampup_samples_per_increment_ =
      static_cast<double>(r.rampup_samples) / static_cast<double>(diff / r.batch_size_increment);
}

std::int64_t MicroBatchCalculator::global_batch_size(std::int64_t consumed_samples) const {
  if (!rampup_ || consumed_samples > rampup_->rampup_samples) return global_batch_size_;
  const auto steps =
      static_cast<std::int64_t>(static_cast<double>(consumed_samples) / rampup_samples_per_increment_);
  return rampup_->start_global_batch_size + steps * rampup_->batch_size_increment;
}

int MicroBatchCalculator::num_microbatches(std::int64_t consumed_samples) const {
  const std::int64_t batch = global_batch_size(consumed_samples),
                     unit = micro_batch_size_ * data_parallel_size_;
  if (batch % unit != 0)
    throw UserError("--rampup-batch-size: the global batch size " + n(batch) + " (after " +
                    n(consumed_samples) + " samples) is not divisible by micro-batch-size (" +
                    n(micro_batch_size_) + ") times data parallel size (" + n(data_parallel_size_) +
                    "); pick a start and increment that are multiples of " + n(unit));
  return static_cast<int>(batch / unit);
}

std::int64_t MicroBatchCalculator::train_iters_for_samples(std::int64_t train_samples) const {
  if (!rampup_) return train_samples / global_batch_size_;
  std::int64_t iterations = 0, consumed = 0;
  while (consumed <= rampup_->rampup_samples && consumed <= train_samples) {
    consumed += global_batch_size(consumed);
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_batch_size_;
  return iterations;
}

std::int64_t MicroBatchCalculator::samples_after(std::int64_t iterations) const {
  std::int64_t consumed = 0, i = 0;
  for (; i < iterations && rampup_ && consumed <= rampup_->rampup_samples; ++i)
    consumed += global_batch_size(consumed);
  return consumed + (iterations - i) * global_batch_size_;
}

std::int64_t MicroBatchCalculator::first_final_iteration() const {
  std::int64_t consumed = 0, iteration = 1;
  for (; global_batch_size(consumed) != global_batch_size_; ++iteration)
    consumed += global_batch_size(consumed);
  return iteration;
}

void MicroBatchCalculator::check_batches(std::int64_t train_iters) const {
  std::int64_t consumed = 0;
  for (std::int64_t i = 0; i < train_iters && rampup_ && consumed <= rampup_->rampup_samples; ++i) {
    num_microbatches(consumed);
    consumed += global_batch_size(consumed);
  }
  if (train_iters > 0) num_microbatches(consumed);
}

std::string MicroBatchCalculator::describe() const {
  if (!rampup_) return "";
  const std::int64_t unit = micro_batch_size_ * data_parallel_size_;
  std::ostringstream out;
  out << "batch-size ramp-up: global batch " << rampup_->start_global_batch_size << " -> "
      << global_batch_size_ << " in steps of " << rampup_->batch_size_increment << " over "
      << rampup_->rampup_samples << " samples ("
      << (global_batch_size_ - rampup_->start_global_batch_size) / rampup_->batch_size_increment
      << " increments of " << rampup_samples_per_increment_
      << " samples; micro-batches per data-parallel rank " << rampup_->start_global_batch_size / unit
      << " -> " << global_batch_size_ / unit << ")";
  return out.str();
}

}  // namespace megatune::executor
