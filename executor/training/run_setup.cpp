// Run setup: a rank's RunConfig from (model, layout, flags, rank).
#include "executor/training/run_setup.h"

#include <algorithm>
#include <sstream>

#include "base/user_error.h"
#include "layouts/flops.h"
#include "layouts/model_flags.h"
#include "layouts/parameter_table.h"
#include "layouts/rank_grid.h"
#include "layouts/schedule.h"
#include "layouts/schedule_walker.h"

namespace megatune::executor {
namespace {

// The MTP placements the executor runs: every MTP layer with the loss (Megatron also allows them on a
// stage of their own before the last), no context parallelism (its roll exchanges boundary tokens between
// CP ranks), learned absolute positions only without pipelining (the MTP stage's position table would need
// its own reduction).
void require_runnable_mtp(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                          const layouts::PipelineLayout& layout) {
  for (const layouts::PipelineStage& stage : layout.stages())
    if (stage.num_mtp_layers > 0 && !stage.has_loss)
      throw UserError(
          "--pipeline-model-parallel-layout " + layout.to_string() +
          ": the executor runs MTP layers ('m') in the stage with the loss ('L') only; put every m "
          "just before L");
  if (config.cp() > 1)
    throw UserError("--mtp-num-layers with --context-parallel-size " + std::to_string(config.cp()) +
                    ": the executor runs multi-token prediction without context parallelism; use "
                    "--context-parallel-size 1");
  if (config.pp() > 1 && model.position_embedding != layouts::PositionEmbedding::kRope)
    throw UserError("--mtp-num-layers with --pipeline-model-parallel-size " + std::to_string(config.pp()) +
                    ": the executor runs MTP under pipelining with rotary positions only; use "
                    "--position-embedding-type rope");
}

}  // namespace

RankLayout rank_layout(const layouts::ModelSpec& model, const layouts::ParallelConfig& config, int rank) {
  if (model.is_moe() && config.tp() > 1 && !config.sequence_parallel_enabled())
    throw UserError("--num-experts with --tensor-model-parallel-size " + std::to_string(config.tp()) +
                    ": MoE layers under tensor parallelism need --sequence-parallel (as Megatron requires)");
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  if (rank < 0 || rank >= grid.world_size())
    throw std::out_of_range("rank " + std::to_string(rank) + " outside the world of " +
                            std::to_string(grid.world_size()));
  RankLayout out;
  out.coordinates = grid.dense_coordinates(rank);
  const layouts::PipelineLayout layout = config.resolved_pipeline_layout(model);
  if (model.mtp_num_layers > 0) require_runnable_mtp(model, config, layout);
  for (const layouts::PipelineStage* stage : layout.stages_of_rank(out.coordinates.pp)) {
    out.chunks.push_back(layouts::contents_of(*stage));
  }
  out.schedule = layouts::build_schedule(model, config, out.coordinates.pp);
  return out;
}

std::string describe_layout(const layouts::ModelSpec& model, const layouts::ParallelConfig& config) {
  std::ostringstream out;
  out << "tp" << config.tp() << " pp" << config.pp() << " dp" << config.dp() << " cp" << config.cp() << " vpp"
      << config.vpp(model) << (config.sequence_parallel_enabled() ? " sp" : "");
  // The expert grid places the experts' slices: a checkpoint resumes shard by shard only under the same one.
  if (model.is_moe()) out << " ep" << config.ep() << " etp" << config.etp();
  out << (config.use_distributed_optimizer ? " dist-opt" : "");
  if (config.fsdp()) out << " fsdp " << layouts::to_string(config.sharding());
  out << " layout " << config.resolved_pipeline_layout(model).to_string();
  return out.str();
}

namespace {

LrScheduleConfig lr_schedule(const TrainOptions& a, std::int64_t gbs) {
  LrScheduleConfig lr;
  lr.max_lr = a.lr;
  lr.min_lr = a.min_lr;
  lr.init_lr = a.lr_warmup_init;
  lr.decoupled_max_lr = a.decoupled_lr;
  lr.decoupled_min_lr = a.decoupled_min_lr;
  lr.style = parse_lr_decay_style(a.lr_decay_style);
  lr.wsd_style = parse_wsd_decay_style(a.lr_wsd_decay_style);
  // Megatron's sample schedule counts in samples; an iteration schedule in iterations of `gbs` samples.
  lr.decay_samples = a.lr_decay_samples ? *a.lr_decay_samples
                     : a.lr_decay_iters ? *a.lr_decay_iters * gbs
                     : a.train_samples  ? *a.train_samples
                                        : a.train_iters * gbs;
  if (a.lr_warmup_iters && a.lr_warmup_fraction)
    throw UserError("give only one of --lr-warmup-iters and --lr-warmup-fraction");
  if (a.lr_warmup_fraction) {
    if (!(*a.lr_warmup_fraction >= 0 && *a.lr_warmup_fraction <= 1))
      throw UserError("--lr-warmup-fraction must lie in [0, 1]");
    lr.warmup_samples =
        static_cast<std::int64_t>(*a.lr_warmup_fraction * static_cast<double>(lr.decay_samples));
  } else {
    lr.warmup_samples = a.lr_warmup_samples ? *a.lr_warmup_samples : a.lr_warmup_iters.value_or(0) * gbs;
  }
  lr.wsd_decay_samples =
      a.lr_wsd_decay_samples ? *a.lr_wsd_decay_samples : a.lr_wsd_decay_iters.value_or(0) * gbs;
  return lr;
}

}  // namespace

void resolve_sample_schedule(TrainOptions& a, std::int64_t global_batch_size, bool train_iters_given) {
  const struct {
    const char* samples_flag;
    const std::optional<std::int64_t>& samples;
    const char* iters_flag;
    bool iters_given;
  } pairs[] = {
      {"--lr-warmup-samples", a.lr_warmup_samples, "--lr-warmup-iters", a.lr_warmup_iters.has_value()},
      {"--lr-decay-samples", a.lr_decay_samples, "--lr-decay-iters", a.lr_decay_iters.has_value()},
      {"--lr-wsd-decay-samples", a.lr_wsd_decay_samples, "--lr-wsd-decay-iters",
       a.lr_wsd_decay_iters.has_value()},
  };
  if (!a.train_samples) {
    if (a.rampup_batch_size)
      throw UserError(
          "--rampup-batch-size needs a sample-based run (Megatron: expected no batch-size rampup for "
          "iteration-based training): give --train-samples instead of --train-iters");
    for (const auto& p : pairs)
      if (p.samples)
        throw UserError(
            std::string(p.samples_flag) +
            " belongs to a sample-based schedule: give --train-samples (and no --train-iters), or " +
            p.iters_flag + " with --train-iters");
    return;
  }
  if (train_iters_given)
    throw UserError("give only one of --train-iters and --train-samples (Megatron takes one or the other)");
  for (const auto& p : pairs) {
    if (p.iters_given)
      throw UserError(std::string(p.iters_flag) +
                      " belongs to an iteration schedule: with --train-samples give " + p.samples_flag);
    if (p.samples && *p.samples < 0) throw UserError(std::string(p.samples_flag) + " must be >= 0");
  }
  if (a.rampup_batch_size) {  // the ramp-up's sizes are checked once the layout is known
    a.train_iters = MicroBatchCalculator(global_batch_size, 1, 1, a.rampup_batch_size)
                        .train_iters_for_samples(*a.train_samples);
    if (a.train_iters == 0)
      throw UserError("--train-samples " + std::to_string(*a.train_samples) +
                      " gives no iteration: raise it");
    return;
  }
  if (*a.train_samples < global_batch_size)
    throw UserError("--train-samples " + std::to_string(*a.train_samples) +
                    " is less than one global batch (" + std::to_string(global_batch_size) +
                    " samples): raise it");
  a.train_iters = *a.train_samples / global_batch_size;  // Megatron's train_samples // global_batch_size
}

MicroBatchCalculator batch_size_calculator(const layouts::ModelSpec& spec,
                                           const layouts::ParallelConfig& parallel, const TrainOptions& a) {
  MicroBatchCalculator calculator(parallel.resolved_global_batch_size(), parallel.micro_batch_size,
                                  parallel.dp(), a.rampup_batch_size);
  if (!calculator.ramps()) return calculator;
  calculator.check_batches(a.train_iters);
  // Each batch the ramp-up reaches must be one the layout's pipeline schedule runs.
  std::int64_t consumed = 0, last = -1;
  for (std::int64_t i = 0; i < a.train_iters && consumed <= a.rampup_batch_size->rampup_samples; ++i) {
    const std::int64_t batch = calculator.global_batch_size(consumed);
    if (batch != last) {
      layouts::ParallelConfig at = parallel;
      at.global_batch_size = static_cast<int>(batch);
      try {
        at.validate(spec);
      } catch (const UserError& e) {
        throw UserError("--rampup-batch-size: the ramp-up's global batch " + std::to_string(batch) + ": " +
                        e.what());
      }
      last = batch;
    }
    consumed += batch;
  }
  return calculator;
}

RunConfig build_run_config(const layouts::ModelSpec& spec, const layouts::ParallelConfig& parallel,
                           const TrainOptions& a, int rank) {
  const RankLayout placement = rank_layout(spec, parallel, rank);
  RunConfig run;
  TrainerConfig& t = run.trainer;
  t.model =
      transformer_config_from(spec, parallel.tp(), static_cast<float>(a.rotary_base),
                              static_cast<float>(a.norm_epsilon), static_cast<float>(a.init_method_std));
  t.model.sequence_parallel = parallel.sequence_parallel_enabled();
  t.model_args = layouts::join_model_flags(layouts::model_flags(spec, {a.rotary_base, a.norm_epsilon}));
  t.model.mtp_loss_scaling_factor = static_cast<float>(a.mtp_loss_scaling_factor);
  if (a.fp8.enabled() && !a.bf16)
    throw UserError(
        "--fp8-format trains the linear layers' GEMMs in FP8 beside bf16 parameters and "
        "activations: add --bf16 (the CUDA backend always computes in bf16)");
  t.model.fp8 = a.fp8;
  if (t.model.is_moe()) {
    const layouts::ExpertCoordinates expert =
        layouts::RankGrid::from_config(parallel).expert_coordinates(rank);
    t.model.expert_parallel_size = parallel.ep();
    t.model.expert_parallel_rank = expert.ep;
    t.model.expert_tensor_parallel_size = parallel.etp();
    t.model.expert_tensor_parallel_rank = expert.etp;
    t.model.moe_allgather_dispatcher =
        parallel.moe_token_dispatcher_type == layouts::MoeDispatcher::kAllGather;
    MoeRouterConfig& router = t.model.router;
    router.score_function = parse_router_score_function(a.moe_router_score_function);
    router.pre_softmax = a.moe_router_pre_softmax;
    router.load_balancing = parse_load_balancing_type(a.moe_router_load_balancing_type);
    router.aux_loss_coeff = a.moe_aux_loss_coeff;
    router.enable_expert_bias = a.moe_router_enable_expert_bias;
    router.bias_update_rate = a.moe_router_bias_update_rate;
    router.topk_scaling_factor = a.moe_router_topk_scaling_factor;
    router.num_groups = a.moe_router_num_groups;
    router.group_topk = a.moe_router_group_topk;
    router.z_loss_coeff = a.moe_z_loss_coeff;
    if (a.moe_expert_capacity_factor) {
      if (!(*a.moe_expert_capacity_factor > 0.0))
        throw UserError("--moe-expert-capacity-factor must be > 0 (leave it out for dropless routing)");
      router.capacity_factor = *a.moe_expert_capacity_factor;
    }
    router.pad_to_capacity = a.moe_pad_expert_input_to_capacity;
    if (router.pad_to_capacity && t.model.moe_allgather_dispatcher)
      throw UserError(
          "--moe-pad-expert-input-to-capacity needs --moe-token-dispatcher-type alltoall (as Megatron "
          "requires)");
    t.model.validate();
  }
  t.batch.micro_batch = parallel.micro_batch_size;
  t.batch.seq = spec.seq_length;
  t.batch.num_microbatches = parallel.num_microbatches();
  t.recompute = layouts::RecomputeSettings::of(parallel);
  t.compute_dtype = a.bf16 ? DType::kBF16 : DType::kFP32;
  t.optimizer = {a.weight_decay, a.adam_beta1, a.adam_beta2, a.adam_eps, a.clip_grad};
  t.seed = a.seed;
  t.data_parallel_size = parallel.dp();
  t.context_parallel_size = parallel.cp();
  t.chunks = placement.chunks;
  t.overlap_grad_reduce = parallel.overlap_grad_reduce;
  t.use_distributed_optimizer = parallel.shards_optimizer_state();
  if (parallel.fsdp()) t.fsdp = parallel.sharding();
  t.overlap_param_gather = parallel.overlap_param_gather;
  t.check_for_nan_in_loss_and_grad = a.check_for_nan_in_loss_and_grad;
  t.step = layouts::walk_rank_step(spec, parallel, rank);
  t.forward_step = layouts::walk_rank_forward(spec, parallel, rank);
  const std::int64_t gbs = t.global_batch_size();
  t.lr = lr_schedule(a, gbs);

  run.train_iters = a.train_iters;
  run.train_samples = a.train_samples.value_or(0);
  if (a.rampup_batch_size) {
    run.batch_sizes = batch_size_calculator(spec, parallel, a);
    // The rank's program at each of the ramp-up's micro-batch counts (the final one is `t`'s).
    run.program_for = [spec, parallel, rank](int count) {
      layouts::ParallelConfig at = parallel;
      at.global_batch_size = count * parallel.micro_batch_size * parallel.dp();
      RankProgram program{rank_layout(spec, at, rank).schedule, layouts::walk_rank_step(spec, at, rank)};
      return program;
    };
  }
  run.data.data_path = a.data_path;
  run.data.mock_data = a.mock_data;
  run.data.split = a.split;
  run.data.gpt.random_seed = a.seed;
  run.data.gpt.vocab_size = spec.vocab_size;
  run.data.gpt.eod_mask_loss = a.eod_mask_loss;
  // The tokenizer's EOD, else the byte tokenizer's when it fits.
  run.data.gpt.eod_token = a.eod_token ? *a.eod_token : (spec.vocab_size > 256 ? 256 : 0);
  if (run.data.gpt.eod_token >= spec.vocab_size)
    throw UserError("the tokenizer's end-of-document id " + std::to_string(run.data.gpt.eod_token) +
                    " is outside --vocab-size " + std::to_string(spec.vocab_size) + ": raise --vocab-size");
  run.data.mock.vocab_size = spec.vocab_size;
  run.data.mock.eod_token = run.data.gpt.eod_token;
  run.save = a.save;
  run.load = a.load;
  run.overwrite_checkpoints = a.overwrite_checkpoints;
  run.save_interval = a.save_interval;
  run.finetune = a.finetune;
  run.load_optimizer = !a.no_load_optim && !a.finetune;
  if (a.exit_interval < 0) throw UserError("--exit-interval must be >= 0 (0: no exit before --train-iters)");
  if (!(a.exit_duration_in_mins >= 0.0))
    throw UserError("--exit-duration-in-mins must be >= 0 (0: no time limit)");
  run.exit_interval = a.exit_interval;
  run.exit_duration_s = a.exit_duration_in_mins * 60.0;
  run.log_interval = a.log_interval;
  run.eval_interval = a.eval_interval;
  run.eval_iters = a.eval_iters;
  run.flops_per_iteration = layouts::model_flops_per_iteration(spec, gbs, 1);
  run.gpus = parallel.world_size;
  run.schedule = placement.schedule;
  run.data_parallel_rank = placement.coordinates.dp;
  if (parallel.world_size > 1) run.layout_description = describe_layout(spec, parallel);
  run.tensorboard_dir = a.tensorboard_dir;
  run.tensorboard_log_interval = a.tensorboard_log_interval;
  run.trace = a.trace;
  run.trace.rank = rank;
  run.trace.coordinates = placement.coordinates;
  if (run.batch_sizes && !run.trace.dir.empty()) {
    // The trace (and the manifest compare reads) is of the final global batch: the window follows the ramp.
    const std::int64_t first = run.batch_sizes->first_final_iteration();
    if (run.trace.first_iteration == 0 && first <= a.train_iters) {
      run.trace.first_iteration = first;
      run.trace.iterations = std::min<std::int64_t>(3, a.train_iters - first + 1);
    } else if (run.trace.first_iteration < first) {
      throw UserError(
          "--trace-dir with --rampup-batch-size: the ramp-up runs smaller batches until iteration " +
          std::to_string(first) + "; trace from there (--trace-iterations " + std::to_string(first) +
          ":3) or train past it");
    }
  }
  resolve_trace_window(run.trace, a.train_iters);
  return run;
}

}  // namespace megatune::executor
