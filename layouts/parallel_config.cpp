// ParallelConfig: derived sizes, the resolved pipeline layout, and validation against a model.
#include "layouts/parallel_config.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "base/user_error.h"

namespace megatune::layouts {

std::string_view to_string(RecomputeGranularity granularity) {
  switch (granularity) {
    case RecomputeGranularity::kNone:
      return "none";
    case RecomputeGranularity::kSelective:
      return "selective";
    case RecomputeGranularity::kFull:
      return "full";
  }
  return "none";
}

std::string_view to_string(RecomputeMethod method) {
  switch (method) {
    case RecomputeMethod::kNone:
      return "none";
    case RecomputeMethod::kUniform:
      return "uniform";
    case RecomputeMethod::kBlock:
      return "block";
  }
  return "none";
}

std::string_view to_string(RankOrder order) {
  return order == RankOrder::kTpCpEpDpPp ? "tp-cp-ep-dp-pp" : "tp-cp-ep-pp-dp";
}

RecomputeGranularity parse_recompute_granularity(std::string_view text) {
  if (text == "none" || text.empty()) return RecomputeGranularity::kNone;
  if (text == "selective") return RecomputeGranularity::kSelective;
  if (text == "full") return RecomputeGranularity::kFull;
  throw UserError("--recompute-granularity '" + std::string(text) + "' is unknown: use selective or full");
}

RecomputeMethod parse_recompute_method(std::string_view text) {
  if (text == "none" || text.empty()) return RecomputeMethod::kNone;
  if (text == "uniform") return RecomputeMethod::kUniform;
  if (text == "block") return RecomputeMethod::kBlock;
  throw UserError("--recompute-method '" + std::string(text) + "' is unknown: use uniform or block");
}

std::string_view to_string(DataParallelSharding sharding) {
  switch (sharding) {
    case DataParallelSharding::kNoShard:
      return "no_shard";
    case DataParallelSharding::kOptim:
      return "optim";
    case DataParallelSharding::kOptimGrads:
      return "optim_grads";
    case DataParallelSharding::kOptimGradsParams:
      return "optim_grads_params";
  }
  return "no_shard";
}

DataParallelSharding parse_data_parallel_sharding(std::string_view text) {
  for (const DataParallelSharding s :
       {DataParallelSharding::kNoShard, DataParallelSharding::kOptim, DataParallelSharding::kOptimGrads,
        DataParallelSharding::kOptimGradsParams})
    if (text == to_string(s)) return s;
  throw UserError("--data-parallel-sharding-strategy '" + std::string(text) +
                  "' is unknown: use no_shard, optim, optim_grads or optim_grads_params");
}

DataParallelSharding ParallelConfig::sharding() const {
  if (use_torch_fsdp2) return DataParallelSharding::kOptimGradsParams;
  if (use_megatron_fsdp) return data_parallel_sharding_strategy;
  return use_distributed_optimizer ? DataParallelSharding::kOptim : DataParallelSharding::kNoShard;
}

RankOrder parse_rank_order(std::string_view text) {
  if (text == "tp-cp-ep-dp-pp") return RankOrder::kTpCpEpDpPp;
  if (text == "tp-cp-ep-pp-dp") return RankOrder::kTpCpEpPpDp;
  throw UserError("rank order '" + std::string(text) + "' is unknown: use tp-cp-ep-dp-pp or tp-cp-ep-pp-dp");
}

MoeDispatcher parse_moe_dispatcher(std::string_view text) {
  if (text == "alltoall") return MoeDispatcher::kAllToAll;
  if (text == "allgather") return MoeDispatcher::kAllGather;
  throw UserError("--moe-token-dispatcher-type '" + std::string(text) + "' " +
                  (text == "flex" ? "(DeepEP / HybridEP) is not run or priced by megatune"
                                  : "is not one of alltoall, allgather, flex") +
                  ": use alltoall or allgather");
}

int ParallelConfig::dp() const {
  const int64_t model_parallel = int64_t{tp()} * cp() * pp();
  return model_parallel > 0 ? static_cast<int>(world_size / model_parallel) : 0;
}

int ParallelConfig::edp() const {
  const int64_t expert_parallel = int64_t{etp()} * ep() * pp();
  return expert_parallel > 0 ? static_cast<int>(world_size / expert_parallel) : 0;
}

int ParallelConfig::resolved_global_batch_size() const {
  return global_batch_size > 0 ? global_batch_size : micro_batch_size * dp();
}

int ParallelConfig::num_microbatches() const {
  const int64_t per_step = int64_t{micro_batch_size} * dp();
  return per_step > 0 ? static_cast<int>(resolved_global_batch_size() / per_step) : 0;
}

int ParallelConfig::vpp(const ModelSpec& model) const {
  if (!pipeline_model_parallel_layout.empty()) {
    return PipelineLayout::parse(pipeline_model_parallel_layout, pp()).vpp();
  }
  if (num_virtual_stages_per_pipeline_rank > 0) return num_virtual_stages_per_pipeline_rank;
  if (num_layers_per_virtual_pipeline_stage > 0) {
    const int layers = model.num_layers + (account_for_embedding_in_pipeline_split ? 1 : 0) +
                       (account_for_loss_in_pipeline_split ? 1 : 0);
    if (pp() < 1 || layers % pp() != 0) {
      throw UserError("--num-layers " + std::to_string(model.num_layers) +
                      " is not divisible by --pipeline-model-parallel-size " + std::to_string(pp()) +
                      ", so --num-layers-per-virtual-pipeline-stage cannot apply: use "
                      "--num-virtual-stages-per-pipeline-rank or --pipeline-model-parallel-layout");
    }
    const int per_rank = layers / pp();
    if (per_rank % num_layers_per_virtual_pipeline_stage != 0) {
      throw UserError("--num-layers-per-virtual-pipeline-stage " +
                      std::to_string(num_layers_per_virtual_pipeline_stage) + " does not divide the " +
                      std::to_string(per_rank) + " layers per pipeline rank: use a divisor of " +
                      std::to_string(per_rank));
    }
    return per_rank / num_layers_per_virtual_pipeline_stage;
  }
  return 1;
}

PipelineLayout ParallelConfig::resolved_pipeline_layout(const ModelSpec& model) const {
  if (!pipeline_model_parallel_layout.empty())
    return PipelineLayout::parse(pipeline_model_parallel_layout, pp());
  const int virtual_stages = vpp(model);
  if (decoder_first_pipeline_num_layers >= 0 || decoder_last_pipeline_num_layers >= 0) {
    return PipelineLayout::uneven(model.num_layers, pp(), decoder_first_pipeline_num_layers,
                                  decoder_last_pipeline_num_layers, virtual_stages, model.mtp_num_layers);
  }
  if (account_for_embedding_in_pipeline_split || account_for_loss_in_pipeline_split) {
    return PipelineLayout::accounting_for_embedding_and_loss(
        model.num_layers, pp(), account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split,
        virtual_stages, model.mtp_num_layers);
  }
  return PipelineLayout::uniform(model.num_layers, pp(), virtual_stages, model.mtp_num_layers);
}

namespace {

// "1, 2, 4, 8, 16 or 32"
std::string divisor_list(int n) {
  std::vector<int> divisors;
  for (int d = 1; d <= n && divisors.size() < 16; ++d) {
    if (n % d == 0) divisors.push_back(d);
  }
  std::string out;
  for (size_t i = 0; i < divisors.size(); ++i) {
    if (i > 0) out += i + 1 == divisors.size() ? " or " : ", ";
    out += std::to_string(divisors[i]);
  }
  return out;
}

std::string flag_value(const char* flag, int value) {
  return std::string(flag) + " " + std::to_string(value);
}

constexpr int kMaxParallelSize = 1 << 20;

void require_range(int value, int low, const char* flag) {
  if (value < low || value > kMaxParallelSize) {
    throw UserError(flag_value(flag, value) + " is out of range: use a value in [" + std::to_string(low) +
                    ", " + std::to_string(kMaxParallelSize) + "]");
  }
}

}  // namespace

void ParallelConfig::validate(const ModelSpec& model, const PipelineLayout* resolved_layout) const {
  // Sizes.
  require_range(world_size, 1, "--world-size");
  require_range(tensor_model_parallel_size, 1, "--tensor-model-parallel-size");
  require_range(pipeline_model_parallel_size, 1, "--pipeline-model-parallel-size");
  require_range(context_parallel_size, 1, "--context-parallel-size");
  require_range(expert_model_parallel_size, 1, "--expert-model-parallel-size");
  require_range(expert_tensor_parallel_size, 0, "--expert-tensor-parallel-size");
  require_range(data_parallel_size_requested, 0, "--data-parallel-size");
  require_range(micro_batch_size, 1, "--micro-batch-size");
  require_range(global_batch_size, 0, "--global-batch-size");
  require_range(num_layers_per_virtual_pipeline_stage, 0, "--num-layers-per-virtual-pipeline-stage");
  require_range(num_virtual_stages_per_pipeline_rank, 0, "--num-virtual-stages-per-pipeline-rank");
  require_range(microbatch_group_size_per_vp_stage, 0, "--microbatch-group-size-per-virtual-pipeline-stage");
  require_range(recompute_num_layers, 0, "--recompute-num-layers");
  if (decoder_first_pipeline_num_layers < -1 || decoder_last_pipeline_num_layers < -1) {
    throw UserError("--decoder-first/last-pipeline-num-layers must be >= 0");
  }

  model.validate();

  // World = tp * cp * dp * pp.
  const int64_t model_parallel = int64_t{tp()} * cp() * pp();
  if (model_parallel > world_size || world_size % model_parallel != 0) {
    throw UserError("--world-size " + std::to_string(world_size) + " is not a multiple of tp x cp x pp = " +
                    std::to_string(tp()) + " x " + std::to_string(cp()) + " x " + std::to_string(pp()) +
                    " = " + std::to_string(model_parallel) + ": use a world size that is a multiple of " +
                    std::to_string(model_parallel) + " or lower --tp/--cp/--pp");
  }
  if (data_parallel_size_requested > 0 && data_parallel_size_requested != dp()) {
    throw UserError("--data-parallel-size " + std::to_string(data_parallel_size_requested) +
                    " disagrees with --world-size " + std::to_string(world_size) +
                    " / (tp x cp x pp = " + std::to_string(model_parallel) + ") = " + std::to_string(dp()) +
                    ": drop --dp or make tp x cp x dp x pp equal the world size");
  }
  // Expert grid: world = etp * ep * edp * pp.
  const int64_t expert_parallel = int64_t{etp()} * ep() * pp();
  if (expert_parallel > world_size || world_size % expert_parallel != 0) {
    throw UserError("--world-size " + std::to_string(world_size) + " is not a multiple of etp x ep x pp = " +
                    std::to_string(etp()) + " x " + std::to_string(ep()) + " x " + std::to_string(pp()) +
                    " = " + std::to_string(expert_parallel) +
                    ": lower --expert-model-parallel-size / --expert-tensor-parallel-size or grow the world");
  }
  if (rank_order == RankOrder::kTpCpEpPpDp && edp() != dp()) {
    throw UserError("--use-tp-pp-dp-mapping needs the expert data-parallel size (" + std::to_string(edp()) +
                    ") to equal the data-parallel size (" + std::to_string(dp()) +
                    "): make etp x ep equal tp x cp, or use the default order tp-cp-ep-dp-pp");
  }

  // Tensor parallelism divides the model.
  if (model.num_attention_heads % tp() != 0 ||
      (!model.multi_latent_attention && model.query_groups() % tp() != 0)) {
    const int common = model.multi_latent_attention
                           ? model.num_attention_heads
                           : std::gcd(model.num_attention_heads, model.query_groups());
    const bool heads = model.num_attention_heads % tp() != 0;
    throw UserError(flag_value("--tensor-model-parallel-size", tp()) + " does not divide " +
                    (heads ? flag_value("--num-attention-heads", model.num_attention_heads)
                           : flag_value("--num-query-groups", model.query_groups())) +
                    ": use " + divisor_list(common));
  }
  if (model.ffn_size() % tp() != 0) {
    throw UserError(flag_value("--tensor-model-parallel-size", tp()) + " does not divide " +
                    flag_value("--ffn-hidden-size", model.ffn_size()) + ": use a TP size that divides it");
  }
  if (model.is_moe()) {
    if (model.moe_ffn_size() % etp() != 0) {
      throw UserError(flag_value("--expert-tensor-parallel-size", etp()) + " does not divide " +
                      flag_value("--moe-ffn-hidden-size", model.moe_ffn_size()) +
                      ": use an expert TP size that divides it");
    }
    if (model.moe_shared_expert_intermediate_size % tp() != 0) {
      throw UserError(
          flag_value("--tensor-model-parallel-size", tp()) + " does not divide " +
          flag_value("--moe-shared-expert-intermediate-size", model.moe_shared_expert_intermediate_size) +
          ": use a TP size that divides it");
    }
    if (model.num_experts % ep() != 0) {
      throw UserError(flag_value("--expert-model-parallel-size", ep()) + " does not divide " +
                      flag_value("--num-experts", model.num_experts) + ": use " +
                      divisor_list(model.num_experts));
    }
    if (ep() > 1 && tp() > 1 && !sequence_parallel) {
      throw UserError(
          "expert parallelism with tensor parallelism needs --sequence-parallel (Megatron requires it): "
          "add --sequence-parallel");
    }
  } else if (ep() > 1) {
    throw UserError(flag_value("--expert-model-parallel-size", ep()) +
                    " needs an MoE model: add --num-experts or use --expert-model-parallel-size 1");
  }

  // Context and sequence parallelism split the sequence.
  if (cp() > 1 && model.seq_length % (2 * cp()) != 0) {
    throw UserError(
        flag_value("--seq-length", model.seq_length) + " is not divisible by 2 x " +
        flag_value("--context-parallel-size", cp()) +
        " (load-balanced causal CP splits it into 2 x cp chunks): use a sequence length divisible by " +
        std::to_string(2 * cp()));
  }
  if (sequence_parallel_enabled() && (model.seq_length / cp()) % tp() != 0) {
    throw UserError("--sequence-parallel splits the " + std::to_string(model.seq_length / cp()) +
                    " tokens per CP rank over " + flag_value("--tensor-model-parallel-size", tp()) +
                    ", which does not divide them: use a sequence length divisible by cp x tp");
  }

  // Pipeline layout: one way to give it.
  const int vpp_ways = (pipeline_model_parallel_layout.empty() ? 0 : 1) +
                       (num_layers_per_virtual_pipeline_stage > 0 ? 1 : 0) +
                       (num_virtual_stages_per_pipeline_rank > 0 ? 1 : 0);
  if (vpp_ways > 1) {
    throw UserError(
        "give at most one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-rank "
        "and --pipeline-model-parallel-layout");
  }
  const bool uneven = decoder_first_pipeline_num_layers >= 0 || decoder_last_pipeline_num_layers >= 0;
  const bool accounting = account_for_embedding_in_pipeline_split || account_for_loss_in_pipeline_split;
  if (!pipeline_model_parallel_layout.empty() && (uneven || accounting)) {
    throw UserError(
        "--pipeline-model-parallel-layout already places every layer: drop "
        "--decoder-first/last-pipeline-num-layers and --account-for-embedding/loss-in-pipeline-split");
  }
  if (uneven && accounting) {
    throw UserError(
        "--decoder-first/last-pipeline-num-layers cannot be combined with "
        "--account-for-embedding/loss-in-pipeline-split: use one of them");
  }
  const PipelineLayout resolved =
      resolved_layout != nullptr ? PipelineLayout() : resolved_pipeline_layout(model);
  const PipelineLayout& layout = resolved_layout != nullptr ? *resolved_layout : resolved;
  if (!pipeline_model_parallel_layout.empty()) layout.validate(model.num_layers, model.mtp_num_layers);
  const int virtual_stages = layout.vpp();
  if (virtual_stages > 1) {
    if (pp() == 1 || (pp() == 2 && !overlap_p2p_comm)) {
      throw UserError(std::to_string(virtual_stages) + " virtual pipeline stages per rank need " +
                      "--pipeline-model-parallel-size > 2 (or 2 with --overlap-p2p-comm); it is " +
                      std::to_string(pp()) + ": raise pp, add --overlap-p2p-comm, or drop virtual stages");
    }
  }

  // Batch.
  const int64_t per_step = int64_t{micro_batch_size} * dp();
  if (global_batch_size > 0 && global_batch_size % per_step != 0) {
    throw UserError(flag_value("--global-batch-size", global_batch_size) + " is not divisible by " +
                    flag_value("--micro-batch-size", micro_batch_size) + " x data-parallel size " +
                    std::to_string(dp()) + " = " + std::to_string(per_step) + ": use a multiple of " +
                    std::to_string(per_step));
  }
  const int m = num_microbatches();
  if (virtual_stages > 1) {
    const int g = micro_batch_group_size();
    if (m < pp()) {
      throw UserError("the interleaved schedule needs at least pp = " + std::to_string(pp()) +
                      " microbatches but --global-batch-size / (micro-batch x dp) = " + std::to_string(m) +
                      ": raise --global-batch-size to at least " + std::to_string(int64_t{pp()} * per_step));
    }
    if (g < pp() || g > m) {
      throw UserError(flag_value("--microbatch-group-size-per-virtual-pipeline-stage", g) +
                      " must lie in [pp = " + std::to_string(pp()) + ", microbatches = " + std::to_string(m) +
                      "]: pick a value in that range");
    }
    if (m % g != 0 && m % g < pp()) {
      throw UserError(std::to_string(m) + " microbatches leave a last group of " + std::to_string(m % g) +
                      " < pp = " + std::to_string(pp()) + " for microbatch group size " + std::to_string(g) +
                      ": make the microbatch count a multiple of the group size or leave a remainder >= pp");
    }
  }

  // Recomputation.
  if (recompute_granularity == RecomputeGranularity::kFull) {
    if (recompute_method == RecomputeMethod::kNone) {
      throw UserError("--recompute-granularity full needs --recompute-method uniform or block");
    }
    const int per_rank = (model.num_layers + pp() - 1) / pp();
    if (recompute_num_layers == 0) {
      throw UserError("--recompute-method " + std::string(to_string(recompute_method)) +
                      " needs --recompute-num-layers (uniform: layers per unit; block: layers recomputed per "
                      "chunk): add one, e.g. --recompute-num-layers 1");
    }
    if (recompute_num_layers < 1 || recompute_num_layers > per_rank) {
      throw UserError(flag_value("--recompute-num-layers", recompute_num_layers) +
                      " must be between 1 and the " + std::to_string(per_rank) +
                      " layers per pipeline rank with --recompute-granularity full");
    }
    // Megatron's MultiTokenPredictionLayer asserts recompute_num_layers == 1 under uniform.
    if (recompute_method == RecomputeMethod::kUniform && recompute_num_layers > 1 &&
        model.mtp_num_layers > 0) {
      throw UserError(flag_value("--recompute-num-layers", recompute_num_layers) +
                      " with --recompute-method uniform and --mtp-num-layers: Megatron recomputes MTP layers "
                      "one at a time; use --recompute-num-layers 1 or --recompute-method block");
    }
  } else if (recompute_method != RecomputeMethod::kNone) {
    throw UserError("--recompute-method " + std::string(to_string(recompute_method)) +
                    " applies only to --recompute-granularity full: drop it or use full recomputation");
  } else if (recompute_num_layers != 0) {
    throw UserError(flag_value("--recompute-num-layers", recompute_num_layers) +
                    " applies only to --recompute-granularity full with --recompute-method uniform or block: "
                    "drop it or add those flags");
  }

  // Optimizer, FSDP and overlap.
  validate_fsdp();
  if (overlap_param_gather && !shards_optimizer_state()) {
    throw UserError("--overlap-param-gather needs --use-distributed-optimizer: add it or drop the overlap");
  }
  if (overlap_param_gather && !overlap_grad_reduce) {
    throw UserError("--overlap-param-gather needs --overlap-grad-reduce: add it or drop the overlap");
  }
}

void ParallelConfig::validate_fsdp() const {
  const std::string strategy =
      "--data-parallel-sharding-strategy " + std::string(to_string(data_parallel_sharding_strategy));
  if (use_megatron_fsdp && use_torch_fsdp2)
    throw UserError(
        "--use-megatron-fsdp and --use-torch-fsdp2 are two FSDP implementations: give one of them");
  if (!use_megatron_fsdp && data_parallel_sharding_strategy != DataParallelSharding::kNoShard)
    throw UserError(
        strategy + " is Megatron FSDP's: add --use-megatron-fsdp" +
        (use_torch_fsdp2 ? " instead of --use-torch-fsdp2 (which always runs optim_grads_params)" : ""));
  if (!fsdp()) return;
  const char* which = use_torch_fsdp2 ? "--use-torch-fsdp2" : "--use-megatron-fsdp";
  if (rank_order == RankOrder::kTpCpEpPpDp)
    throw UserError(std::string("--use-tp-pp-dp-mapping is not supported with ") + which +
                    " (Megatron refuses it): drop it");
  if (sharding() != DataParallelSharding::kNoShard && dp() * cp() == 1 && edp() == 1)
    throw UserError(
        std::string(which) + " with " + (use_torch_fsdp2 ? std::string("optim_grads_params") : strategy) +
        " shards over the data-parallel ranks, and dp x cp = 1 (expert-dp = 1): add data-parallel "
        "ranks (--world-size) or use --data-parallel-sharding-strategy no_shard");
}

}  // namespace megatune::layouts
