// GroupMap against the member lists it no longer builds: for every rank and comm group of dense, MoE, CP and
// tp-pp-dp-ordered grids on nodes of several sizes, the same placement (size, nodes) as
// collective_group_of over RankGrid::comm_group_members, one engine group per distinct member set, and the
// count of simulated members.
#include "planner/group_map.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

namespace megatune::planner {
namespace {

using layouts::CommGroup;

struct GridCase {
  int world, tp, cp, ep, etp, pp;
  layouts::RankOrder order;
};

void expect_matches_member_lists(const GridCase& g, int gpus_per_node, const std::vector<int>& sim_ranks) {
  const layouts::RankGrid grid(g.world, g.tp, g.cp, g.ep, g.etp, g.pp, g.order);
  GroupMap map(grid, sim_ranks, gpus_per_node);
  const std::set<int> simulated(sim_ranks.begin(), sim_ranks.end());
  for (CommGroup group :
       {CommGroup::kNone, CommGroup::kTensor, CommGroup::kContext, CommGroup::kData, CommGroup::kDataContext,
        CommGroup::kPipeline, CommGroup::kExpert, CommGroup::kExpertTensor, CommGroup::kExpertData,
        CommGroup::kTensorExpert, CommGroup::kEmbedding, CommGroup::kWorld}) {
    std::map<int, std::vector<int>> members_of_id;
    for (int sim = 0; sim < static_cast<int>(sim_ranks.size()); ++sim) {
      const std::vector<int> members = grid.comm_group_members(sim_ranks[sim], group);
      const cost_models::CollectiveGroup want = cost_models::collective_group_of(members, gpus_per_node);
      const GroupMap::Entry& got = map.lookup(sim, group);
      SCOPED_TRACE(std::string(layouts::comm_group_name(group)) + " rank " + std::to_string(sim_ranks[sim]) +
                   " node " + std::to_string(gpus_per_node));
      EXPECT_EQ(got.placement.size, want.size);
      EXPECT_EQ(got.placement.nodes, want.nodes);
      auto [it, fresh] = members_of_id.emplace(got.id, members);
      EXPECT_EQ(it->second, members) << "two groups share an engine id";
      int count = 0;
      for (int m : members) count += simulated.count(m) ? 1 : 0;
      EXPECT_EQ(map.member_counts().at(got.id), count);
    }
    std::set<std::vector<int>> distinct;
    for (const auto& [id, members] : members_of_id) distinct.insert(members);
    EXPECT_EQ(distinct.size(), members_of_id.size()) << "one group under two engine ids";
  }
}

TEST(GroupMap, PlacesEveryGroupAsItsMemberListWould) {
  const std::vector<GridCase> grids = {{64, 2, 2, 1, 2, 4, layouts::RankOrder::kTpCpEpDpPp},
                                       {64, 2, 1, 4, 1, 2, layouts::RankOrder::kTpCpEpDpPp},
                                       {48, 2, 1, 1, 2, 3, layouts::RankOrder::kTpCpEpPpDp},
                                       {96, 4, 1, 2, 2, 2, layouts::RankOrder::kTpCpEpPpDp}};
  for (const GridCase& g : grids) {
    std::vector<int> every_rank(g.world), one_per_stage;
    for (int r = 0; r < g.world; ++r) every_rank[r] = r;
    const layouts::RankGrid grid(g.world, g.tp, g.cp, g.ep, g.etp, g.pp, g.order);
    for (int pp = 0; pp < g.pp; ++pp)
      one_per_stage.push_back(grid.rank_of(layouts::DenseCoordinates{0, 0, 0, pp}));
    for (int node : {8, 4, 3, 6}) {
      expect_matches_member_lists(g, node, every_rank);
      expect_matches_member_lists(g, node, one_per_stage);
    }
  }
}

}  // namespace
}  // namespace megatune::planner
