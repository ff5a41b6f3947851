// The (model, layout) of a traced run: rebuilt from Megatron flags (the run's own, a plan's, or given ones)
// and checked against the trace op by op. Shared by `megatune compare` and `megatune db calibrate`.
#pragma once
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "planner/measured_run.h"

namespace megatune::tools {

struct ResolvedTarget {
  layouts::ModelSpec model;
  layouts::ParallelConfig config;
};

// Parses the model, parallel and batch flags in `args` (other flags are ignored) into a validated (model,
// layout); `source` names where the flags came from in a UserError.
ResolvedTarget resolve_target(std::vector<std::string> args, const std::string& source);

// Splits a string at white space ("--model tiny --tp 2" -> 3 words).
std::vector<std::string> split_words(const std::string& text);

// Reads the run, rebuilds its (model, layout) from its own flags and checks the join; UserError otherwise.
struct TracedRunTarget {
  planner::MeasuredRun run;
  ResolvedTarget target;
};
TracedRunTarget read_traced_run(const std::string& dir);

}  // namespace megatune::tools
