// ProcessGroups: for one global rank of a layouts::RankGrid, the members of every CommGroup it issues
// collectives over, its index in each, and the global rank of any member. Shared by every Communicator
// implementation (threads as ranks, NCCL).
#pragma once
#include <array>
#include <vector>

#include "layouts/op.h"
#include "layouts/rank_grid.h"

namespace megatune::executor {

class ProcessGroups {
 public:
  // Throws std::out_of_range when world_rank is not in [0, grid.world_size()).
  ProcessGroups(const layouts::RankGrid& grid, int world_rank);

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  // Global ranks of this rank's group of `group`, in group-rank order (layouts::RankGrid::comm_group_members:
  // every rank for kWorld; the rank alone for kNone or a group kind it is in none of).
  const std::vector<int>& members(layouts::CommGroup group) const;
  int size(layouts::CommGroup group) const { return static_cast<int>(members(group).size()); }
  int rank_in(layouts::CommGroup group) const;  // this rank's index in its group
  // Global rank of member `rank_in_group`; throws std::out_of_range naming the group when out of range.
  int global_rank(layouts::CommGroup group, int rank_in_group) const;
  // Index of `global_rank` in this rank's group, or -1 when it is not a member.
  int index_of(layouts::CommGroup group, int global_rank) const;

  static constexpr int kGroupCount = static_cast<int>(layouts::CommGroup::kWorld) + 1;

 private:
  int world_rank_, world_size_;
  std::array<std::vector<int>, kGroupCount> members_;
  std::array<int, kGroupCount> rank_in_{};
};

}  // namespace megatune::executor
