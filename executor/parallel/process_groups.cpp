// ProcessGroups: every CommGroup's members for one rank, read once from the rank grid.
#include "executor/parallel/process_groups.h"

#include <stdexcept>
#include <string>

namespace megatune::executor {

using layouts::CommGroup;

ProcessGroups::ProcessGroups(const layouts::RankGrid& grid, int world_rank)
    : world_rank_(world_rank), world_size_(grid.world_size()) {
  if (world_rank < 0 || world_rank >= world_size_)
    throw std::out_of_range("rank " + std::to_string(world_rank) + " is outside a world of " +
                            std::to_string(world_size_) + " ranks");
  for (int g = 0; g < kGroupCount; ++g) {
    members_[g] = grid.comm_group_members(world_rank, static_cast<CommGroup>(g));
    rank_in_[g] = index_of(static_cast<CommGroup>(g), world_rank);
  }
}

const std::vector<int>& ProcessGroups::members(CommGroup group) const {
  return members_.at(static_cast<int>(group));
}

int ProcessGroups::rank_in(CommGroup group) const { return rank_in_.at(static_cast<int>(group)); }

int ProcessGroups::global_rank(CommGroup group, int rank_in_group) const {
  const std::vector<int>& m = members(group);
  if (rank_in_group < 0 || rank_in_group >= static_cast<int>(m.size()))
    throw std::out_of_range("member " + std::to_string(rank_in_group) + " of group " +
                            layouts::comm_group_name(group) + " (size " + std::to_string(m.size()) +
                            ") does not exist");
  return m[rank_in_group];
}

int ProcessGroups::index_of(CommGroup group, int global_rank) const {
  const std::vector<int>& m = members(group);
  for (int i = 0; i < static_cast<int>(m.size()); ++i)
    if (m[i] == global_rank) return i;
  return -1;
}

}  // namespace megatune::executor
