// The plan's pick set beside the layout the user would have tried (`megatune plan --against`): both
// predictions side by side (step time, MFU, memory, bubble) and where each one's step goes (compute, the
// exposed TP/CP/EP/PP/DP communication, the pipeline bubble), then what makes the faster one faster.
#pragma once
#include <cstdint>
#include <string>

#include "planner/search.h"

namespace megatune::planner {

// Aligned text. `usable_bytes`: the memory a layout may use per GPU (capacity less headroom), of
// `capacity_bytes`; a layout above it is marked as not fitting.
std::string format_layout_comparison(const PlanCandidate& yours, const PlanCandidate& pick,
                                     std::int64_t capacity_bytes, double usable_bytes);

}  // namespace megatune::planner
