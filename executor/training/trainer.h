// Trainer: one training iteration driven by the rank's schedule (forward/backward of each micro-batch),
// gradient reduction, global-norm clipping, AdamW with Megatron's LR schedule, NaN/inf skipping, and the
// checkpointed training state (model, optimizer, scheduler position, counters).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/model/gpt_model.h"
#include "executor/parallel/communicator.h"
#include "executor/training/lr_schedule.h"
#include "layouts/schedule.h"

namespace megatune::executor {

namespace checkpoint {
class CheckpointWriter;
class CheckpointReader;
}  // namespace checkpoint

struct OptimizerConfig {
  double weight_decay = 0.01;  // --weight-decay
  double beta1 = 0.9;          // --adam-beta1
  double beta2 = 0.999;        // --adam-beta2
  double eps = 1e-8;           // --adam-eps
  double clip_grad = 1.0;      // --clip-grad (0: no clipping)
};

struct TrainerConfig {
  TransformerConfig model;
  BatchShape batch;  // micro-batch, sequence, micro-batches per iteration
  RecomputeGranularity recompute = RecomputeGranularity::kNone;
  DType compute_dtype = DType::kBF16;
  OptimizerConfig optimizer;
  LrScheduleConfig lr;
  std::uint64_t seed = 1234;   // --seed: parameter initialization
  int data_parallel_size = 1;  // global batch = micro_batch * num_microbatches * dp
  std::int64_t global_batch_size() const {
    return batch.micro_batch * batch.num_microbatches * data_parallel_size;
  }
};

struct StepResult {
  double loss = 0.0;           // mean over the iteration's micro-batches of their mean token loss
  float grad_norm = 0.0f;      // global L2 norm before clipping
  double learning_rate = 0.0;  // the rate this iteration's update used
  bool skipped = false;        // non-finite gradients: no update
  double elapsed_s = 0.0;      // wall time of the iteration (backend synchronized)
};

class Trainer {
 public:
  // Sizes every buffer (model, optimizer state) in one pass, reserves the backend's arena once, then builds
  // and initializes the model from config.seed. The schedule must be the no-pipelining schedule of this
  // rank for config.batch.num_microbatches micro-batches.
  Trainer(const TrainerConfig& config, const layouts::RankSchedule& schedule, Backend& backend,
          Communicator& communicator);

  // One iteration over `microbatches` (config.batch.num_microbatches of them, in order).
  StepResult train_step(const std::vector<MicroBatch>& microbatches);

  // Checkpointed state: tensors "model.<param>", "optimizer.exp_avg.<param>", "optimizer.exp_avg_sq.<param>"
  // (fp32), and metadata iteration, consumed_samples, skipped_iterations, model_config.
  void save(checkpoint::CheckpointWriter& writer) const;
  // Restores what save() wrote; UserError when the checkpoint holds another model shape.
  void load(const checkpoint::CheckpointReader& reader);

  std::int64_t iteration() const { return iteration_; }
  std::int64_t consumed_samples() const { return consumed_samples_; }
  std::int64_t skipped_iterations() const { return skipped_iterations_; }
  // The rate the next iteration will use (Megatron logs this one after each step).
  double current_learning_rate() const { return schedule_lr_.lr(consumed_samples_); }
  GPTModel& model() { return *model_; }
  Backend& backend() { return backend_; }
  const TrainerConfig& config() const { return config_; }

 private:
  void build(bool sizing);
  TrainerConfig config_;
  layouts::RankSchedule schedule_;
  Backend& backend_;
  Communicator& communicator_;
  LearningRateSchedule schedule_lr_;
  std::unique_ptr<GPTModel> model_;
  Tensor exp_avg_, exp_avg_sq_;  // (1, total) fp32, laid out like the main parameters
  std::int64_t iteration_ = 0;
  std::int64_t consumed_samples_ = 0;
  std::int64_t skipped_iterations_ = 0;
};

}  // namespace megatune::executor

namespace megatune::executor {
// The arena a Trainer with `config` reserves on `backend`, per allocation label (Backend::arena_breakdown),
// computed in sizing mode: nothing is allocated and no kernel runs, so a SizingBackend gives the CUDA
// backend's figures on any machine. The backend must not have reserved its arena.
std::vector<ArenaUse> size_training_arena(const TrainerConfig& config, Backend& backend);
// The no-pipelining schedule (layouts::build_rank_schedule over one uniform stage) of m micro-batches.
layouts::RankSchedule single_stage_schedule(int num_layers, int num_microbatches);
}  // namespace megatune::executor
