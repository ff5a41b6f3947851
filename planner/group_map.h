// GroupMap: the engine group id of each (simulated rank, comm group), the group's placement on the cluster
// (size, nodes spanned) and how many simulated ranks it holds. Groups are described by their tiling of the
// rank grid, not by their member lists: a group is the sub-grid through its smallest rank (its base) along
// the dims that vary in it, and its placement depends only on that base modulo the node size, so each
// placement is computed once however large the world.
#pragma once
#include <array>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost_models/op_cost.h"
#include "layouts/op.h"
#include "layouts/rank_grid.h"

namespace megatune::planner {

class GroupMap {
 public:
  GroupMap(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks, int gpus_per_node);

  // The simulated rank index of a global rank, -1 when it is not simulated.
  int sim_index(int rank) const {
    auto it = sim_index_.find(rank);
    return it == sim_index_.end() ? -1 : it->second;
  }

  struct Entry {
    int id = -1;
    cost_models::CollectiveGroup placement;
  };
  const Entry& lookup(int sim, layouts::CommGroup group);
  // A group holding only this simulated rank: a pure delay on its compute stream.
  int local_group(int sim);
  const std::vector<int>& member_counts() const { return member_counts_; }

 private:
  // How the groups of one comm group tile the world: every rank (kWorld), sub-grids along `varying` dims of
  // the dense (tp, cp, dp, pp) or the expert (etp, ep, edp, pp) coordinates, or member lists (the embedding
  // groups, and any group no sub-grid describes).
  struct Tiling {
    enum class Kind { kWorld, kSubgrid, kListed } kind = Kind::kListed;
    bool expert = false;
    std::array<bool, 4> varying{};
  };
  const Tiling& tiling(layouts::CommGroup group);
  int base_of(int rank, const Tiling& tiling) const;  // the smallest rank of `rank`'s group (sub-grids)
  cost_models::CollectiveGroup placement(int rank, layouts::CommGroup group, int base);
  int simulated_members(layouts::CommGroup group, const Tiling& tiling, int base);
  Entry describe(int sim, layouts::CommGroup group);

  const layouts::RankGrid& grid_;
  const std::vector<int>& sim_ranks_;
  int gpus_per_node_;
  std::unordered_map<int, int> sim_index_;
  std::map<std::pair<int, layouts::CommGroup>, Entry> cache_;
  std::map<layouts::CommGroup, Tiling> tilings_;
  // (group, base % gpus per node) -> placement, for sub-grids.
  std::map<std::pair<layouts::CommGroup, int>, cost_models::CollectiveGroup> placements_;
  // (group, base) -> simulated members, for sub-grids; counted_: the groups whose counts are filled.
  std::map<std::pair<layouts::CommGroup, int>, int> simulated_;
  std::set<layouts::CommGroup> counted_;
  std::map<std::pair<int, int>, int> ids_;  // (group, base) -> engine group id
  std::unordered_map<int, int> local_;
  std::vector<int> member_counts_;
};

}  // namespace megatune::planner
