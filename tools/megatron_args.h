// MegatronArgs: the Megatron-LM flag set shared by megatune subcommands (model, parallel, batch groups),
// registered on a CLI11 app and resolved into a ModelSpec and a ParallelConfig.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "layouts/model_flags.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::tools {

// Every field is optional: unset flags keep the preset's (or Megatron's default) value.
struct MegatronArgs {
  // Model group.
  std::string model_preset;  // --model
  std::optional<int> num_layers, hidden_size, ffn_hidden_size, num_attention_heads, num_query_groups,
      kv_channels, seq_length, max_position_embeddings, vocab_size, make_vocab_size_divisible_by;
  std::optional<layouts::Normalization> normalization;                // --normalization LayerNorm | RMSNorm
  bool swiglu = false;                                                // --swiglu
  std::optional<layouts::PositionEmbedding> position_embedding_type;  // learned_absolute | rope
  bool untie_embeddings_and_output_weights = false;
  bool disable_bias_linear = false;    // --disable-bias-linear
  bool add_bias_linear = false;        // --add-bias-linear (force on)
  bool group_query_attention = false;  // --group-query-attention (Megatron needs it for groups)
  bool multi_latent_attention = false;
  bool qk_layernorm = false;  // --qk-layernorm
  std::optional<int> q_lora_rank, kv_lora_rank, qk_head_dim, qk_pos_emb_head_dim, v_head_dim;
  std::optional<double> rotary_scaling_factor, mscale, mscale_all_dim;  // MLA's YaRN
  std::optional<int> num_experts, moe_router_topk, moe_ffn_hidden_size, moe_shared_expert_intermediate_size;
  std::optional<std::string> moe_layer_freq;
  std::optional<int> mtp_num_layers;

  // Parallel group.
  std::optional<int> world_size, tensor_model_parallel_size, pipeline_model_parallel_size,
      context_parallel_size, expert_model_parallel_size, expert_tensor_parallel_size, data_parallel_size,
      num_layers_per_virtual_pipeline_stage, num_virtual_stages_per_pipeline_rank,
      decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers, microbatch_group_size_per_vp_stage,
      recompute_num_layers;
  std::optional<std::string> pipeline_model_parallel_layout, recompute_granularity, recompute_method;
  std::optional<std::string> moe_token_dispatcher_type;  // --moe-token-dispatcher-type
  bool recompute_activations = false;                    // --recompute-activations: selective
  std::vector<std::string> recompute_modules;            // --recompute-modules (selective: core_attn)
  std::optional<std::string> cp_comm_type;  // --cp-comm-type: p2p (Megatron's default) is what megatune runs
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  bool sequence_parallel = false;
  bool use_distributed_optimizer = false;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool overlap_p2p_comm = false;
  bool use_tp_pp_dp_mapping = false;
  bool use_megatron_fsdp = false;                              // --use-megatron-fsdp
  bool use_torch_fsdp2 = false;                                // --use-torch-fsdp2
  std::optional<std::string> data_parallel_sharding_strategy;  // --data-parallel-sharding-strategy

  // Batch group.
  std::optional<int> micro_batch_size, global_batch_size;
};

// --model and the model-shape flags (Megatron names).
void add_model_flags(CLI::App& app, MegatronArgs& args);
// --world-size and the parallelism flags, with aliases --tp --pp --cp --ep --dp.
void add_parallel_flags(CLI::App& app, MegatronArgs& args);
// --micro-batch-size/--mbs, --global-batch-size/--gbs.
void add_batch_flags(CLI::App& app, MegatronArgs& args);

// Parses flags a checkpoint recorded (layouts/model_flags.h: model flags, --rotary-base, --norm-epsilon)
// into `args` and `numerics`. UserError naming `source` when they do not parse.
void parse_recorded_model_flags(const std::vector<std::string>& flags, MegatronArgs& args,
                                layouts::ModelNumerics& numerics, const std::string& source);
// The model-group flags (add_model_flags) given on `app`'s command line, as "--name", except those in
// `except`.
std::vector<std::string> given_model_flags(const CLI::App& app, const std::vector<std::string>& except = {});

// The preset (or an empty custom model) with every given flag applied; validated. UserError on bad input.
layouts::ModelSpec resolve_model(const MegatronArgs& args);
// The parallel + batch flags as a ParallelConfig (not yet validated against a model: call
// config.validate(model)). World size: --world-size, else tp*cp*pp*dp when --dp is given, else tp*cp*pp.
layouts::ParallelConfig resolve_parallel(const MegatronArgs& args);

}  // namespace megatune::tools
