// MegatronArgs: registers Megatron-LM's model / parallel / batch flags on a CLI11 app and resolves them.
#include "tools/megatron_args.h"

#include <algorithm>
#include <string>

#include "base/user_error.h"
#include "tools/input_checks.h"

namespace megatune::tools {

namespace {

void int_option(CLI::App& app, const std::string& names, std::optional<int>& target,
                const std::string& help) {
  app.add_option_function<int>(
      names, [&target](const int& value) { target = value; }, help);
}

// Parallel sizes and batch sizes: whole numbers from 1 up to a bound no product of them can overflow.
constexpr long long kMaxSize = 1 << 20;

void size_option(CLI::App& app, const std::string& names, std::optional<int>& target,
                 const std::string& help) {
  app.add_option_function<int>(
         names, [&target](const int& value) { target = value; }, help)
      ->check(integer_between(1, kMaxSize));
}

CLI::Option* string_option(CLI::App& app, const std::string& names, std::optional<std::string>& target,
                           const std::string& help) {
  return app.add_option_function<std::string>(
      names, [&target](const std::string& value) { target = value; }, help);
}

bool all_digits(const std::string& text) {
  if (text.empty()) return false;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
  }
  return true;
}

}  // namespace

void add_model_flags(CLI::App& app, MegatronArgs& args) {
  std::string presets;
  for (const auto& name : layouts::model_preset_names()) {
    presets += presets.empty() ? "" : ", ";
    presets += name;
  }
  app.add_option("--model", args.model_preset, "Model preset (flags below override its fields): " + presets)
      ->group("Model");
  const auto model = [&](auto&&... a) { int_option(app, a...); };
  model("--num-layers", args.num_layers, "Decoder layers (MTP layers excluded)");
  model("--hidden-size", args.hidden_size, "Hidden size h");
  model("--ffn-hidden-size", args.ffn_hidden_size,
        "MLP intermediate size (default 4h, or 8h/3 rounded to 64 with SwiGLU)");
  model("--num-attention-heads", args.num_attention_heads, "Attention heads");
  model("--num-query-groups", args.num_query_groups, "Key/value groups for GQA (default: one per head)");
  model("--kv-channels", args.kv_channels, "Head dimension (default h / heads)");
  model("--seq-length", args.seq_length, "Sequence length");
  model("--max-position-embeddings", args.max_position_embeddings,
        "Learned position table size (default seq length)");
  model("--vocab-size", args.vocab_size, "Tokenizer vocabulary (padded like Megatron)");
  model("--make-vocab-size-divisible-by", args.make_vocab_size_divisible_by,
        "Vocabulary padding multiple (default 128)");
  add_choice_option(
      app, "--normalization", args.normalization,
      {{"LayerNorm", layouts::Normalization::kLayerNorm}, {"RMSNorm", layouts::Normalization::kRMSNorm}},
      "LayerNorm or RMSNorm");
  app.add_flag("--swiglu", args.swiglu, "SwiGLU MLP activation (default GELU)");
  add_choice_option(app, "--position-embedding-type", args.position_embedding_type,
                    {{"learned_absolute", layouts::PositionEmbedding::kLearnedAbsolute},
                     {"rope", layouts::PositionEmbedding::kRope}},
                    "learned_absolute or rope");
  app.add_flag("--untie-embeddings-and-output-weights", args.untie_embeddings_and_output_weights,
               "Separate output layer weights");
  app.add_flag("--disable-bias-linear", args.disable_bias_linear, "No biases in linear layers");
  app.add_flag("--add-bias-linear", args.add_bias_linear,
               "Biases in linear layers (overrides a preset without them)");
  app.add_flag("--group-query-attention", args.group_query_attention,
               "Accepted for Megatron compatibility (--num-query-groups alone enables GQA here)");
  app.add_flag("--multi-latent-attention", args.multi_latent_attention, "Multi-latent attention (DeepSeek)");
  app.add_flag("--qk-layernorm", args.qk_layernorm,
               "Norm of each query and key head before RoPE (Qwen3's q_norm / k_norm); under multi-latent "
               "attention the q and kv latent norms");
  model("--q-lora-rank", args.q_lora_rank, "MLA query compression rank (0: none)");
  model("--kv-lora-rank", args.kv_lora_rank, "MLA key/value compression rank");
  model("--qk-head-dim", args.qk_head_dim, "MLA query/key head dim (non-rotary part)");
  model("--qk-pos-emb-head-dim", args.qk_pos_emb_head_dim, "MLA rotary head dim");
  model("--v-head-dim", args.v_head_dim, "MLA value head dim");
  app.add_option("--rotary-scaling-factor", args.rotary_scaling_factor,
                 "MLA's YaRN factor (Megatron's rope type of multi-latent attention; 1: plain RoPE; other "
                 "models' RoPE ignores it, as Megatron's)");
  app.add_option("--mscale", args.mscale, "MLA's YaRN mscale (Megatron's default 1.0)");
  app.add_option("--mscale-all-dim", args.mscale_all_dim,
                 "MLA's YaRN mscale_all_dim (Megatron's default 0.0)");
  model("--num-experts", args.num_experts, "Routed experts per MoE layer");
  model("--moe-router-topk", args.moe_router_topk, "Experts per token");
  model("--moe-ffn-hidden-size", args.moe_ffn_hidden_size, "Expert MLP intermediate size");
  model("--moe-shared-expert-intermediate-size", args.moe_shared_expert_intermediate_size,
        "Shared expert size");
  string_option(app, "--moe-layer-freq", args.moe_layer_freq,
                "k (every k-th layer is MoE) or a pattern like ([0]*3+[1]*58)");
  model("--mtp-num-layers", args.mtp_num_layers, "Multi-token-prediction layers");
  for (CLI::Option* option : app.get_options()) {
    if (option->get_group() == "Options") option->group("Model");
  }
}

void add_parallel_flags(CLI::App& app, MegatronArgs& args) {
  const auto option = [&](auto&&... a) { int_option(app, a...); };
  const auto sized = [&](auto&&... a) { size_option(app, a...); };
  sized("--world-size", args.world_size, "GPUs (default tp x cp x pp x dp)");
  sized("--tensor-model-parallel-size,--tp", args.tensor_model_parallel_size, "Tensor parallel size");
  sized("--pipeline-model-parallel-size,--pp", args.pipeline_model_parallel_size, "Pipeline parallel size");
  sized("--context-parallel-size,--cp", args.context_parallel_size, "Context parallel size");
  string_option(app, "--cp-comm-type", args.cp_comm_type, "Context-parallel attention: p2p (the ring)");
  sized("--expert-model-parallel-size,--ep", args.expert_model_parallel_size, "Expert parallel size");
  sized("--expert-tensor-parallel-size,--etp", args.expert_tensor_parallel_size,
        "Expert tensor parallel size (default tp)");
  string_option(app, "--moe-token-dispatcher-type", args.moe_token_dispatcher_type,
                "MoE token dispatch: alltoall (default) or allgather");
  sized("--data-parallel-size,--dp", args.data_parallel_size,
        "Data parallel size (default: derived from --world-size)");
  sized("--num-layers-per-virtual-pipeline-stage", args.num_layers_per_virtual_pipeline_stage,
        "Layers per virtual pipeline stage (interleaved 1F1B)");
  sized("--num-virtual-stages-per-pipeline-rank", args.num_virtual_stages_per_pipeline_rank,
        "Virtual pipeline stages per rank (interleaved 1F1B)");
  string_option(app, "--pipeline-model-parallel-layout", args.pipeline_model_parallel_layout,
                "Stage layout, e.g. 'Et*3|(tt|)*29,m|L' (E embedding, t layer, m MTP, L loss)");
  option("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers,
         "Layers on the first pp rank");
  option("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers,
         "Layers on the last pp rank");
  app.add_flag("--account-for-embedding-in-pipeline-split", args.account_for_embedding_in_pipeline_split,
               "Count the embedding as a layer when splitting");
  app.add_flag("--account-for-loss-in-pipeline-split", args.account_for_loss_in_pipeline_split,
               "Count the loss as a layer when splitting");
  sized("--microbatch-group-size-per-virtual-pipeline-stage", args.microbatch_group_size_per_vp_stage,
        "Interleaved schedule's microbatch group size (default pp)");
  app.add_flag("--sequence-parallel", args.sequence_parallel,
               "Sequence parallelism (ignored when tp = 1, like Megatron)");
  string_option(app, "--recompute-granularity", args.recompute_granularity, "selective or full")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  string_option(app, "--recompute-method", args.recompute_method, "uniform or block (full recomputation)")
      ->check(CLI::IsMember({"none", "uniform", "block"}));
  sized("--recompute-num-layers", args.recompute_num_layers,
        "Full recomputation: layers per unit (uniform) or recomputed per chunk (block)");
  app.add_flag("--recompute-activations", args.recompute_activations,
               "Megatron's shorthand for --recompute-granularity selective");
  app.add_option(
         "--recompute-modules", args.recompute_modules,
         "Selective recomputation's modules: core_attn (Megatron's default, what megatune recomputes)")
      ->expected(1, 16);
  app.add_flag("--use-distributed-optimizer", args.use_distributed_optimizer,
               "Shard optimizer state over DP");
  app.add_flag("--overlap-grad-reduce", args.overlap_grad_reduce, "Overlap gradient reduction with backward");
  app.add_flag("--overlap-param-gather", args.overlap_param_gather,
               "Overlap parameter all-gather with forward");
  app.add_flag("--overlap-p2p-comm", args.overlap_p2p_comm, "Overlap pipeline p2p with compute");
  app.add_flag("--use-tp-pp-dp-mapping", args.use_tp_pp_dp_mapping, "Rank order tp-cp-ep-pp-dp");
  app.add_flag("--use-megatron-fsdp", args.use_megatron_fsdp,
               "Megatron FSDP (what it shards: --data-parallel-sharding-strategy)");
  string_option(app, "--data-parallel-sharding-strategy", args.data_parallel_sharding_strategy,
                "Megatron FSDP: no_shard, optim, optim_grads or optim_grads_params (ZeRO-3)")
      ->check(CLI::IsMember({"no_shard", "optim", "optim_grads", "optim_grads_params"}));
  app.add_flag("--use-torch-fsdp2", args.use_torch_fsdp2, "Torch FSDP2 (run as optim_grads_params)");
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_group() == "Options") opt->group("Parallelism");
  }
}

void add_batch_flags(CLI::App& app, MegatronArgs& args) {
  size_option(app, "--micro-batch-size,--mbs", args.micro_batch_size, "Sequences per microbatch (default 1)");
  size_option(app, "--global-batch-size,--gbs", args.global_batch_size,
              "Sequences per iteration (default micro-batch x dp)");
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_group() == "Options") opt->group("Batch");
  }
}

layouts::ModelSpec resolve_model(const MegatronArgs& args) {
  using namespace layouts;
  ModelSpec m;
  if (!args.model_preset.empty()) {
    m = model_preset(args.model_preset);
  } else {
    m.name = "custom";  // Megatron's defaults: LayerNorm, GELU, learned positions, biases, tied output
  }
  const auto set = [](int& field, const std::optional<int>& value) {
    if (value) field = *value;
  };
  set(m.num_layers, args.num_layers);
  set(m.hidden_size, args.hidden_size);
  set(m.ffn_hidden_size, args.ffn_hidden_size);
  set(m.num_attention_heads, args.num_attention_heads);
  set(m.num_query_groups, args.num_query_groups);
  set(m.kv_channels, args.kv_channels);
  set(m.seq_length, args.seq_length);
  set(m.max_position_embeddings, args.max_position_embeddings);
  set(m.vocab_size, args.vocab_size);
  set(m.make_vocab_size_divisible_by, args.make_vocab_size_divisible_by);
  set(m.q_lora_rank, args.q_lora_rank);
  set(m.kv_lora_rank, args.kv_lora_rank);
  set(m.qk_head_dim, args.qk_head_dim);
  set(m.qk_pos_emb_head_dim, args.qk_pos_emb_head_dim);
  set(m.v_head_dim, args.v_head_dim);
  if (args.rotary_scaling_factor) m.rotary_scaling_factor = *args.rotary_scaling_factor;
  if (args.mscale) m.mscale = *args.mscale;
  if (args.mscale_all_dim) m.mscale_all_dim = *args.mscale_all_dim;
  set(m.num_experts, args.num_experts);
  set(m.moe_router_topk, args.moe_router_topk);
  set(m.moe_ffn_hidden_size, args.moe_ffn_hidden_size);
  set(m.moe_shared_expert_intermediate_size, args.moe_shared_expert_intermediate_size);
  set(m.mtp_num_layers, args.mtp_num_layers);
  if (args.normalization) m.normalization = *args.normalization;
  if (args.swiglu) m.activation = Activation::kSwiglu;
  if (args.position_embedding_type) m.position_embedding = *args.position_embedding_type;
  if (args.untie_embeddings_and_output_weights) m.untie_embeddings_and_output_weights = true;
  if (args.disable_bias_linear && args.add_bias_linear) {
    throw UserError("--disable-bias-linear and --add-bias-linear contradict each other: give one");
  }
  if (args.disable_bias_linear) m.add_bias_linear = false;
  if (args.add_bias_linear) m.add_bias_linear = true;
  if (args.multi_latent_attention) m.multi_latent_attention = true;
  if (args.qk_layernorm) m.qk_layernorm = true;
  if (m.multi_latent_attention && !m.qk_layernorm)
    throw UserError(
        "--multi-latent-attention without --qk-layernorm: megatune's MLA always normalizes the q and kv "
        "latents; add --qk-layernorm");
  if (args.moe_layer_freq) {
    if (all_digits(*args.moe_layer_freq)) {
      parse_moe_layer_freq(*args.moe_layer_freq, m.num_layers > 0 ? m.num_layers : 1);  // range check
      m.moe_layer_freq = std::stoi(*args.moe_layer_freq);
      m.moe_layer_pattern.clear();
    } else {
      m.moe_layer_pattern = parse_moe_layer_freq(*args.moe_layer_freq, m.num_layers);
    }
  }
  m.validate();
  return m;
}

void parse_recorded_model_flags(const std::vector<std::string>& flags, MegatronArgs& args,
                                layouts::ModelNumerics& numerics, const std::string& source) {
  CLI::App app;
  add_model_flags(app, args);
  app.add_option("--rotary-base", numerics.rotary_base);
  app.add_option("--norm-epsilon", numerics.norm_epsilon);
  std::vector<std::string> reversed(flags.rbegin(), flags.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw UserError(source + " records model flags megatune cannot read (" + e.what() +
                    "); give the model flags on the command line");
  }
  // Saves from before --qk-layernorm was recorded: megatune's MLA always had its latent norms.
  if (args.multi_latent_attention) args.qk_layernorm = true;
}

std::vector<std::string> given_model_flags(const CLI::App& app, const std::vector<std::string>& except) {
  CLI::App model;
  MegatronArgs unused;
  add_model_flags(model, unused);
  std::vector<std::string> given;
  for (const CLI::Option* option : model.get_options()) {
    if (option->get_lnames().empty()) continue;
    const std::string name = "--" + option->get_lnames().front();
    if (std::find(except.begin(), except.end(), name) != except.end()) continue;
    if (app.count(name) > 0) given.push_back(name);
  }
  return given;
}

layouts::ParallelConfig resolve_parallel(const MegatronArgs& args) {
  layouts::ParallelConfig c;
  const auto set = [](int& field, const std::optional<int>& value) {
    if (value) field = *value;
  };
  set(c.tensor_model_parallel_size, args.tensor_model_parallel_size);
  set(c.pipeline_model_parallel_size, args.pipeline_model_parallel_size);
  set(c.context_parallel_size, args.context_parallel_size);
  set(c.expert_model_parallel_size, args.expert_model_parallel_size);
  set(c.expert_tensor_parallel_size, args.expert_tensor_parallel_size);
  if (args.moe_token_dispatcher_type)
    c.moe_token_dispatcher_type = layouts::parse_moe_dispatcher(*args.moe_token_dispatcher_type);
  set(c.data_parallel_size_requested, args.data_parallel_size);
  set(c.num_layers_per_virtual_pipeline_stage, args.num_layers_per_virtual_pipeline_stage);
  set(c.num_virtual_stages_per_pipeline_rank, args.num_virtual_stages_per_pipeline_rank);
  set(c.decoder_first_pipeline_num_layers, args.decoder_first_pipeline_num_layers);
  set(c.decoder_last_pipeline_num_layers, args.decoder_last_pipeline_num_layers);
  set(c.microbatch_group_size_per_vp_stage, args.microbatch_group_size_per_vp_stage);
  set(c.recompute_num_layers, args.recompute_num_layers);
  set(c.micro_batch_size, args.micro_batch_size);
  set(c.global_batch_size, args.global_batch_size);
  if (args.pipeline_model_parallel_layout) {
    c.pipeline_model_parallel_layout = *args.pipeline_model_parallel_layout;
    if (c.pipeline_model_parallel_layout.empty()) {
      throw UserError(
          "--pipeline-model-parallel-layout is empty: give a layout such as 'Et*3|(tt|)*29,m|L' or drop it");
    }
  }
  if (args.cp_comm_type && *args.cp_comm_type != "p2p") {
    const std::string& type = *args.cp_comm_type;
    const bool megatron = type == "all_gather" || type == "a2a" || type == "a2a+p2p";
    throw UserError(
        "--cp-comm-type '" + type + "' " +
        (megatron ? "is not run or priced by megatune yet" : "is not one of p2p, all_gather, a2a, a2a+p2p") +
        ": use --cp-comm-type p2p (Megatron's default ring)");
  }
  if (args.recompute_granularity)
    c.recompute_granularity = layouts::parse_recompute_granularity(*args.recompute_granularity);
  if (args.recompute_activations) {  // Megatron: recompute_granularity = 'selective'
    if (args.recompute_granularity && c.recompute_granularity != layouts::RecomputeGranularity::kSelective)
      throw UserError(
          "--recompute-activations is --recompute-granularity selective: drop one of it and "
          "--recompute-granularity " +
          *args.recompute_granularity);
    c.recompute_granularity = layouts::RecomputeGranularity::kSelective;
  }
  for (const std::string& module : args.recompute_modules) {
    if (module != "core_attn")
      throw UserError("--recompute-modules " + module +
                      ": megatune's selective recomputation recomputes core attention only; use "
                      "--recompute-modules core_attn, or --recompute-granularity full for whole layers");
    if (c.recompute_granularity != layouts::RecomputeGranularity::kSelective)
      throw UserError(
          "--recompute-modules applies to selective recomputation: add --recompute-granularity "
          "selective (or --recompute-activations), or drop --recompute-modules");
  }
  if (args.recompute_method) c.recompute_method = layouts::parse_recompute_method(*args.recompute_method);
  c.account_for_embedding_in_pipeline_split = args.account_for_embedding_in_pipeline_split;
  c.account_for_loss_in_pipeline_split = args.account_for_loss_in_pipeline_split;
  c.sequence_parallel = args.sequence_parallel;
  c.use_distributed_optimizer = args.use_distributed_optimizer;
  c.overlap_grad_reduce = args.overlap_grad_reduce;
  c.overlap_param_gather = args.overlap_param_gather;
  c.overlap_p2p_comm = args.overlap_p2p_comm;
  c.use_megatron_fsdp = args.use_megatron_fsdp;
  c.use_torch_fsdp2 = args.use_torch_fsdp2;
  if (args.data_parallel_sharding_strategy)
    c.data_parallel_sharding_strategy =
        layouts::parse_data_parallel_sharding(*args.data_parallel_sharding_strategy);
  c.rank_order =
      args.use_tp_pp_dp_mapping ? layouts::RankOrder::kTpCpEpPpDp : layouts::RankOrder::kTpCpEpDpPp;
  if (args.world_size) {
    c.world_size = *args.world_size;
  } else {
    const int64_t world = int64_t{c.tp()} * c.cp() * c.pp() *
                          (c.data_parallel_size_requested > 0 ? c.data_parallel_size_requested : 1);
    if (world < 1 || world > (1 << 20)) {
      throw UserError("tp x cp x pp x dp = " + std::to_string(world) +
                      " is not a usable world size: check the sizes");
    }
    c.world_size = static_cast<int>(world);
  }
  return c;
}

}  // namespace megatune::tools
