// The Megatron flags `megatune plan` takes, as the planner's search space: each parallel flag given pins its
// knob (or a setting every candidate runs with); the recompute flags nothing prices are refused.
#pragma once
#include "planner/search.h"
#include "tools/megatron_args.h"

namespace megatune::tools {

// --recompute-granularity, --recompute-method, --recompute-num-layers: the simulator and the executor
// recompute every layer on its own (uniform, one layer per unit), so the last two pin full recomputation; any
// other unit is a UserError.
void pin_recompute(const MegatronArgs& args, planner::SearchSpace& space);

// Every parallel and batch flag given pins that knob of the search, or a setting every candidate runs with.
void pin_search_knobs(const MegatronArgs& args, planner::SearchSpace& space);

}  // namespace megatune::tools
