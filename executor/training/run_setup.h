// Run setup: from a model, a validated parallel layout, the training flags and a global rank, the rank's
// RunConfig (model shape on its TP shard, its model chunks and pipeline schedule, its data-parallel slice,
// optimizer, learning-rate schedule, data and checkpoint settings). The CLI only parses flags into
// TrainOptions.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "executor/training/training_run.h"
#include "layouts/fp8.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::executor {

// Megatron's training flags (names in the comments), as `megatune train` takes them.
struct TrainOptions {
  double lr = 1e-4, min_lr = 0.0, lr_warmup_init = 0.0;  // --lr, --min-lr, --lr-warmup-init
  std::string lr_decay_style = "linear";                 // --lr-decay-style
  // --decoupled-lr / --decoupled-min-lr: the word embeddings' and the output layer's peak and floor.
  std::optional<double> decoupled_lr, decoupled_min_lr;
  std::optional<std::int64_t> lr_warmup_iters, lr_decay_iters, lr_wsd_decay_iters;
  std::optional<double> lr_warmup_fraction;
  std::string lr_wsd_decay_style = "exponential";
  double weight_decay = 0.01, clip_grad = 1.0, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double init_method_std = 0.02, norm_epsilon = 1e-5, rotary_base = 10000.0;
  std::int64_t train_iters = 100;
  // Megatron's sample-based schedule: --train-samples (train_iters = samples / global batch), the warm-up,
  // decay and WSD anneal in samples. Either these or the iteration counts, not both (as Megatron asserts).
  std::optional<std::int64_t> train_samples, lr_warmup_samples, lr_decay_samples, lr_wsd_decay_samples;
  // --rampup-batch-size <start global batch> <increment> <ramp-up samples> (with --train-samples only, as
  // Megatron asserts): each iteration's global batch follows the consumed samples up to --global-batch-size.
  std::optional<BatchSizeRampup> rampup_batch_size;
  std::string save, load;
  // --finetune: only the model's weights come from --load (iteration, consumed samples and optimizer state
  // start anew, the run is a new one); --no-load-optim: the optimizer state starts anew.
  bool finetune = false, no_load_optim = false;
  // --exit-interval N: stop after an iteration that N divides; --exit-duration-in-mins M: stop after the
  // first iteration that ends M minutes after the run began. Both save a checkpoint first (with --save).
  std::int64_t exit_interval = 0;
  double exit_duration_in_mins = 0.0;
  std::int64_t save_interval = 0;
  bool overwrite_checkpoints =
      false;  // --overwrite-checkpoints: --save may replace another run's checkpoints
  std::vector<std::string> data_path;
  std::string split = "969,30,1";
  bool mock_data = false;
  bool eod_mask_loss = false;
  std::optional<std::int32_t>
      eod_token;  // the tokenizer's EOD (Megatron's tokenizer.eod); unset: the byte one
  std::uint32_t seed = 1234;
  std::int64_t log_interval = 10;
  std::int64_t eval_interval = 1000;  // --eval-interval
  std::int64_t eval_iters = 0;        // --eval-iters (Megatron's default is 100; 0: no evaluation)
  bool bf16 = false;                  // compute dtype bf16 (the CUDA backend always)
  // FP8 linears: --fp8-format, --fp8-recipe, --fp8-margin, --fp8-amax-history-len, --fp8-amax-compute-algo.
  layouts::Fp8Settings fp8;
  // MoE router (Megatron's defaults).
  std::string moe_router_score_function = "softmax";         // --moe-router-score-function
  bool moe_router_pre_softmax = false;                       // --moe-router-pre-softmax
  std::string moe_router_load_balancing_type = "aux_loss";   // --moe-router-load-balancing-type
  double moe_aux_loss_coeff = 0.0;                           // --moe-aux-loss-coeff
  std::optional<double> moe_expert_capacity_factor;          // --moe-expert-capacity-factor (unset: dropless)
  bool moe_pad_expert_input_to_capacity = false;             // --moe-pad-expert-input-to-capacity
  bool moe_router_enable_expert_bias = false;                // --moe-router-enable-expert-bias
  double moe_router_bias_update_rate = 1e-3;                 // --moe-router-bias-update-rate
  double moe_router_topk_scaling_factor = 0.0;               // --moe-router-topk-scaling-factor (0: none)
  int moe_router_num_groups = 0, moe_router_group_topk = 0;  // --moe-router-num-groups / -group-topk
  double moe_z_loss_coeff = 0.0;                             // --moe-z-loss-coeff (0: none)
  double mtp_loss_scaling_factor = 0.1;                      // --mtp-loss-scaling-factor (Megatron's default)
  RunTraceOptions trace;                                     // --trace-dir, --trace-iterations
  std::string tensorboard_dir;                               // --tensorboard-dir
  std::int64_t tensorboard_log_interval = 1;                 // --tensorboard-log-interval
  bool check_for_nan_in_loss_and_grad = true;                // --[no-]check-for-nan-in-loss-and-grad
  // --distributed-timeout-minutes (Megatron's default 10): how long the ranks' rendezvous, communicator
  // setup and any one collective may take before the job ends with a line naming what was awaited.
  double distributed_timeout_minutes = 10.0;
  double distributed_timeout_s() const { return distributed_timeout_minutes * 60.0; }
};

// What one global rank holds of a (model, layout): coordinates, model chunks, schedule.
struct RankLayout {
  layouts::DenseCoordinates coordinates;
  std::vector<StageSpan> chunks;  // in virtual-stage order
  layouts::RankSchedule schedule;
};
// Throws UserError for layouts the executor cannot run yet (MTP layers off the loss stage or with context
// parallelism, MoE with tensor or expert-tensor parallelism).
RankLayout rank_layout(const layouts::ModelSpec& model, const layouts::ParallelConfig& config, int rank);

// Megatron's sample-based schedule: refuses one mixed with iteration counts (train_iters_given: the command
// line gave --train-iters) and sets train_iters to train_samples / global_batch_size, or under
// --rampup-batch-size to the ramp-up's iterations (Megatron's update_train_iters). UserError naming the
// flags; nothing to do without --train-samples (a ramp-up without it is refused).
void resolve_sample_schedule(TrainOptions& options, std::int64_t global_batch_size, bool train_iters_given);

// Megatron's micro-batch calculator of the run (--rampup-batch-size ramps it); UserError where Megatron
// asserts, including a batch of the ramp-up that micro-batch x dp does not divide or the pipeline schedule
// cannot run.
MicroBatchCalculator batch_size_calculator(const layouts::ModelSpec& model,
                                           const layouts::ParallelConfig& config,
                                           const TrainOptions& options);

// The whole RunConfig of `rank`; peak_tflops is left 0 (the caller knows its device). UserError on bad flags.
RunConfig build_run_config(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                           const TrainOptions& options, int rank);

// A one-line description of a layout for logs and checkpoint manifests, e.g. "tp2 pp2 dp2 vpp1 sp".
std::string describe_layout(const layouts::ModelSpec& model, const layouts::ParallelConfig& config);

}  // namespace megatune::executor
