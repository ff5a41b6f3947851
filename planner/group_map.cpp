// GroupMap: engine groups of the simulated ranks, placed on the cluster from their tiling of the rank grid.
#include "planner/group_map.h"

#include <algorithm>

namespace megatune::planner {

using layouts::CommGroup;

namespace {

std::array<int, 4> coordinates(const layouts::RankGrid& grid, int rank, bool expert) {
  if (expert) {
    const layouts::ExpertCoordinates c = grid.expert_coordinates(rank);
    return {c.etp, c.ep, c.edp, c.pp};
  }
  const layouts::DenseCoordinates c = grid.dense_coordinates(rank);
  return {c.tp, c.cp, c.dp, c.pp};
}

int rank_at(const layouts::RankGrid& grid, const std::array<int, 4>& c, bool expert) {
  if (expert) return grid.rank_of(layouts::ExpertCoordinates{c[0], c[1], c[2], c[3]});
  return grid.rank_of(layouts::DenseCoordinates{c[0], c[1], c[2], c[3]});
}

std::array<int, 4> dim_sizes(const layouts::RankGrid& grid, bool expert) {
  if (expert) return {grid.etp(), grid.ep(), grid.edp(), grid.pp()};
  return {grid.tp(), grid.cp(), grid.dp(), grid.pp()};
}

// The dims along which `members` vary, when they are exactly the sub-grid through members[0] along them.
bool subgrid_of(const layouts::RankGrid& grid, const std::vector<int>& members, bool expert,
                std::array<bool, 4>& varying) {
  varying = {};
  const std::array<int, 4> first = coordinates(grid, members.front(), expert);
  for (int m : members) {
    const std::array<int, 4> c = coordinates(grid, m, expert);
    for (int d = 0; d < 4; ++d) varying[d] = varying[d] || c[d] != first[d];
  }
  const std::array<int, 4> sizes = dim_sizes(grid, expert);
  long long cells = 1;
  for (int d = 0; d < 4; ++d) cells *= varying[d] ? sizes[d] : 1;
  return cells == static_cast<long long>(members.size());
}

}  // namespace

GroupMap::GroupMap(const layouts::RankGrid& grid, const std::vector<int>& sim_ranks, int gpus_per_node)
    : grid_(grid), sim_ranks_(sim_ranks), gpus_per_node_(gpus_per_node) {
  for (int i = 0; i < static_cast<int>(sim_ranks.size()); ++i) sim_index_[sim_ranks[i]] = i;
}

const GroupMap::Tiling& GroupMap::tiling(CommGroup group) {
  auto found = tilings_.find(group);
  if (found != tilings_.end()) return found->second;
  Tiling t;
  if (group == CommGroup::kWorld) {
    t.kind = Tiling::Kind::kWorld;
  } else if (group != CommGroup::kNone && group != CommGroup::kEmbedding) {
    const std::vector<int> members = grid_.comm_group_members(0, group);
    for (bool expert : {false, true}) {
      if (subgrid_of(grid_, members, expert, t.varying)) {
        t.kind = Tiling::Kind::kSubgrid;
        t.expert = expert;
        break;
      }
    }
  }
  return tilings_.emplace(group, t).first->second;
}

int GroupMap::base_of(int rank, const Tiling& t) const {
  std::array<int, 4> c = coordinates(grid_, rank, t.expert);
  for (int d = 0; d < 4; ++d)
    if (t.varying[d]) c[d] = 0;
  return rank_at(grid_, c, t.expert);
}

// A sub-grid's node span depends only on its base modulo the node size: computed once per residue.
cost_models::CollectiveGroup GroupMap::placement(int rank, CommGroup group, int base) {
  const auto key = std::make_pair(group, base % gpus_per_node_);
  auto found = placements_.find(key);
  if (found != placements_.end()) return found->second;
  const cost_models::CollectiveGroup p =
      cost_models::collective_group_of(grid_.comm_group_members(rank, group), gpus_per_node_);
  return placements_.emplace(key, p).first->second;
}

int GroupMap::simulated_members(CommGroup group, const Tiling& t, int base) {
  if (counted_.insert(group).second)  // every simulated rank's group of this kind, at its first use
    for (int r : sim_ranks_) ++simulated_[{group, base_of(r, t)}];
  return simulated_.at({group, base});
}

GroupMap::Entry GroupMap::describe(int sim, CommGroup group) {
  const int rank = sim_ranks_[sim];
  const Tiling& t = tiling(group);
  Entry e;
  int base = 0, simulated = 0;
  if (t.kind == Tiling::Kind::kWorld) {
    e.placement.size = grid_.world_size();
    e.placement.nodes = (grid_.world_size() + gpus_per_node_ - 1) / gpus_per_node_;
    simulated = static_cast<int>(sim_ranks_.size());
  } else if (t.kind == Tiling::Kind::kSubgrid) {
    base = base_of(rank, t);
    e.placement = placement(rank, group, base);
    simulated = simulated_members(group, t, base);
  } else {
    const std::vector<int> members = grid_.comm_group_members(rank, group);
    e.placement = cost_models::collective_group_of(members, gpus_per_node_);
    base = *std::min_element(members.begin(), members.end());
    for (int m : members) simulated += sim_index_.count(m) ? 1 : 0;
  }
  const auto canonical = std::make_pair(static_cast<int>(group), base);
  auto found = ids_.find(canonical);
  if (found == ids_.end()) {
    found = ids_.emplace(canonical, static_cast<int>(member_counts_.size())).first;
    member_counts_.push_back(simulated);
  }
  e.id = found->second;
  return e;
}

const GroupMap::Entry& GroupMap::lookup(int sim, CommGroup group) {
  const auto key = std::make_pair(sim, group);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  return cache_.emplace(key, describe(sim, group)).first->second;
}

int GroupMap::local_group(int sim) {
  auto it = local_.find(sim);
  if (it != local_.end()) return it->second;
  const int id = static_cast<int>(member_counts_.size());
  member_counts_.push_back(1);
  local_[sim] = id;
  return id;
}

}  // namespace megatune::planner
