// Trainer: one training iteration of one rank, interpreting its pipeline schedule (forward/backward of each
// (micro-batch, model chunk), batched p2p of activations and gradients), then data-parallel gradient
// reduction, the tied-embedding and sequence-parallel gradient all-reduces, the global grad norm and
// clipping, AdamW with Megatron's LR schedule, the non-finite loss and gradient check (stop, or skip the
// step), and the checkpointed training state.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/model/gpt_model.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/data_parallel.h"
#include "executor/parallel/grad_buckets.h"
#include "executor/training/lr_schedule.h"
#include "executor/training/trainer_schedule.h"  // single_stage_schedule, activation_slots_per_chunk
#include "layouts/schedule.h"
#include "layouts/schedule_walker.h"

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
  // The Megatron flags that rebuild the model (layouts/model_flags.h), saved as checkpoint metadata
  // "model_args" so that a resume or a conversion needs no model flags; empty: not recorded.
  std::string model_args;
  BatchShape batch;  // micro-batch, sequence, micro-batches per iteration
  // --recompute-granularity / --recompute-method / --recompute-num-layers (a granularity alone: full is
  // uniform 1).
  layouts::RecomputeSettings recompute;
  DType compute_dtype = DType::kBF16;
  OptimizerConfig optimizer;
  LrScheduleConfig lr;
  std::uint64_t seed = 1234;   // --seed: parameter initialization
  int data_parallel_size = 1;  // global batch = micro_batch * num_microbatches * dp
  // --context-parallel-size: each micro-batch's sequences are split over the CP group (train_step takes them
  // whole); replicated weights' gradients are averaged over dp * cp.
  int context_parallel_size = 1;
  int gradient_reduction_size() const { return data_parallel_size * context_parallel_size; }
  // This rank's model chunks (pipeline stages it holds, in virtual-stage order); empty: the whole model.
  std::vector<StageSpan> chunks;
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce: a bucket's reduction starts once it is complete
  bool use_distributed_optimizer =
      false;                          // --use-distributed-optimizer: reduce-scatter, sharded AdamW, gather
  bool overlap_param_gather = false;  // --overlap-param-gather: the gathers finish before the next forward
  // Megatron FSDP's sharding strategy when it runs (--use-megatron-fsdp, --use-torch-fsdp2): FsdpDataParallel
  // (use_distributed_optimizer is then set for its sharded optimizer state); unset: DDP or dist-opt.
  std::optional<layouts::DataParallelSharding> fsdp;
  // --check-for-nan-in-loss-and-grad (Megatron's default on): a non-finite loss or gradient norm stops the
  // run with a UserError naming the iteration and the first rank whose own part is non-finite; off, a
  // non-finite gradient norm skips the update (counted in skipped_iterations).
  bool check_for_nan_in_loss_and_grad = true;
  // The rank's walk of the iteration (layouts::walk_rank_step): the items the trainer interprets. Absent:
  // the schedule's forwards, backwards and p2p, then the grad norm and AdamW (a single rank).
  std::optional<layouts::RankStep> step;
  // The rank's forward-only walk (layouts::walk_rank_forward) that evaluation interprets. Absent: the
  // forwards of `step`'s items (a single rank).
  std::optional<layouts::RankStep> forward_step;
  std::int64_t global_batch_size() const {
    return batch.micro_batch * batch.num_microbatches * data_parallel_size;
  }
};

struct StepResult {
  double loss = 0.0;           // mean over the iteration's micro-batches of their mean token loss
  float grad_norm = 0.0f;      // global L2 norm before clipping
  double learning_rate = 0.0;  // the rate this iteration's update used
  bool skipped = false;        // non-finite gradients (without the check): no update
  double elapsed_s = 0.0;      // wall time of the iteration (backend synchronized)
  // MoE with a load-balancing loss: Megatron's logged load_balancing_loss (the loss / its coefficient,
  // mean over micro-batches, MoE layers and data-parallel ranks); -1 otherwise.
  double load_balancing_loss = -1.0;
  // Multi-token prediction: Megatron's logged "mtp_k loss" per MTP layer (mean over micro-batches and
  // data-parallel ranks); empty without MTP.
  std::vector<double> mtp_losses;
};

// One evaluation iteration's loss over every data-parallel rank: summed token losses and counted tokens.
struct EvaluationResult {
  double loss_sum = 0.0;
  double tokens = 0.0;
};

// What Trainer::load restores besides the weights (Megatron's --no-load-optim, --finetune).
struct CheckpointLoadScope {
  bool optimizer = true;  // the Adam moments (false: they start at zero)
  bool progress = true;   // iteration, consumed and skipped counts (false: they start at zero)
};

class Trainer {
 public:
  // Sizes every buffer (model chunks, optimizer state) in one pass, reserves the backend's arena once, then
  // builds and initializes the model from config.seed. The schedule is this rank's (layouts::build_schedule)
  // for config.batch.num_microbatches micro-batches and config.chunks; the communicator's groups give the
  // tensor-, data- and pipeline-parallel peers.
  // size_only: stop after the sizing pass (the arena is counted in backend.arena_breakdown(), nothing is
  // reserved; such a trainer cannot train): see size_training_arena below.
  Trainer(const TrainerConfig& config, const layouts::RankSchedule& schedule, Backend& backend,
          Communicator& communicator, bool size_only = false);

  // One iteration over `microbatches` (config.batch.num_microbatches of them, in order: this data-parallel
  // rank's share of the global batch). Every rank of the job calls it; the loss is the iteration's mean over
  // the data-parallel ranks, reported on every rank.
  StepResult train_step(const std::vector<MicroBatch>& microbatches);

  // Megatron's batch-size ramp-up: the coming iterations run `count` micro-batches (at least 1, at most
  // the config.batch.num_microbatches the trainer was built for: its buffers and activation slots) under
  // this rank's `schedule` for that count and, in a parallel run, its walk `step` (layouts::walk_rank_step
  // at that count). Between iterations only; the loss averaging, the consumed samples and the global batch
  // follow. Evaluation keeps the full count (Megatron evaluates whole --global-batch-size batches).
  void set_num_microbatches(int count, const layouts::RankSchedule& schedule,
                            const std::optional<layouts::RankStep>& step);
  int num_microbatches() const { return config_.batch.num_microbatches; }
  int microbatch_capacity() const { return microbatch_capacity_; }

  // Forward only over `microbatches` (this data-parallel rank's share of one global batch:
  // microbatch_capacity() of them; evaluation, no gradient, no update), interpreting the forward-only walk.
  // Every rank of the job calls it; the result, summed over the data-parallel ranks, is reported on every
  // rank.
  EvaluationResult evaluate(const std::vector<MicroBatch>& microbatches);

  // Checkpointed state: tensors "model.<param>", "optimizer.exp_avg.<param>", "optimizer.exp_avg_sq.<param>"
  // (fp32), and metadata iteration, consumed_samples, skipped_iterations, model_config.
  void save(checkpoint::CheckpointWriter& writer) const;
  // Restores what save() wrote; UserError when the checkpoint holds another model shape.
  void load(const checkpoint::CheckpointReader& reader, const CheckpointLoadScope& scope = {});
  // Restores a checkpoint saved under another parallel layout: `shards` are every rank's shard of that save
  // (metadata tp_rank / tp_size; a single-rank save: one shard). Each parameter (and its optimizer moments)
  // is assembled from the TP slices of the shards holding it and sliced for this rank.
  // Without the optimizer in `scope`, a distributed-optimizer save reshards too (its weights are whole).
  void load_resharded(const std::vector<checkpoint::CheckpointReader>& shards,
                      const CheckpointLoadScope& scope = {});
  // Sum of `value` over every rank of the job (a bookkeeping reduction, not recorded as a step-program op;
  // also a barrier).
  double world_sum(double value);

  // Called as the pipeline runner reaches each forward segment of a (micro-batch, chunk) (the walk's
  // layouts::StepItem::forward_groups: the embedding, each decoder layer, the head), in training and in
  // evaluation: after the data-parallel strategy's before_forward(chunk, group), where a parameter gather of
  // the group is waited, and before the segment runs.
  using ForwardSegmentHook = std::function<void(int chunk, int microbatch, int group)>;
  void set_forward_segment_hook(ForwardSegmentHook hook) { forward_segment_hook_ = std::move(hook); }

  std::int64_t iteration() const { return iteration_; }
  std::int64_t consumed_samples() const { return consumed_samples_; }
  std::int64_t skipped_iterations() const { return skipped_iterations_; }
  // The rate the next iteration will use (Megatron logs this one after each step).
  double current_learning_rate() const { return schedule_lr_.lr(consumed_samples_); }
  GPTModel& model(int chunk = 0) { return *chunks_.at(chunk); }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  Backend& backend() { return backend_; }
  DataParallelStrategy& data_parallel() { return *data_parallel_; }
  const TrainerConfig& config() const { return config_; }

 private:
  void build(bool sizing);
  EvaluationResult evaluate_batches(const std::vector<MicroBatch>& microbatches);  // evaluate's pass
  void run_items(const std::vector<MicroBatch>& microbatches);
  // A kForward item segment by segment (evaluation: forward only).
  void run_forward(const layouts::StepItem& item, const MicroBatch& batch, bool evaluation);
  void run_backward(const layouts::StepItem& item);  // one kBackward item (entry by entry under FSDP ZeRO-3)
  void run_p2p(const layouts::StepItem& item, bool evaluation = false);
  void run_optimizer_step(layouts::OptimizerStep step, StepResult& result);
  void reduce_tied_embedding();
  void reduce_sequence_parallel_norms();
  void update_expert_biases();
  double reported_loss(double& local);  // local: this rank's counted part
  // Collective (every rank passes the same `global`): with the check on, throws UserError when `global`
  // (the `what`, e.g. "gradient norm") is not finite, naming the first rank whose `local` is not.
  void require_finite(const std::string& what, double global, double local);
  double world_reduce(double value, ReduceOp op);
  std::vector<double> context_parallel_losses(GPTModel& chunk);
  // This CP rank's share of each micro-batch (the micro-batches themselves without context parallelism).
  const std::vector<MicroBatch>& context_parallel_share(const std::vector<MicroBatch>& microbatches);
  double reported_load_balancing_loss();
  std::vector<double> reported_mtp_losses();
  TrainerConfig config_;
  layouts::RankSchedule schedule_;
  std::vector<layouts::StepItem> items_;
  std::vector<layouts::StepItem> forward_items_;  // the evaluation pass
  Backend& backend_;
  Communicator& communicator_;
  LearningRateSchedule schedule_lr_;
  std::vector<int> slots_per_chunk_;
  std::vector<MicroBatch> cp_local_;  // this CP rank's share of the iteration's micro-batches (cp > 1)
  std::vector<std::unique_ptr<GPTModel>> chunks_;
  // The chunks' grad buffers, their reduction, the main parameters and AdamW moments this rank holds, the
  // update and the param gathers (DDP, or the distributed optimizer).
  std::unique_ptr<DataParallelStrategy> data_parallel_;
  ForwardSegmentHook forward_segment_hook_;
  StepResult pending_result_;  // the iteration being run (grad norm, skip, learning rate)
  Tensor sp_norm_grads_;  // (1, n) fp32: the sequence-parallel norm gradients, gathered for their all-reduce
  Tensor scalar_;         // (1, 2) fp32: bookkeeping reductions
  Tensor cp_loss_sums_;   // (1, 2 * micro-batches) fp32: the CP group's loss sums and counted tokens
  Tensor expert_counts_;  // (1, L * E) fp32: the tokens per expert summed for the expert-bias update
  int microbatch_capacity_ =
      1;  // the micro-batches the buffers hold (config.batch.num_microbatches at build)
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
// The arena a Trainer reserves, exactly: its own sizing pass (activation slots from `schedule`, trainer
// buffers) with `communicator` answering the rank's group sizes (no data moves).
std::vector<ArenaUse> size_training_arena(const TrainerConfig& config, const layouts::RankSchedule& schedule,
                                          Backend& backend, Communicator& communicator);
// What the chunk's DataParallelStrategy works on: its gradient-buffer regions and flat buffers.
DataParallelChunk data_parallel_chunk(GPTModel& model);
}  // namespace megatune::executor
