// The simulator's parts that stand apart from its task builder: the engine groups (planner/group_map.h), a
// rank's built task list, what a communication op moves, a replay's summary and its Chrome-trace events.
#pragma once
#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost_models/op_cost.h"
#include "layouts/rank_grid.h"
#include "planner/event_engine.h"
#include "planner/group_map.h"
#include "planner/simulator.h"

namespace megatune::planner {

// One simulated rank's tasks, with their names and details when tracing, and its time per op kind.
struct RankBuild {
  std::vector<SimTask> tasks;
  std::vector<std::string> names;       // per task, when tracing
  std::vector<std::string> categories;  // per task, when tracing
  std::vector<std::string> details;     // per task, when tracing
  std::vector<const char*> provenance;  // per task, when tracing (kernel level)
  std::array<KindTime, kOpKindCount> kinds{};
};

// What a communication op moves (CommCategory): its group's parallelism; the context-parallel ring's
// transfers are CP, every other send or receive pipeline p2p.
CommCategory comm_category(const layouts::Op& op);

// The result's timing of a replay (step time, each pp rank's busiest representative, the critical rank's
// compute, exposed communication by category and op kinds, bubble, MFU, tokens/s).
void summarize_replay(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                      double peak_bf16_tflops, const layouts::RankGrid& grid,
                      const std::vector<int>& sim_ranks, const EngineResult& replayed,
                      const std::vector<RankBuild>& builds, SimulationResult& result);

// The trace events (and process names) of every simulated rank's replayed tasks.
void append_trace_events(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks,
                         const std::vector<std::vector<SimTask>>& programs, const EngineResult& replayed,
                         const std::vector<RankBuild>& builds, SimulationResult& result);

}  // namespace megatune::planner
