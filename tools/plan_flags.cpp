// Megatron flags into plan's search space: pinned knobs (full recomputation's method and unit size among
// them) and the settings of every candidate.
#include "tools/plan_flags.h"

#include <string>

#include "base/user_error.h"

namespace megatune::tools {

void pin_recompute(const MegatronArgs& a, planner::SearchSpace& space) {
  if (a.recompute_granularity)
    space.recompute = {layouts::parse_recompute_granularity(*a.recompute_granularity)};
  const bool method = a.recompute_method && *a.recompute_method != "none";
  if (!method && !a.recompute_num_layers) return;
  if (a.recompute_granularity && space.recompute.front() != layouts::RecomputeGranularity::kFull)
    throw UserError(
        "--recompute-method / --recompute-num-layers apply only to --recompute-granularity full: "
        "drop them or use full recomputation");
  if (!method)
    throw UserError("--recompute-num-layers " + std::to_string(*a.recompute_num_layers) +
                    " needs --recompute-method uniform (layers per unit) or block (layers recomputed per "
                    "chunk): add one");
  if (a.recompute_num_layers && *a.recompute_num_layers < 1)
    throw UserError("--recompute-num-layers " + std::to_string(*a.recompute_num_layers) +
                    " must be at least 1: give 1 or more");
  // The method and its layers pin every full candidate (the method alone: 1 layer, as uniform's default).
  space.recompute = {layouts::RecomputeGranularity::kFull};
  space.recompute_method = layouts::parse_recompute_method(*a.recompute_method);
  space.recompute_num_layers = a.recompute_num_layers ? *a.recompute_num_layers : 1;
  space.recompute_pinned = true;
}

void pin_search_knobs(const MegatronArgs& a, planner::SearchSpace& space) {
  if (a.tensor_model_parallel_size) space.tp = {*a.tensor_model_parallel_size};
  if (a.pipeline_model_parallel_size) space.pp = {*a.pipeline_model_parallel_size};
  if (a.context_parallel_size) space.cp = {*a.context_parallel_size};
  if (a.data_parallel_size) space.dp = *a.data_parallel_size;
  if (a.expert_model_parallel_size) space.ep = {*a.expert_model_parallel_size};
  if (a.expert_tensor_parallel_size) space.etp = {*a.expert_tensor_parallel_size};
  if (a.micro_batch_size) space.micro_batch = {*a.micro_batch_size};
  pin_recompute(a, space);
  if (a.use_distributed_optimizer) {
    space.distributed_optimizer = {true};
    space.fsdp.clear();
  }
  if (a.use_megatron_fsdp || a.use_torch_fsdp2) {  // the FSDP strategy given, nothing else
    space.distributed_optimizer.clear();
    space.fsdp = {a.use_torch_fsdp2 ? layouts::DataParallelSharding::kOptimGradsParams
                  : a.data_parallel_sharding_strategy
                      ? layouts::parse_data_parallel_sharding(*a.data_parallel_sharding_strategy)
                      : layouts::DataParallelSharding::kNoShard};
  }
  if (a.pipeline_model_parallel_layout) space.pipeline_layout = *a.pipeline_model_parallel_layout;
  if (a.num_virtual_stages_per_pipeline_rank) space.virtual_stages = *a.num_virtual_stages_per_pipeline_rank;
  if (a.num_layers_per_virtual_pipeline_stage)
    space.layers_per_virtual_stage = *a.num_layers_per_virtual_pipeline_stage;
  for (const std::optional<int>& layers :
       {a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers})
    if (layers && *layers < 0) throw UserError("--decoder-first/last-pipeline-num-layers must be at least 0");
  if (a.decoder_first_pipeline_num_layers) space.first_stage_layers = *a.decoder_first_pipeline_num_layers;
  if (a.decoder_last_pipeline_num_layers) space.last_stage_layers = *a.decoder_last_pipeline_num_layers;
  space.account_for_embedding = a.account_for_embedding_in_pipeline_split;
  space.account_for_loss = a.account_for_loss_in_pipeline_split;
  if (a.microbatch_group_size_per_vp_stage)
    space.microbatch_group_size = *a.microbatch_group_size_per_vp_stage;
  if (a.moe_token_dispatcher_type)
    space.moe_dispatcher = layouts::parse_moe_dispatcher(*a.moe_token_dispatcher_type);
  if (a.use_tp_pp_dp_mapping) space.rank_order = layouts::RankOrder::kTpCpEpPpDp;
  if (a.sequence_parallel) space.sequence_parallel = {true};
}

}  // namespace megatune::tools
