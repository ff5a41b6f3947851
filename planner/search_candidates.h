// The layout space of a plan request: the user's pinned knobs checked, every combination of the knobs
// enumerated and validated (and memory-checked by Megatron's closed-form model unless the request injects
// its own), and the error that says why nothing fits.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "planner/search.h"

namespace megatune::planner {

// The smallest layout found not to fit, for the error that names it.
struct SmallestOutOfMemory {
  std::int64_t bytes = std::numeric_limits<std::int64_t>::max();
  std::string layout;  // describe() of it
  void note(std::int64_t peak_bytes, const LayoutCandidate& candidate);
};

struct CandidateSet {
  std::vector<LayoutCandidate> candidates;  // valid; memory-checked unless request.peak_memory_of is set
  std::string first_invalid;                // the first rejected candidate and why
  SmallestOutOfMemory smallest_oom;
};

// A knob the user pinned (--tp, --pp, --cp, --ep, --dp, --mbs, the split flags) that cannot work on this
// model and cluster: UserError naming the knob, why, and the values that would work.
void check_pinned_knobs(const PlanRequest& request);

// Every candidate of the request's space on nodes of `gpus_per_node` GPUs that are valid (and, without an
// injected memory model, fit in `capacity_bytes`); counts into `stats` (enumerated, invalid, out of memory).
CandidateSet enumerate_candidates(const PlanRequest& request, int gpus_per_node, double capacity_bytes,
                                  PlanStatistics& stats);

// Why no candidate survived, with advice that fits the reason.
[[noreturn]] void throw_nothing_fits(const PlanStatistics& stats, const PlanRequest& request,
                                     const SmallestOutOfMemory& smallest_oom, double capacity_bytes,
                                     const std::string& first_invalid);

}  // namespace megatune::planner
