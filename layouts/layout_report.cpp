// LayoutReport: text and JSON renderings of a validated (model, parallel config) for `megatune layout`.
#include "layouts/layout_report.h"

#include <cstdio>
#include <string>

#include "base/user_error.h"
#include "layouts/flops.h"
#include "layouts/rank_grid.h"
#include "layouts/schedule.h"

namespace megatune::layouts {

namespace {

std::string billions(int64_t count) {
  char buffer[32];
  if (count >= 1'000'000'000) {
    std::snprintf(buffer, sizeof buffer, "%.2fB", static_cast<double>(count) / 1e9);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.2fM", static_cast<double>(count) / 1e6);
  }
  return buffer;
}

// "[0,1,2,3]", or "[0,8,..,120]" (16 ranks) for long arithmetic progressions.
std::string compact_group(const std::vector<int>& ranks) {
  std::string out = "[";
  const size_t n = ranks.size();
  bool progression = n >= 5;
  for (size_t i = 2; progression && i < n; ++i) progression = ranks[i] - ranks[i - 1] == ranks[1] - ranks[0];
  if (progression) {
    out += std::to_string(ranks[0]) + "," + std::to_string(ranks[1]) + ",..," + std::to_string(ranks[n - 1]) +
           "]";
    return out;
  }
  for (size_t i = 0; i < n; ++i) {
    out += i ? "," : "";
    out += std::to_string(ranks[i]);
  }
  return out + "]";
}

std::string json_int_array(const std::vector<int>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out += i ? "," : "";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

struct Prepared {
  PipelineLayout layout;
  RankGrid grid;
  std::vector<RankSchedule> schedules;  // by pp rank
};

Prepared prepare(const ModelSpec& model, const ParallelConfig& config, const LayoutReportOptions& options) {
  config.validate(model);
  if (options.only_rank >= config.world_size || options.only_rank < -1) {
    throw UserError("--rank " + std::to_string(options.only_rank) + " is outside the world of " +
                    std::to_string(config.world_size) + " ranks: use 0.." +
                    std::to_string(config.world_size - 1));
  }
  Prepared p{config.resolved_pipeline_layout(model), RankGrid::from_config(config), {}};
  if (options.include_schedule) {
    for (int r = 0; r < p.layout.pp(); ++r) {
      p.schedules.push_back(
          build_rank_schedule(p.layout, config.num_microbatches(), config.micro_batch_group_size(), r));
    }
  }
  return p;
}

std::string model_line(const ModelSpec& model, const ParallelConfig& config) {
  const ParameterCounts counts = model.parameter_counts(config.tp());
  std::string line = model.name.empty() ? "custom" : model.name;
  line += ": " + std::to_string(model.num_layers) + " layers";
  if (model.mtp_num_layers > 0) line += " (+" + std::to_string(model.mtp_num_layers) + " MTP)";
  line += ", hidden " + std::to_string(model.hidden_size) + ", ffn " + std::to_string(model.ffn_size()) +
          ", " + std::to_string(model.num_attention_heads) + " heads";
  if (model.query_groups() != model.num_attention_heads && !model.multi_latent_attention) {
    line += " / " + std::to_string(model.query_groups()) + " groups";
  }
  if (model.multi_latent_attention) line += " (MLA)";
  if (model.is_moe()) {
    line += ", " + std::to_string(model.num_experts) + " experts top-" +
            std::to_string(model.moe_router_topk) + " in " + std::to_string(model.num_moe_layers()) +
            " layers";
  }
  line += ", seq " + std::to_string(model.seq_length) + ", vocab " + std::to_string(model.vocab_size) +
          " (padded " + std::to_string(model.padded_vocab_size(config.tp())) + "), " +
          billions(counts.total) + " params";
  if (model.is_moe()) line += " (" + billions(counts.active_per_token) + " active)";
  return line;
}

}  // namespace

std::string stage_contents(const PipelineStage& stage) {
  std::string out;
  const auto add = [&](const std::string& piece) {
    out += out.empty() ? "" : " ";
    out += piece;
  };
  if (stage.has_embedding) add("E");
  if (stage.num_decoder_layers > 0) {
    const int last = stage.first_decoder_layer + stage.num_decoder_layers - 1;
    add("t" + std::to_string(stage.first_decoder_layer) +
        (last > stage.first_decoder_layer ? "-" + std::to_string(last) : ""));
  }
  if (stage.num_mtp_layers > 0) {
    const int last = stage.first_mtp_layer + stage.num_mtp_layers - 1;
    add("m" + std::to_string(stage.first_mtp_layer) +
        (last > stage.first_mtp_layer ? "-" + std::to_string(last) : ""));
  }
  if (stage.has_loss) add("L");
  return out.empty() ? "(empty)" : out;
}

std::vector<std::string> stage_assignment_lines(const PipelineLayout& layout) {
  std::vector<std::string> lines;
  char buffer[96];
  std::snprintf(buffer, sizeof buffer, "%6s %5s %4s  %-16s %s", "stage", "pp", "vpp", "symbols", "layers");
  lines.emplace_back(buffer);
  for (const PipelineStage& stage : layout.stages()) {
    std::string symbols = stage.to_string();
    if (symbols.size() > 16) symbols = symbols.substr(0, 13) + "...";
    std::snprintf(buffer, sizeof buffer, "%6d %5d %4d  %-16s ", stage.stage_index, stage.pp_rank,
                  stage.vpp_rank, symbols.empty() ? "-" : symbols.c_str());
    lines.push_back(buffer + stage_contents(stage));
  }
  return lines;
}

std::string layout_report_text(const ModelSpec& model, const ParallelConfig& config,
                               const LayoutReportOptions& options) {
  const Prepared p = prepare(model, config, options);
  std::string out;
  out += "model     " + model_line(model, config) + "\n";
  out += "parallel  world " + std::to_string(config.world_size) + " = tp " + std::to_string(config.tp()) +
         " x cp " + std::to_string(config.cp()) + " x dp " + std::to_string(config.dp()) + " x pp " +
         std::to_string(config.pp());
  if (model.is_moe()) {
    out += "; experts etp " + std::to_string(config.etp()) + " x ep " + std::to_string(config.ep()) +
           " x edp " + std::to_string(config.edp()) + " x pp " + std::to_string(config.pp());
  }
  out += "; vpp " + std::to_string(p.layout.vpp()) + "; sequence parallel " +
         (config.sequence_parallel_enabled() ? "on" : "off") + "; order " +
         std::string(to_string(config.rank_order)) + "\n";
  out += "batch     micro " + std::to_string(config.micro_batch_size) + ", global " +
         std::to_string(config.resolved_global_batch_size()) + " -> " +
         std::to_string(config.num_microbatches()) + " microbatches per iteration";
  if (!p.schedules.empty()) {
    out += "; schedule " + std::string(to_string(p.schedules.front().kind));
    if (p.schedules.front().kind == ScheduleKind::kInterleaved) {
      out += " (group size " + std::to_string(p.schedules.front().microbatch_group_size) + ")";
    }
  }
  out += "\n";
  out += "recompute " + std::string(to_string(config.recompute_granularity));
  if (config.recompute_granularity == RecomputeGranularity::kFull) {
    out += " (" + std::string(to_string(config.recompute_method)) + ", " +
           std::to_string(config.recompute_num_layers) + " layers)";
  }
  out += "; distributed optimizer " + std::string(config.use_distributed_optimizer ? "on" : "off");
  if (config.fsdp())
    out += std::string("; ") + (config.use_torch_fsdp2 ? "torch FSDP2" : "Megatron FSDP") + " " +
           std::string(to_string(config.sharding()));
  out += "\n";
  char flops[64];
  std::snprintf(flops, sizeof flops, "%.4g",
                model_flops_per_iteration(model, config.resolved_global_batch_size(), config.tp()));
  out += "flops     " + std::string(flops) + " model FLOPs per iteration\n";
  out += "layout    " + p.layout.to_string() + "  (" + std::to_string(p.layout.num_stages()) + " stages)\n\n";
  for (const std::string& line : stage_assignment_lines(p.layout)) out += line + "\n";

  for (int rank = 0; rank < config.world_size; ++rank) {
    if (options.only_rank >= 0 && rank != options.only_rank) continue;
    const DenseCoordinates c = p.grid.dense_coordinates(rank);
    const ExpertCoordinates e = p.grid.expert_coordinates(rank);
    out += "\nrank " + std::to_string(rank) + "  tp " + std::to_string(c.tp) + " cp " + std::to_string(c.cp) +
           " dp " + std::to_string(c.dp) + " pp " + std::to_string(c.pp);
    if (model.is_moe()) {
      out += "  | expert etp " + std::to_string(e.etp) + " ep " + std::to_string(e.ep) + " edp " +
             std::to_string(e.edp);
    }
    out += "\n  groups  ";
    int column = 0;
    for (GroupKind kind : all_group_kinds()) {
      const bool expert_kind = kind == GroupKind::kEp || kind == GroupKind::kExpertTp ||
                               kind == GroupKind::kTpEp || kind == GroupKind::kTpEpPp ||
                               kind == GroupKind::kExpertDp;
      if (expert_kind && !model.is_moe()) continue;
      const std::vector<int> group = p.grid.group_of(rank, kind);
      if (group.empty()) continue;
      const std::string piece = std::string(to_string(kind)) + " " + compact_group(group);
      if (column > 0 && column + piece.size() > 100) {
        out += "\n          ";
        column = 0;
      }
      out += column > 0 ? "  " : "";
      out += piece;
      column += static_cast<int>(piece.size()) + 2;
    }
    out += "\n";
    for (const PipelineStage* stage : p.layout.stages_of_rank(c.pp)) {
      out += "  chunk " + std::to_string(stage->vpp_rank) + "  stage " + std::to_string(stage->stage_index) +
             ": " + stage_contents(*stage) + "\n";
    }
    if (options.include_schedule) {
      const RankSchedule& s = p.schedules[c.pp];
      out += "  schedule (" + std::to_string(s.num_warmup_forwards) + " warm-up forwards, " +
             std::to_string(max_in_flight_microbatches(s)) +
             " in flight): " + format_schedule(s, options.include_p2p) + "\n";
    }
  }
  return out;
}

std::string layout_report_json(const ModelSpec& model, const ParallelConfig& config,
                               const LayoutReportOptions& options) {
  const Prepared p = prepare(model, config, options);
  const ParameterCounts counts = model.parameter_counts(config.tp());
  std::string out = "{\n";
  out += "  \"model\": {\"name\": " + base::json_quote(model.name) +
         ", \"num_layers\": " + std::to_string(model.num_layers) +
         ", \"hidden_size\": " + std::to_string(model.hidden_size) +
         ", \"ffn_hidden_size\": " + std::to_string(model.ffn_size()) +
         ", \"num_attention_heads\": " + std::to_string(model.num_attention_heads) +
         ", \"num_query_groups\": " + std::to_string(model.query_groups()) +
         ", \"seq_length\": " + std::to_string(model.seq_length) +
         ", \"vocab_size\": " + std::to_string(model.vocab_size) +
         ", \"padded_vocab_size\": " + std::to_string(model.padded_vocab_size(config.tp())) +
         ", \"num_experts\": " + std::to_string(model.num_experts) +
         ", \"mtp_num_layers\": " + std::to_string(model.mtp_num_layers) +
         ", \"parameters\": " + std::to_string(counts.total) +
         ", \"active_parameters\": " + std::to_string(counts.active_per_token) + "},\n";
  out += "  \"parallel\": {\"world_size\": " + std::to_string(config.world_size) +
         ", \"tp\": " + std::to_string(config.tp()) + ", \"cp\": " + std::to_string(config.cp()) +
         ", \"dp\": " + std::to_string(config.dp()) + ", \"pp\": " + std::to_string(config.pp()) +
         ", \"vpp\": " + std::to_string(p.layout.vpp()) + ", \"ep\": " + std::to_string(config.ep()) +
         ", \"etp\": " + std::to_string(config.etp()) + ", \"edp\": " + std::to_string(config.edp()) +
         ", \"sequence_parallel\": " + (config.sequence_parallel_enabled() ? "true" : "false") +
         ", \"micro_batch_size\": " + std::to_string(config.micro_batch_size) +
         ", \"global_batch_size\": " + std::to_string(config.resolved_global_batch_size()) +
         ", \"num_microbatches\": " + std::to_string(config.num_microbatches()) +
         ", \"rank_order\": " + base::json_quote(std::string(to_string(config.rank_order))) +
         ", \"recompute_granularity\": " +
         base::json_quote(std::string(to_string(config.recompute_granularity))) +
         ", \"use_distributed_optimizer\": " + (config.use_distributed_optimizer ? "true" : "false") +
         ", \"data_parallel_sharding\": " + base::json_quote(std::string(to_string(config.sharding()))) +
         ", \"fsdp\": " + (config.fsdp() ? "true" : "false") +
         ", \"layout\": " + base::json_quote(p.layout.to_string()) +
         (p.schedules.empty()
              ? ""
              : ", \"schedule\": " + base::json_quote(std::string(to_string(p.schedules.front().kind)))) +
         "},\n";
  char flops[64];
  std::snprintf(flops, sizeof flops, "%.6e",
                model_flops_per_iteration(model, config.resolved_global_batch_size(), config.tp()));
  out += "  \"model_flops_per_iteration\": " + std::string(flops) + ",\n";
  out += "  \"stages\": [";
  for (const PipelineStage& stage : p.layout.stages()) {
    out += std::string(stage.stage_index ? "," : "") +
           "\n    {\"stage\": " + std::to_string(stage.stage_index) +
           ", \"pp_rank\": " + std::to_string(stage.pp_rank) +
           ", \"vpp_rank\": " + std::to_string(stage.vpp_rank) +
           ", \"symbols\": " + base::json_quote(stage.to_string()) +
           ", \"embedding\": " + (stage.has_embedding ? "true" : "false") +
           ", \"first_decoder_layer\": " + std::to_string(stage.first_decoder_layer) +
           ", \"num_decoder_layers\": " + std::to_string(stage.num_decoder_layers) +
           ", \"first_mtp_layer\": " + std::to_string(stage.first_mtp_layer) +
           ", \"num_mtp_layers\": " + std::to_string(stage.num_mtp_layers) +
           ", \"loss\": " + (stage.has_loss ? "true" : "false") + "}";
  }
  out += "\n  ],\n  \"ranks\": [";
  bool first_rank = true;
  for (int rank = 0; rank < config.world_size; ++rank) {
    if (options.only_rank >= 0 && rank != options.only_rank) continue;
    const DenseCoordinates c = p.grid.dense_coordinates(rank);
    const ExpertCoordinates e = p.grid.expert_coordinates(rank);
    out += std::string(first_rank ? "" : ",") + "\n    {\"rank\": " + std::to_string(rank) +
           ", \"tp\": " + std::to_string(c.tp) + ", \"cp\": " + std::to_string(c.cp) +
           ", \"dp\": " + std::to_string(c.dp) + ", \"pp\": " + std::to_string(c.pp) +
           ", \"etp\": " + std::to_string(e.etp) + ", \"ep\": " + std::to_string(e.ep) +
           ", \"edp\": " + std::to_string(e.edp) + ",\n     \"groups\": {";
    first_rank = false;
    bool first_group = true;
    for (GroupKind kind : all_group_kinds()) {
      const std::vector<int> group = p.grid.group_of(rank, kind);
      out += std::string(first_group ? "" : ", ") + base::json_quote(std::string(to_string(kind))) + ": " +
             json_int_array(group);
      first_group = false;
    }
    out += "},\n     \"stages\": [";
    bool first_stage = true;
    for (const PipelineStage* stage : p.layout.stages_of_rank(c.pp)) {
      out += std::string(first_stage ? "" : ",") + std::to_string(stage->stage_index);
      first_stage = false;
    }
    out += "]";
    if (options.include_schedule) {
      const RankSchedule& s = p.schedules[c.pp];
      out += ", \"warmup_forwards\": " + std::to_string(s.num_warmup_forwards) +
             ", \"max_in_flight_microbatches\": " + std::to_string(max_in_flight_microbatches(s)) +
             ",\n     \"schedule\": " + base::json_quote(format_schedule(s, options.include_p2p));
    }
    out += "}";
  }
  out += "\n  ]\n}\n";
  return out;
}

}  // namespace megatune::layouts
