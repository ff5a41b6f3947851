// --against: the flag string split and parsed with plan's own Megatron flag groups, checked against the
// plan's cluster and batch, then validated, simulated and sized.
#include "tools/plan_against.h"

#include <CLI/CLI.hpp>
#include <algorithm>

#include "base/user_error.h"
#include "layouts/pipeline_layout.h"
#include "planner/memory_model.h"
#include "planner/simulator.h"
#include "tools/megatron_args.h"
#include "tools/plan_flags.h"

namespace megatune::tools {
namespace {

const char* const kFlag = "--against";

MegatronArgs parse_flags(const std::string& flags) {
  std::vector<std::string> words = split_flag_string(flags, kFlag);
  if (words.empty())
    throw UserError("--against is empty: give the layout's Megatron flags, e.g. --against \"--tp 8 --pp 4\"");
  CLI::App app{"--against"};
  app.allow_extras();
  MegatronArgs args;
  add_parallel_flags(app, args);
  add_batch_flags(app, args);
  std::reverse(words.begin(), words.end());  // CLI11 takes a vector in reverse order
  const std::string advice =
      "give Megatron parallel and batch flags only (the model is the plan's), e.g. --against \"--tp 8 --pp 4 "
      "--micro-batch-size 1\"";
  try {
    app.parse(words);
  } catch (const CLI::ParseError& e) {
    throw UserError(std::string(kFlag) + ": " + e.what() + "; " + advice);
  }
  if (!app.remaining().empty()) {
    std::string extra;
    for (const std::string& word : app.remaining()) extra += (extra.empty() ? "" : " ") + word;
    throw UserError(std::string(kFlag) + ": '" + extra + "' is not a parallel or batch flag; " + advice);
  }
  return args;
}

// The flags as the layout on the plan's cluster and batch.
layouts::ParallelConfig layout_of(const MegatronArgs& args, const planner::PlanRequest& request) {
  planner::SearchSpace refused;  // plan's own checks of the recompute flags
  pin_recompute(args, refused);
  layouts::ParallelConfig config = resolve_parallel(args);
  if (args.world_size && *args.world_size != request.world_size)
    throw UserError("--against --world-size " + std::to_string(*args.world_size) + " differs from the " +
                    std::to_string(request.world_size) + " GPUs of --cluster: drop it");
  if (args.global_batch_size && *args.global_batch_size != request.global_batch_size)
    throw UserError("--against --global-batch-size " + std::to_string(*args.global_batch_size) +
                    " differs from the plan's " + std::to_string(request.global_batch_size) +
                    ": drop it (both layouts run the plan's batch)");
  config.world_size = request.world_size;
  config.global_batch_size = request.global_batch_size;
  config.validate(request.model);
  return config;
}

}  // namespace

std::vector<std::string> split_flag_string(const std::string& text, const std::string& flag) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  char quote = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        word += c;
    } else if (c == '\\' && i + 1 < text.size()) {
      word += text[++i];
      in_word = true;
    } else if (quote == '"') {
      if (c == '"')
        quote = 0;
      else
        word += c;
    } else if (c == '\'' || c == '"') {
      quote = c;
      in_word = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
    } else {
      word += c;
      in_word = true;
    }
  }
  if (quote != 0)
    throw UserError(flag + ": the quote " + std::string(1, quote) + " is not closed: close it, e.g. " + flag +
                    " \"--pipeline-model-parallel-layout 'Et|tt|tL'\"");
  if (in_word) words.push_back(word);
  return words;
}

planner::PlanCandidate against_candidate(const std::string& flags, const planner::PlanRequest& request,
                                         const planner::OpPricer& pricer) {
  planner::PlanCandidate c;
  try {
    c.config = layout_of(parse_flags(flags), request);
  } catch (const UserError& e) {
    const std::string message = e.what();
    if (message.rfind(kFlag, 0) == 0) throw;
    throw UserError(std::string(kFlag) + ": " + message);
  }
  c.stages =
      std::make_shared<const layouts::PipelineLayout>(c.config.resolved_pipeline_layout(request.model));
  c.layout = c.stages->to_string();
  c.vpp = c.stages->vpp();
  planner::MemoryOptions memory = request.memory;
  memory.step = request.step;
  const planner::MemoryEstimate peak = request.peak_memory_of
                                           ? request.peak_memory_of(request.model, c.config, memory)
                                           : planner::peak_memory(request.model, c.config, memory);
  c.peak_memory_bytes = peak.total_bytes;
  c.peak_memory_pp_rank = peak.pp_rank;
  planner::SimulationOptions options;
  options.step = request.step;
  options.tp_comm_overlap = request.tp_comm_overlap;
  c.simulation = planner::simulate(request.model, c.config, pricer, options);
  return c;
}

}  // namespace megatune::tools
