// ParallelConfig: a Megatron parallel layout (TP/PP/DP/CP/EP/ETP, VPP or a layout string, batch sizes,
// recomputation, optimizer sharding, Megatron FSDP) and its validation against a model and a world size.
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "layouts/model_spec.h"
#include "layouts/pipeline_layout.h"

namespace megatune::layouts {

enum class RecomputeGranularity { kNone, kSelective, kFull };
enum class RecomputeMethod { kNone, kUniform, kBlock };
// Megatron's rank order; first token varies fastest. kTpCpEpPpDp is --use-tp-pp-dp-mapping.
enum class RankOrder { kTpCpEpDpPp, kTpCpEpPpDp };

std::string_view to_string(RecomputeGranularity granularity);  // "none" | "selective" | "full"
std::string_view to_string(RecomputeMethod method);            // "none" | "uniform" | "block"
std::string_view to_string(RankOrder order);                   // "tp-cp-ep-dp-pp" | "tp-cp-ep-pp-dp"
RecomputeGranularity parse_recompute_granularity(std::string_view text);  // UserError on bad text
RecomputeMethod parse_recompute_method(std::string_view text);
RankOrder parse_rank_order(std::string_view text);

// --moe-token-dispatcher-type (token_dispatcher.py): alltoall (permute, all-to-all over EP, all-gather over
// ETP) or allgather (all-gather over the tp-ep group, local experts over every gathered token,
// reduce-scatter back). megatune defaults to alltoall, the dispatcher expert parallelism is run with
// (Megatron's own default is allgather).
enum class MoeDispatcher { kAllToAll, kAllGather };
MoeDispatcher parse_moe_dispatcher(std::string_view text);  // UserError naming the flag

// What the data-parallel ranks (dp x cp; the routed experts: expert-dp) shard, Megatron FSDP's
// --data-parallel-sharding-strategy: no_shard (DDP), optim (the fp32 main parameters and AdamW moments, as
// --use-distributed-optimizer), optim_grads (also the reduced gradients, reduce-scattered and kept
// sharded), optim_grads_params (ZeRO-3: also the model parameters, all-gathered per layer right before its
// forward and again before its backward, and released after use).
enum class DataParallelSharding { kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
std::string_view to_string(DataParallelSharding sharding);                 // "no_shard" | "optim" | ...
DataParallelSharding parse_data_parallel_sharding(std::string_view text);  // UserError naming the flag

struct ParallelConfig {
  int world_size = 1;                             // --world-size (GPUs)
  int tensor_model_parallel_size = 1;             // --tensor-model-parallel-size / --tp
  int pipeline_model_parallel_size = 1;           // --pipeline-model-parallel-size / --pp
  int context_parallel_size = 1;                  // --context-parallel-size / --cp
  int expert_model_parallel_size = 1;             // --expert-model-parallel-size / --ep
  int expert_tensor_parallel_size = 0;            // --expert-tensor-parallel-size; 0: = tp
  int data_parallel_size_requested = 0;           // --dp; 0: derived from the world size
  int num_layers_per_virtual_pipeline_stage = 0;  // --num-layers-per-virtual-pipeline-stage; 0: none
  int num_virtual_stages_per_pipeline_rank = 0;   // --num-virtual-stages-per-pipeline-rank; 0: none
  std::string pipeline_model_parallel_layout;     // --pipeline-model-parallel-layout; "": none
  int decoder_first_pipeline_num_layers = -1;     // --decoder-first-pipeline-num-layers; -1: none
  int decoder_last_pipeline_num_layers = -1;      // --decoder-last-pipeline-num-layers; -1: none
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // --sequence-parallel. Like Megatron, it is accepted and ignored when tp == 1
  // (see sequence_parallel_enabled()).
  bool sequence_parallel = false;
  int micro_batch_size = 1;   // --micro-batch-size / --mbs
  int global_batch_size = 0;  // --global-batch-size / --gbs; 0: mbs * dp
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  RecomputeMethod recompute_method = RecomputeMethod::kNone;
  int recompute_num_layers = 0;  // --recompute-num-layers; 0: not given
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool overlap_p2p_comm = false;               // lets VPP run with pp == 2
  int microbatch_group_size_per_vp_stage = 0;  // --microbatch-group-size-per-virtual-pipeline-stage; 0: pp
  RankOrder rank_order = RankOrder::kTpCpEpDpPp;
  MoeDispatcher moe_token_dispatcher_type = MoeDispatcher::kAllToAll;  // --moe-token-dispatcher-type
  // Megatron FSDP (--use-megatron-fsdp, with --data-parallel-sharding-strategy) or --use-torch-fsdp2 (run as
  // optim_grads_params). Under either, --use-distributed-optimizer names the FSDP's own optimizer sharding.
  bool use_megatron_fsdp = false;
  bool use_torch_fsdp2 = false;
  DataParallelSharding data_parallel_sharding_strategy = DataParallelSharding::kNoShard;

  // Short names; the derived sizes assume the division holds (validate() checks it).
  int tp() const { return tensor_model_parallel_size; }
  int pp() const { return pipeline_model_parallel_size; }
  int cp() const { return context_parallel_size; }
  int ep() const { return expert_model_parallel_size; }
  int etp() const {
    return expert_tensor_parallel_size > 0 ? expert_tensor_parallel_size : tensor_model_parallel_size;
  }
  int dp() const;   // world / (tp * cp * pp)
  int edp() const;  // world / (etp * ep * pp)
  int micro_batch_group_size() const {
    return microbatch_group_size_per_vp_stage > 0 ? microbatch_group_size_per_vp_stage : pp();
  }
  bool fsdp() const { return use_megatron_fsdp || use_torch_fsdp2; }
  // The sharding run: the FSDP's; without FSDP optim with --use-distributed-optimizer, else no_shard.
  DataParallelSharding sharding() const;
  bool shards_optimizer_state() const { return sharding() != DataParallelSharding::kNoShard; }
  bool shards_gradients() const { return sharding() >= DataParallelSharding::kOptimGrads; }
  bool shards_parameters() const { return sharding() == DataParallelSharding::kOptimGradsParams; }
  bool sequence_parallel_enabled() const { return sequence_parallel && tensor_model_parallel_size > 1; }
  int resolved_global_batch_size() const;  // global_batch_size or mbs * dp
  int num_microbatches() const;            // gbs / (mbs * dp)
  // Model chunks per pp rank: from the layout string, --num-virtual-stages-per-pipeline-rank, or
  // --num-layers-per-virtual-pipeline-stage (needs the model's layer count); 1 without VPP.
  int vpp(const ModelSpec& model) const;

  // The stage layout used: the parsed layout string, or the one Megatron derives from the other flags.
  PipelineLayout resolved_pipeline_layout(const ModelSpec& model) const;

  // Checks every rule of Megatron (reference megatron.md §1, §3, §6) and this tool against the model:
  // divisibility of heads / groups / ffn / experts / sequence / vocab work, world = tp*cp*dp*pp =
  // etp*ep*edp*pp, batch divisibility, VPP and interleaving constraints (p <= g <= m, m % g == 0 or >= p),
  // layout string rules, SP with MoE+EP+TP, recomputation and optimizer flag combinations.
  // Throws UserError: one line naming the flag(s) and the way out. `resolved_layout`, when given, is
  // resolved_pipeline_layout(model), already built by the caller (not parsed again).
  void validate(const ModelSpec& model, const PipelineLayout* resolved_layout = nullptr) const;

 private:
  void validate_fsdp() const;  // the FSDP flags' rules (part of validate)
};

}  // namespace megatune::layouts
