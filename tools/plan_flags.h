// The Megatron flags `megatune plan` takes, as the planner's search space: each parallel flag given pins its
// knob (or a setting every candidate runs with); the recompute flags nothing prices are refused.
#pragma once
#include "planner/search.h"
#include "tools/megatron_args.h"

namespace megatune::tools {

// --recompute-granularity, --recompute-method, --recompute-num-layers: the last two pin full recomputation
// with that unit rule (the method alone: 1 layer); without them the search tries uniform 1 and, where full
// recomputation is needed, block at 1/2 and 1/4 of a chunk (planner/search.h says when).
// --recompute-num-layers without a method, or either with another granularity, is a UserError.
void pin_recompute(const MegatronArgs& args, planner::SearchSpace& space);

// Every parallel and batch flag given pins that knob of the search, or a setting every candidate runs with.
void pin_search_knobs(const MegatronArgs& args, planner::SearchSpace& space);

}  // namespace megatune::tools
