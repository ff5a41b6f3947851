// Zero-cost replay of all pp ranks' schedules: checks that p2p transfers pair up, that nothing deadlocks
// and that stage dependencies hold. Used by tests and by the planner as a cheap sanity check.
#pragma once
#include <string>
#include <vector>

#include "layouts/schedule.h"

namespace megatune::layouts {

struct ReplayResult {
  bool ok = false;
  std::string error;  // first problem found (deadlock with each rank's blocked item, mismatched pair, ...)
  int rounds = 0;     // replay rounds until every rank finished (a round runs each ready item once)
  // completion round of every F/B: forward_round[stage_index][mb], backward_round[stage_index][mb]
  std::vector<std::vector<int>> forward_round;
  std::vector<std::vector<int>> backward_round;
};

// Replays every rank (schedules[r] must be pp rank r of one layout) with blocking semantics: a compute item
// runs when its inputs arrived (F of a non-first stage needs its activation received, B of a non-last
// stage its gradient); a p2p group blocks until each transfer meets the peer's matching transfer in the
// peer's current group (same tensor, microbatch and chunks, opposite direction). Also checks that every
// (mb, chunk) runs F and B (F only in forward_only schedules) exactly once per rank and that F of stage s
// follows F of stage s-1 for the same microbatch and B of stage s follows B of stage s+1.
ReplayResult replay_schedules(const std::vector<RankSchedule>& schedules, const PipelineLayout& layout);

}  // namespace megatune::layouts
