// Plan reports: table, JSON and the two argument lists of a planned layout.
#include "planner/plan_report.h"

#include <cstdio>
#include <sstream>

#include "cost_models/op_cost.h"
#include "planner/chrome_trace.h"

namespace megatune::planner {

using layouts::ModelSpec;
using layouts::ParallelConfig;
using layouts::RecomputeGranularity;

namespace {

// The table's recompute column: "none", "selective", "full" (uniform 1), "full block 4", "full uniform 2".
std::string recompute_cell(const ParallelConfig& cfg) {
  std::string cell(layouts::to_string(cfg.recompute_granularity));
  if (cfg.recompute_granularity == RecomputeGranularity::kFull &&
      !(cfg.recompute_method == layouts::RecomputeMethod::kUniform && cfg.recompute_num_layers == 1))
    cell += " " + std::string(layouts::to_string(cfg.recompute_method)) + " " +
            std::to_string(cfg.recompute_num_layers);
  return cell;
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

// --moe-token-dispatcher-type's value.
std::string dispatcher_name(const ParallelConfig& c) {
  return c.moe_token_dispatcher_type == layouts::MoeDispatcher::kAllGather ? "allgather" : "alltoall";
}

std::string gib(double bytes) { return fixed(bytes / (1024.0 * 1024.0 * 1024.0), 1); }

void add(std::vector<std::string>& args, const std::string& flag, long long value) {
  args.push_back(flag);
  args.push_back(std::to_string(value));
}
void add(std::vector<std::string>& args, const std::string& flag, const std::string& value) {
  args.push_back(flag);
  args.push_back(value);
}

}  // namespace

std::string format_plan_table(const PlanResult& result) {
  const std::vector<std::string> headers = {
      "#",         "layout", "tp",   "pp",       "vpp", "dp",    "cp",        "ep",     "etp",      "mbs",
      "recompute", "sp",     "dopt", "step (s)", "MFU", "tok/s", "mem (GiB)", "bubble", "exp. comm"};
  std::vector<std::vector<std::string>> rows;
  const std::string capacity = gib(static_cast<double>(result.memory_capacity_bytes));
  for (std::size_t i = 0; i < result.ranked.size(); ++i) {
    const PlanCandidate& c = result.ranked[i];
    const ParallelConfig& cfg = c.config;
    const SimulationResult& s = c.simulation;
    std::string layout = c.layout;
    if (layout.size() > 28) layout = layout.substr(0, 25) + "...";
    rows.push_back({std::to_string(i + 1), layout, std::to_string(cfg.tp()), std::to_string(cfg.pp()),
                    std::to_string(c.vpp), std::to_string(cfg.dp()), std::to_string(cfg.cp()),
                    std::to_string(cfg.ep()), std::to_string(cfg.etp()), std::to_string(cfg.micro_batch_size),
                    recompute_cell(cfg), cfg.sequence_parallel_enabled() ? "on" : "off",
                    cfg.fsdp() ? "fsdp " + std::string(layouts::to_string(cfg.sharding()))
                    : cfg.use_distributed_optimizer ? "on"
                                                    : "off",
                    fixed(s.step_time_s, 3), fixed(100.0 * s.mfu, 1) + "%", fixed(s.tokens_per_s, 0),
                    gib(static_cast<double>(c.peak_memory_bytes)) + "/" + capacity,
                    fixed(100.0 * s.bubble_fraction, 1) + "%", fixed(s.exposed_comm_s * 1e3, 0) + " ms"});
  }
  std::vector<std::size_t> width(headers.size());
  for (std::size_t j = 0; j < headers.size(); ++j) {
    width[j] = headers[j].size();
    for (const auto& row : rows) width[j] = std::max(width[j], row[j].size());
  }
  std::ostringstream out;
  auto emit = [&](const std::vector<std::string>& row) {
    for (std::size_t j = 0; j < row.size(); ++j) {
      const bool left = j == 1;
      const std::string pad(width[j] - row[j].size(), ' ');
      out << (j ? "  " : "") << (left ? row[j] + pad : pad + row[j]);
    }
    out << '\n';
  };
  emit(headers);
  std::size_t total = 0;
  for (std::size_t w : width) total += w + 2;
  out << std::string(total - 2, '-') << '\n';
  for (const auto& row : rows) emit(row);
  return out.str();
}

std::string describe_model(const ModelSpec& m) {
  std::ostringstream out;
  out << m.name << ": " << m.num_layers << " layers, hidden " << m.hidden_size << ", ffn " << m.ffn_size()
      << ", heads " << m.num_attention_heads << ", query groups " << m.query_groups() << ", head dim "
      << m.head_dim() << ", seq " << m.seq_length << ", positions " << m.max_positions() << ", vocab "
      << m.vocab_size << " (multiple " << m.make_vocab_size_divisible_by << "), "
      << layouts::to_string(m.normalization) << ", " << layouts::to_string(m.activation) << ", "
      << layouts::to_string(m.position_embedding) << ", "
      << (m.untie_embeddings_and_output_weights ? "untied" : "tied") << " output, "
      << (m.add_bias_linear ? "biases" : "no biases");
  if (m.qk_layernorm) out << ", qk-layernorm";
  if (m.multi_latent_attention)
    out << ", MLA q-lora " << m.q_lora_rank << " kv-lora " << m.kv_lora_rank << " qk " << m.qk_head_dim << "+"
        << m.qk_pos_emb_head_dim << " v " << m.v_head_dim;
  if (m.is_moe()) {
    out << ", " << m.num_experts << " experts top-" << m.moe_router_topk << " ffn " << m.moe_ffn_size()
        << " shared " << m.moe_shared_expert_intermediate_size << ", MoE layers ";
    for (int l = 0; l < m.num_layers; ++l) out << (m.is_moe_layer(l) ? '1' : '0');
  }
  if (m.mtp_num_layers > 0) out << ", " << m.mtp_num_layers << " MTP layers";
  out << "; " << m.total_parameters() << " parameters";
  return out.str();
}

std::string describe_run_settings(const ModelSpec& model, const ParallelConfig& c) {
  std::ostringstream out;
  out << "tp" << c.tp() << " pp" << c.pp() << " vpp" << c.vpp(model) << " dp" << c.dp() << " cp" << c.cp()
      << " ep" << c.ep() << " etp" << c.etp() << (c.sequence_parallel_enabled() ? " sp" : "")
      << (c.use_distributed_optimizer ? " dist-opt" : "")
      << (c.fsdp() ? " fsdp " + std::string(layouts::to_string(c.sharding())) : "") << "; layout "
      << c.resolved_pipeline_layout(model).to_string() << "; micro-batch " << c.micro_batch_size
      << ", global batch " << c.resolved_global_batch_size() << "; recompute "
      << layouts::to_string(c.recompute_granularity);
  if (c.recompute_granularity == RecomputeGranularity::kFull)
    out << " (" << layouts::to_string(c.recompute_method) << ", " << c.recompute_num_layers
        << (c.recompute_num_layers == 1 ? " layer" : " layers")
        << (c.recompute_method == layouts::RecomputeMethod::kBlock ? " per chunk)" : " per unit)");
  if (c.vpp(model) > 1) out << "; microbatch group " << c.micro_batch_group_size();
  out << "; rank order " << layouts::to_string(c.rank_order);
  if (model.is_moe()) out << "; dispatcher " << dispatcher_name(c);
  out << "; overlap" << (c.overlap_grad_reduce ? " grad-reduce" : "")
      << (c.overlap_param_gather ? " param-gather" : "") << (c.overlap_p2p_comm ? " p2p" : "");
  return out.str();
}

std::vector<std::string> parallel_arguments(const PlanCandidate& candidate) {
  const ParallelConfig& c = candidate.config;
  std::vector<std::string> args;
  add(args, "--tensor-model-parallel-size", c.tp());
  add(args, "--pipeline-model-parallel-size", c.pp());
  if (!c.pipeline_model_parallel_layout.empty()) {
    add(args, "--pipeline-model-parallel-layout", c.pipeline_model_parallel_layout);
  } else if (c.num_layers_per_virtual_pipeline_stage > 0) {
    add(args, "--num-layers-per-virtual-pipeline-stage", c.num_layers_per_virtual_pipeline_stage);
  } else if (c.num_virtual_stages_per_pipeline_rank > 0) {
    add(args, "--num-virtual-stages-per-pipeline-rank", c.num_virtual_stages_per_pipeline_rank);
  }
  if (c.decoder_first_pipeline_num_layers >= 0)
    add(args, "--decoder-first-pipeline-num-layers", c.decoder_first_pipeline_num_layers);
  if (c.decoder_last_pipeline_num_layers >= 0)
    add(args, "--decoder-last-pipeline-num-layers", c.decoder_last_pipeline_num_layers);
  if (c.account_for_embedding_in_pipeline_split) args.push_back("--account-for-embedding-in-pipeline-split");
  if (c.account_for_loss_in_pipeline_split) args.push_back("--account-for-loss-in-pipeline-split");
  if (c.microbatch_group_size_per_vp_stage > 0)
    add(args, "--microbatch-group-size-per-virtual-pipeline-stage", c.microbatch_group_size_per_vp_stage);
  if (c.rank_order == layouts::RankOrder::kTpCpEpPpDp) args.push_back("--use-tp-pp-dp-mapping");
  if (c.cp() > 1) add(args, "--context-parallel-size", c.cp());
  if (c.ep() > 1) add(args, "--expert-model-parallel-size", c.ep());
  if (c.expert_tensor_parallel_size > 0 && c.expert_tensor_parallel_size != c.tp())
    add(args, "--expert-tensor-parallel-size", c.expert_tensor_parallel_size);
  if (c.sequence_parallel_enabled()) args.push_back("--sequence-parallel");
  add(args, "--micro-batch-size", c.micro_batch_size);
  add(args, "--global-batch-size", c.resolved_global_batch_size());
  if (c.recompute_granularity != RecomputeGranularity::kNone) {
    add(args, "--recompute-granularity", std::string(layouts::to_string(c.recompute_granularity)));
    if (c.recompute_granularity == RecomputeGranularity::kFull) {
      add(args, "--recompute-method", std::string(layouts::to_string(c.recompute_method)));
      add(args, "--recompute-num-layers", c.recompute_num_layers);
    }
  }
  if (c.use_distributed_optimizer) args.push_back("--use-distributed-optimizer");
  if (c.use_torch_fsdp2) args.push_back("--use-torch-fsdp2");
  if (c.use_megatron_fsdp) {
    args.push_back("--use-megatron-fsdp");
    add(args, "--data-parallel-sharding-strategy",
        std::string(layouts::to_string(c.data_parallel_sharding_strategy)));
  }
  if (c.overlap_grad_reduce) args.push_back("--overlap-grad-reduce");
  if (c.overlap_param_gather) args.push_back("--overlap-param-gather");
  if (c.overlap_p2p_comm) args.push_back("--overlap-p2p-comm");
  return args;
}

namespace {
void model_shape_arguments(const ModelSpec& m, std::vector<std::string>& args) {
  add(args, "--num-layers", m.num_layers);
  add(args, "--hidden-size", m.hidden_size);
  add(args, "--ffn-hidden-size", m.ffn_size());
  add(args, "--num-attention-heads", m.num_attention_heads);
  if (m.query_groups() != m.num_attention_heads && !m.multi_latent_attention) {
    args.push_back("--group-query-attention");
    add(args, "--num-query-groups", m.query_groups());
  }
  if (m.kv_channels > 0) add(args, "--kv-channels", m.kv_channels);
  add(args, "--seq-length", m.seq_length);
  add(args, "--max-position-embeddings", m.max_positions());
  add(args, "--vocab-size", m.vocab_size);
  if (m.make_vocab_size_divisible_by != 128)
    add(args, "--make-vocab-size-divisible-by", m.make_vocab_size_divisible_by);
  add(args, "--normalization", std::string(layouts::to_string(m.normalization)));
  if (m.activation == layouts::Activation::kSwiglu) args.push_back("--swiglu");
  add(args, "--position-embedding-type", std::string(layouts::to_string(m.position_embedding)));
  if (m.untie_embeddings_and_output_weights) args.push_back("--untie-embeddings-and-output-weights");
  if (!m.add_bias_linear) args.push_back("--disable-bias-linear");
  if (m.multi_latent_attention) {
    args.push_back("--multi-latent-attention");
    if (m.q_lora_rank > 0) add(args, "--q-lora-rank", m.q_lora_rank);
    add(args, "--kv-lora-rank", m.kv_lora_rank);
    add(args, "--qk-head-dim", m.qk_head_dim);
    add(args, "--qk-pos-emb-head-dim", m.qk_pos_emb_head_dim);
    add(args, "--v-head-dim", m.v_head_dim);
  }
  if (m.is_moe()) {
    add(args, "--num-experts", m.num_experts);
    add(args, "--moe-router-topk", m.moe_router_topk);
    add(args, "--moe-ffn-hidden-size", m.moe_ffn_size());
    if (m.moe_shared_expert_intermediate_size > 0)
      add(args, "--moe-shared-expert-intermediate-size", m.moe_shared_expert_intermediate_size);
    if (!m.moe_layer_pattern.empty()) {
      std::string pattern = "[";
      for (std::size_t i = 0; i < m.moe_layer_pattern.size(); ++i)
        pattern += (i ? "," : "") + std::to_string(m.moe_layer_pattern[i]);
      add(args, "--moe-layer-freq", pattern + "]");
    } else if (m.moe_layer_freq != 1) {
      add(args, "--moe-layer-freq", m.moe_layer_freq);
    }
  }
  if (m.mtp_num_layers > 0) add(args, "--mtp-num-layers", m.mtp_num_layers);
}
}  // namespace

namespace {
bool is_preset(const ModelSpec& model) {
  for (const std::string& name : layouts::model_preset_names())
    if (name == model.name) return true;
  return false;
}

// The flags that put back what the shape flags leave at a default the preset does not have: megatune's
// --add-bias-linear, the vocabulary multiple, an every-layer MoE frequency over a preset's pattern.
void preset_reset_arguments(const ModelSpec& preset, const ModelSpec& m, std::vector<std::string>& args) {
  if (m.add_bias_linear && !preset.add_bias_linear) args.push_back("--add-bias-linear");
  if (m.make_vocab_size_divisible_by == 128 && preset.make_vocab_size_divisible_by != 128)
    add(args, "--make-vocab-size-divisible-by", 128);
  if (m.query_groups() == m.num_attention_heads && preset.query_groups() != preset.num_attention_heads &&
      !m.multi_latent_attention)
    add(args, "--num-query-groups", m.num_attention_heads);
  if (m.is_moe() && m.moe_layer_pattern.empty() && m.moe_layer_freq == 1 &&
      (!preset.moe_layer_pattern.empty() || preset.moe_layer_freq != 1))
    add(args, "--moe-layer-freq", 1);
}
}  // namespace

std::vector<std::string> megatune_train_arguments(const ModelSpec& model, const PlanCandidate& candidate) {
  std::vector<std::string> args;
  // The preset names the run; the shape flags after it carry every field, overrides included.
  if (is_preset(model)) add(args, "--model", model.name);
  model_shape_arguments(model, args);
  if (is_preset(model)) preset_reset_arguments(layouts::model_preset(model.name), model, args);
  add(args, "--world-size", candidate.config.world_size);
  for (std::string& a : parallel_arguments(candidate)) args.push_back(std::move(a));
  if (model.is_moe()) add(args, "--moe-token-dispatcher-type", dispatcher_name(candidate.config));
  return args;
}

std::vector<std::string> megatron_arguments(const ModelSpec& model, const PlanCandidate& candidate) {
  std::vector<std::string> args;
  model_shape_arguments(model, args);
  for (std::string& a : parallel_arguments(candidate)) args.push_back(std::move(a));
  args.push_back("--bf16");
  if (model.is_moe()) {
    add(args, "--moe-token-dispatcher-type", dispatcher_name(candidate.config));
    args.push_back("--moe-grouped-gemm");
  }
  add(args, "--tokenizer-type", "NullTokenizer");
  return args;
}

std::string shell_join(const std::string& program, const std::vector<std::string>& arguments) {
  std::string out = program;
  for (const std::string& a : arguments) {
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_=./,:+") == std::string::npos;
    out += ' ';
    if (plain) {
      out += a;
    } else {
      out += '\'';
      for (char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      out += '\'';
    }
  }
  return out;
}

namespace {
std::string num(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string candidate_json_indented(const PlanCandidate& c, const std::string& indent) {
  const SimulationResult& s = c.simulation;
  const ParallelConfig& cfg = c.config;
  std::ostringstream o;
  o << indent << "{\"tp\": " << cfg.tp() << ", \"pp\": " << cfg.pp() << ", \"vpp\": " << c.vpp
    << ", \"dp\": " << cfg.dp() << ", \"cp\": " << cfg.cp() << ", \"ep\": " << cfg.ep()
    << ", \"etp\": " << cfg.etp() << ", \"micro_batch_size\": " << cfg.micro_batch_size
    << ", \"recompute\": " << json_quote(std::string(layouts::to_string(cfg.recompute_granularity)))
    << ", \"recompute_method\": "
    << (cfg.recompute_granularity == RecomputeGranularity::kFull
            ? json_quote(std::string(layouts::to_string(cfg.recompute_method)))
            : "null")
    << ", \"recompute_num_layers\": "
    << (cfg.recompute_granularity == RecomputeGranularity::kFull ? std::to_string(cfg.recompute_num_layers)
                                                                 : "null")
    << ", \"sequence_parallel\": " << (cfg.sequence_parallel_enabled() ? "true" : "false")
    << ", \"distributed_optimizer\": " << (cfg.use_distributed_optimizer ? "true" : "false")
    << ", \"fsdp\": " << (cfg.fsdp() ? json_quote(std::string(layouts::to_string(cfg.sharding()))) : "null")
    << ", \"pipeline_layout\": " << json_quote(c.layout) << ", \"step_time_s\": " << num(s.step_time_s)
    << ", \"mfu\": " << num(s.mfu) << ", \"tokens_per_s\": " << num(s.tokens_per_s)
    << ", \"peak_memory_bytes\": " << c.peak_memory_bytes
    << ", \"bubble_fraction\": " << num(s.bubble_fraction)
    << ", \"exposed_comm_s\": " << num(s.exposed_comm_s) << "}";
  return o.str();
}

std::string string_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + json_quote(items[i]);
  return out + "]";
}
}  // namespace

std::string candidate_json(const PlanCandidate& candidate) { return candidate_json_indented(candidate, ""); }

std::string plan_json(const ModelSpec& model, const cost_models::ClusterSpec& cluster,
                      const PlanResult& result, const MemoryEstimate& winner_memory,
                      const std::vector<std::string>& train_flags,
                      const std::vector<std::string>& megatron_flags) {
  const PlanCandidate& w = result.ranked.at(0);
  std::vector<std::string> train_args = megatune_train_arguments(model, w);
  train_args.insert(train_args.end(), train_flags.begin(), train_flags.end());
  std::vector<std::string> megatron_args = megatron_arguments(model, w);
  megatron_args.insert(megatron_args.end(), megatron_flags.begin(), megatron_flags.end());
  const SimulationResult& s = w.simulation;
  std::ostringstream o;
  o << "{\n";
  o << "  \"model\": " << json_quote(model.name) << ",\n";
  o << "  \"cluster\": " << json_quote(cluster.short_name()) << ",\n";
  o << "  \"world_size\": " << cluster.world_size() << ",\n";
  o << "  \"global_batch_size\": " << w.config.resolved_global_batch_size() << ",\n";
  o << "  \"seq_length\": " << model.seq_length << ",\n";
  o << "  \"plan\": " << candidate_json_indented(w, "") << ",\n";
  o << "  \"prediction\": {\"step_time_s\": " << num(s.step_time_s) << ", \"mfu\": " << num(s.mfu)
    << ", \"tflops_per_gpu\": " << num(s.tflops_per_gpu) << ", \"tokens_per_s\": " << num(s.tokens_per_s)
    << ", \"bubble_fraction\": " << num(s.bubble_fraction)
    << ", \"exposed_comm_s\": " << num(s.exposed_comm_s) << ", \"compute_s\": " << num(s.compute_s)
    << ", \"model_flops\": " << num(s.model_flops) << "},\n";
  o << "  \"op_kind_times_s\": {";
  bool first = true;
  for (int k = 0; k < kOpKindCount; ++k) {
    if (s.kind_times[k].count == 0) continue;
    o << (first ? "" : ", ") << json_quote(layouts::op_kind_name(static_cast<layouts::OpKind>(k))) << ": "
      << num(s.kind_times[k].total_s);
    first = false;
  }
  o << "},\n  \"provenance_counts\": {";
  for (int p = 0; p < kProvenanceCount; ++p) {
    o << (p ? ", " : "") << json_quote(cost_models::provenance_name(static_cast<cost_models::Provenance>(p)))
      << ": " << s.provenance_counts[p];
  }
  o << "},\n  \"memory\": {\"pp_rank\": " << winner_memory.pp_rank
    << ", \"total_bytes\": " << winner_memory.total_bytes
    << ", \"capacity_bytes\": " << result.memory_capacity_bytes << ", \"items\": [";
  for (std::size_t i = 0; i < winner_memory.items.size(); ++i) {
    o << (i ? ", " : "") << "{\"name\": " << json_quote(winner_memory.items[i].name)
      << ", \"bytes\": " << winner_memory.items[i].bytes
      << ", \"detail\": " << json_quote(winner_memory.items[i].detail) << "}";
  }
  o << "]},\n";
  o << "  \"megatune_train_args\": " << string_array(train_args) << ",\n";
  o << "  \"megatron_args\": " << string_array(megatron_args) << ",\n";
  o << "  \"why\": " << json_quote(result.why_winner) << ",\n";
  const PlanStatistics& st = result.statistics;
  o << "  \"search\": {\"enumerated\": " << st.enumerated << ", \"invalid\": " << st.invalid
    << ", \"out_of_memory\": " << st.out_of_memory << ", \"simulated\": " << st.simulated
    << ", \"failed\": " << st.failed << ", \"seconds\": " << num(st.seconds) << "},\n";
  o << "  \"ranked\": [\n";
  for (std::size_t i = 0; i < result.ranked.size(); ++i)
    o << candidate_json_indented(result.ranked[i], "    ") << (i + 1 < result.ranked.size() ? ",\n" : "\n");
  o << "  ]\n}\n";
  return o.str();
}

}  // namespace megatune::planner
