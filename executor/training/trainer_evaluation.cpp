// Trainer::evaluate: Megatron's forward_only pass over one global batch (validation and test loss).
#include <stdexcept>

#include "executor/backend/recording_pause.h"
#include "executor/training/trainer.h"

namespace megatune::executor {

EvaluationResult Trainer::evaluate(const std::vector<MicroBatch>& microbatches) {
  if (static_cast<int>(microbatches.size()) != microbatch_capacity_)
    throw std::invalid_argument("evaluate: wrong number of micro-batches");
  const RecordingPause pause(backend_);  // the step program holds training iterations only
  // Megatron evaluates whole --global-batch-size batches, also while the training batch ramps up.
  const int training_count = config_.batch.num_microbatches;
  for (auto& chunk : chunks_) chunk->set_num_microbatches(microbatch_capacity_);
  EvaluationResult result = evaluate_batches(microbatches);
  for (auto& chunk : chunks_) chunk->set_num_microbatches(training_count);
  return result;
}

EvaluationResult Trainer::evaluate_batches(const std::vector<MicroBatch>& microbatches) {
  const std::vector<MicroBatch>& local = context_parallel_share(microbatches);
  for (auto& chunk : chunks_) chunk->fp8_weights_changed();  // the last step updated them
  for (const layouts::StepItem& item : forward_items_) {
    if (item.kind == layouts::StepItemKind::kForward)
      run_forward(item, local.at(item.microbatch), /*evaluation=*/true);
    else if (item.kind == layouts::StepItemKind::kP2p)
      run_p2p(item, /*evaluation=*/true);
  }
  // Megatron's evaluate(): the last stage's (loss sum, token count) summed over micro-batches and the
  // data-parallel and context-parallel ranks (a CP rank's sums are its tokens'); each tensor-parallel rank
  // holds the same losses, rank 0 of the group counts them.
  EvaluationResult result;
  bool holds_loss = false;
  for (auto& chunk : chunks_) {
    if (!chunk->stage().has_loss) continue;
    holds_loss = true;
    const std::vector<double> means = chunk->microbatch_losses();  // synchronizes
    for (std::size_t i = 0; i < means.size(); ++i) {
      const double tokens = chunk->counted_tokens(static_cast<int>(i));
      result.loss_sum += means[i] * tokens;
      result.tokens += tokens;
    }
  }
  if (communicator_.world_size() == 1) return result;
  const bool counts = holds_loss && communicator_.rank(CommGroup::kTensor) == 0;
  result.loss_sum = world_sum(counts ? result.loss_sum : 0.0);
  result.tokens = world_sum(counts ? result.tokens : 0.0);
  return result;
}

}  // namespace megatune::executor
