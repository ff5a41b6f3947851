// Trainer's reported metrics: the iteration's loss over the data-parallel ranks (context-parallel token sums
// included), Megatron's load_balancing_loss and MTP losses, and the bookkeeping world reductions.
#include "executor/backend/recording_pause.h"
#include "executor/training/trainer.h"

namespace megatune::executor {

using layouts::OpPhase;

double Trainer::reported_loss(double& local) {
  // The last pipeline stage holds the losses; their mean over the data-parallel ranks is what Megatron logs.
  // Under context parallelism a micro-batch's loss is the sum of its CP ranks' token losses over the sum of
  // their counted tokens.
  bool holds_loss = false;
  double sum = 0.0;
  for (auto& chunk : chunks_)
    if (chunk->stage().has_loss) {
      holds_loss = true;
      const std::vector<double> losses = context_parallel_losses(*chunk);  // synchronizes
      for (double l : losses) sum += l;
      sum /= static_cast<double>(losses.size());
    }
  local = sum;
  if (communicator_.world_size() == 1) return sum;
  const bool counts = holds_loss && communicator_.rank(CommGroup::kTensor) == 0 &&
                      communicator_.rank(CommGroup::kContext) == 0;
  if (!counts) local = 0.0;
  return world_sum(local) / static_cast<double>(config_.data_parallel_size);
}

std::vector<double> Trainer::context_parallel_losses(GPTModel& chunk) {
  std::vector<double> losses = chunk.microbatch_losses();
  if (config_.context_parallel_size == 1) return losses;
  const std::size_t m = losses.size();
  std::vector<float> sums(2 * m);  // (loss sum, counted tokens) per micro-batch
  for (std::size_t i = 0; i < m; ++i) {
    sums[2 * i] = static_cast<float>(losses[i] * chunk.counted_tokens()[i]);
    sums[2 * i + 1] = static_cast<float>(chunk.counted_tokens()[i]);
  }
  RecordingPause pause(backend_);
  // The buffer holds the most micro-batches the trainer runs (a batch-size ramp-up runs fewer first).
  const Tensor used = flat_range(backend_, cp_loss_sums_, 0, static_cast<std::int64_t>(2 * m));
  backend_.upload(used, sums.data());
  communicator_.all_reduce(CommGroup::kContext, used, ReduceOp::kSum,
                           {"cp_loss_sum", -1, OpPhase::kOptimizer});
  backend_.download(used, sums.data());
  for (std::size_t i = 0; i < m; ++i) losses[i] = sums[2 * i + 1] > 0 ? sums[2 * i] / sums[2 * i + 1] : 0.0;
  return losses;
}

double Trainer::reported_load_balancing_loss() {
  const TransformerConfig& model = config_.model;
  if (!model.is_moe() || !model.router.has_aux_loss()) return -1.0;
  double sum = 0.0;
  for (auto& chunk : chunks_) sum += chunk->moe_load_balancing_loss();
  sum /= static_cast<double>(config_.batch.num_microbatches);
  int moe_layers = 0;
  for (int flag : model.moe_layers) moe_layers += flag != 0 ? 1 : 0;
  // Each TP rank's loss is its sequence shard's part of the micro-batch's (moe_layer.h): summed over TP,
  // averaged over the data-parallel ranks, as Megatron's tracker reduces it.
  if (communicator_.world_size() > 1)
    sum = world_sum(sum) / static_cast<double>(config_.gradient_reduction_size());
  return sum / static_cast<double>(moe_layers);
}

std::vector<double> Trainer::reported_mtp_losses() {
  // Megatron's MTPLossLoggingHelper: each MTP layer's loss, mean over micro-batches, averaged over dp-cp.
  std::vector<double> losses(config_.model.mtp_num_layers, 0.0);
  for (auto& chunk : chunks_) {
    const std::vector<double> own = chunk->mtp_losses();
    for (std::size_t i = 0; i < own.size(); ++i) losses[chunk->stage().first_mtp_layer + i] = own[i];
  }
  if (communicator_.world_size() == 1) return losses;
  const bool counts = communicator_.rank(CommGroup::kTensor) == 0;
  for (double& loss : losses)
    loss = world_sum(counts ? loss : 0.0) / static_cast<double>(config_.gradient_reduction_size());
  return losses;
}

double Trainer::world_sum(double value) { return world_reduce(value, ReduceOp::kSum); }

double Trainer::world_reduce(double value, ReduceOp op) {
  if (communicator_.world_size() == 1) return value;
  const float values[2] = {static_cast<float>(value), 0.0f};
  RecordingPause pause(backend_);
  backend_.upload(scalar_, values);
  communicator_.all_reduce(CommGroup::kWorld, flat_range(backend_, scalar_, 0, 1), op,
                           {"world_sum", -1, OpPhase::kOptimizer});
  float reduced[2];
  backend_.download(scalar_, reduced);
  return reduced[0];
}

}  // namespace megatune::executor
