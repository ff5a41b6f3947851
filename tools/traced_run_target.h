// The (model, layout) of a traced run: rebuilt from Megatron flags (the run's own, a plan's, or given ones)
// and checked against the trace op by op. Shared by `megatune compare` and `megatune db calibrate`.
#pragma once
#include <string>
#include <vector>

#include "calibration/measured_run.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"

namespace megatune::tools {

struct ResolvedTarget {
  layouts::ModelSpec model;
  layouts::ParallelConfig config;
  layouts::StepProgramOptions step;  // the FP8 flags among `args` (tools/fp8_flags.h)
};

// Parses the model, parallel, batch and FP8 flags in `args` (other flags are ignored) into a validated
// (model, layout) and its step-program options; `source` names where the flags came from in a UserError.
ResolvedTarget resolve_target(std::vector<std::string> args, const std::string& source);

// Splits a string at white space ("--model tiny --tp 2" -> 3 words).
std::vector<std::string> split_words(const std::string& text);

// Reads the run, rebuilds its (model, layout) from its own flags and checks that the run agrees with them
// (check_recorded_run); UserError otherwise.
struct TracedRunTarget {
  calibration::MeasuredRun run;
  ResolvedTarget target;
};
TracedRunTarget read_traced_run(const std::string& dir);

// The run's own record against the (model, layout) that its flags build: the model name, the layout, the
// batch sizes, the FLOPs per iteration and each rank's grid coordinates, then every op
// (calibration::check_join). UserError naming run.json's field or the first op that disagrees (an edited or
// foreign trace).
void check_recorded_run(const calibration::MeasuredRun& run, const ResolvedTarget& own);

// --run DIR given twice (under any spelling of the same folder) is one line: a run counts once.
void require_distinct_runs(const std::vector<std::string>& dirs);

}  // namespace megatune::tools
