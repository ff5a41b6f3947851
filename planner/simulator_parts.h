// The simulator's parts that stand apart from its task builder: the engine group of each (simulated rank,
// comm group) with its placement on the cluster, a rank's built task list, and the Chrome-trace events of a
// replay.
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
#include "planner/simulator.h"

namespace megatune::planner {

// Engine group ids of (simulated rank, comm group), the placement of each group on the cluster, and
// the count of simulated members.
class GroupMap {
 public:
  GroupMap(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks, int gpus_per_node)
      : grid_(grid), sim_ranks_(sim_ranks), gpus_per_node_(gpus_per_node) {
    for (int i = 0; i < static_cast<int>(sim_ranks.size()); ++i) sim_index_[sim_ranks[i]] = i;
  }

  int sim_index(int rank) const {
    auto it = sim_index_.find(rank);
    return it == sim_index_.end() ? -1 : it->second;
  }

  struct Entry {
    int id = -1;
    cost_models::CollectiveGroup placement;
  };

  const Entry& lookup(int sim, layouts::CommGroup group) {
    auto key = std::make_pair(sim, group);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    const std::vector<int> members = grid_.comm_group_members(sim_ranks_[sim], group);
    Entry e;
    e.placement = cost_models::collective_group_of(members, gpus_per_node_);
    auto canonical =
        std::make_pair(static_cast<int>(group), *std::min_element(members.begin(), members.end()));
    auto found = ids_.find(canonical);
    if (found == ids_.end()) {
      int simulated = 0;
      for (int m : members) simulated += sim_index_.count(m) ? 1 : 0;
      found = ids_.emplace(canonical, static_cast<int>(member_counts_.size())).first;
      member_counts_.push_back(simulated);
    }
    e.id = found->second;
    return cache_.emplace(key, e).first->second;
  }
  // A group holding only this simulated rank: a pure delay on its compute stream.
  int local_group(int sim) {
    auto it = local_.find(sim);
    if (it != local_.end()) return it->second;
    int id = static_cast<int>(member_counts_.size());
    member_counts_.push_back(1);
    local_[sim] = id;
    return id;
  }
  const std::vector<int>& member_counts() const { return member_counts_; }

 private:
  const layouts::RankGrid& grid_;
  const std::vector<int>& sim_ranks_;
  int gpus_per_node_;
  std::unordered_map<int, int> sim_index_;
  std::map<std::pair<int, layouts::CommGroup>, Entry> cache_;
  std::map<std::pair<int, int>, int> ids_;
  std::unordered_map<int, int> local_;
  std::vector<int> member_counts_;
};

// One simulated rank's tasks, with their names and details when tracing, and its time per op kind.
struct RankBuild {
  std::vector<SimTask> tasks;
  std::vector<std::string> names;       // per task, when tracing
  std::vector<std::string> categories;  // per task, when tracing
  std::vector<std::string> details;     // per task, when tracing
  std::vector<const char*> provenance;  // per task, when tracing (kernel level)
  std::array<KindTime, kOpKindCount> kinds{};
};

// The trace events (and process names) of every simulated rank's replayed tasks.
void append_trace_events(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks,
                         const std::vector<std::vector<SimTask>>& programs, const EngineResult& replayed,
                         const std::vector<RankBuild>& builds, SimulationResult& result);

}  // namespace megatune::planner
