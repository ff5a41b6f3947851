// RankGrid: megatron.md §6's worked example, both rank orders, and that groups partition the world.
#include "layouts/rank_grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "base/user_error.h"

namespace megatune::layouts {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(RankGrid, WorkedExampleDense) {
  // world 16, t2 p2 d4.
  const RankGrid grid(16, 2, 1, 1, 2, 2);
  EXPECT_EQ(grid.dp(), 4);
  EXPECT_EQ(grid.groups(GroupKind::kTp),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::kDp),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::kPp),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::kMp),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::kEmbedding), grid.groups(GroupKind::kPp));
  EXPECT_EQ(grid.groups(GroupKind::kPositionEmbedding).front(), (std::vector<int>{0}));
  EXPECT_EQ(grid.dense_coordinates(13), (DenseCoordinates{1, 0, 2, 1}));  // 13 = 1 + 2*(0 + 1*(2 + 4*1))
  EXPECT_EQ(grid.rank_of(DenseCoordinates{1, 0, 2, 1}), 13);
}

TEST(RankGrid, WorkedExampleExperts) {
  // Same world with EP4, ETP1: EDP = 16 / (1 * 4 * 2) = 2.
  const RankGrid grid(16, 2, 1, 4, 1, 2);
  EXPECT_EQ(grid.edp(), 2);
  EXPECT_EQ(grid.groups(GroupKind::kEp),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::kExpertDp),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(grid.groups(GroupKind::kExpertTp).size(), 16u);
  EXPECT_EQ(grid.expert_coordinates(13), (ExpertCoordinates{0, 1, 1, 1}));  // 13 = 0 + 1*(1 + 4*(1 + 2*1))
  // PP groups coincide in both grids.
  EXPECT_EQ(grid.groups(GroupKind::kTpEpPp).size(), 2u);
}

TEST(RankGrid, TpPpDpOrder) {
  // tp-cp-ep-pp-dp: rank = tp + t*(cp + c*(pp + p*dp)).
  const RankGrid grid(16, 2, 1, 1, 2, 2, RankOrder::kTpCpEpPpDp);
  EXPECT_EQ(grid.groups(GroupKind::kPp).front(), (std::vector<int>{0, 2}));
  EXPECT_EQ(grid.groups(GroupKind::kDp).front(), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(grid.dense_coordinates(6), (DenseCoordinates{0, 0, 1, 1}));
}

TEST(RankGrid, ContextParallelGroups) {
  // t2 c2 p2 d2 in a world of 16: dp-cp joins dp and cp.
  const RankGrid grid(16, 2, 2, 1, 2, 2);
  EXPECT_EQ(grid.groups(GroupKind::kCp).front(), (std::vector<int>{0, 2}));
  EXPECT_EQ(grid.groups(GroupKind::kDp).front(), (std::vector<int>{0, 4}));
  EXPECT_EQ(grid.groups(GroupKind::kDpCp).front(), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(grid.groups(GroupKind::kTpCp).front(), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(grid.groups(GroupKind::kTpDpCp).front(), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(RankGrid, RandomGridsPartitionTheWorld) {
  std::mt19937 rng(11);
  const int sizes[] = {1, 2, 4};
  for (int trial = 0; trial < 200; ++trial) {
    const int tp = sizes[rng() % 3], cp = sizes[rng() % 3], pp = sizes[rng() % 3], dp = sizes[rng() % 3];
    const int world = tp * cp * pp * dp;
    // expert sizes dividing the world / pp
    std::vector<std::pair<int, int>> expert_options;
    for (int etp : {1, 2, 4}) {
      for (int ep : {1, 2, 4, 8}) {
        if ((world / pp) % (etp * ep) == 0) expert_options.push_back({etp, ep});
      }
    }
    const auto [etp, ep] = expert_options[rng() % expert_options.size()];
    // Megatron allows tp-cp-ep-pp-dp only when the expert DP size equals the dense one.
    const RankOrder order =
        rng() % 2 && etp * ep == tp * cp ? RankOrder::kTpCpEpPpDp : RankOrder::kTpCpEpDpPp;
    const RankGrid grid(world, tp, cp, ep, etp, pp, order);
    SCOPED_TRACE("world " + std::to_string(world));
    for (GroupKind kind : all_group_kinds()) {
      if (kind == GroupKind::kEmbedding || kind == GroupKind::kPositionEmbedding) continue;
      std::vector<int> seen(world, 0);
      size_t group_size = 0;
      for (const auto& group : grid.groups(kind)) {
        if (group_size == 0) group_size = group.size();
        ASSERT_EQ(group.size(), group_size) << to_string(kind);
        for (int rank : group) ++seen[rank];
      }
      for (int count : seen) ASSERT_EQ(count, 1) << to_string(kind);
    }
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_EQ(grid.rank_of(grid.dense_coordinates(rank)), rank);
      ASSERT_EQ(grid.rank_of(grid.expert_coordinates(rank)), rank);
      ASSERT_EQ(grid.dense_coordinates(rank).pp, grid.expert_coordinates(rank).pp);
      // The ranks of a TP group share every coordinate but tp.
      for (int member : grid.group_of(rank, GroupKind::kTp)) {
        const DenseCoordinates a = grid.dense_coordinates(rank), b = grid.dense_coordinates(member);
        ASSERT_TRUE(a.cp == b.cp && a.dp == b.dp && a.pp == b.pp);
      }
    }
    // group_of agrees with the enumeration (same members, same order), embedding groups included.
    for (GroupKind kind : all_group_kinds()) {
      for (int rank = 0; rank < world; ++rank) {
        std::vector<int> expected;
        for (const auto& group : grid.groups(kind)) {
          if (std::find(group.begin(), group.end(), rank) != group.end()) expected = group;
        }
        ASSERT_EQ(grid.group_of(rank, kind), expected) << to_string(kind) << " rank " << rank;
      }
    }
    ASSERT_EQ(grid.groups(GroupKind::kTp).size(), static_cast<size_t>(world / tp));
    ASSERT_EQ(grid.groups(GroupKind::kEp).size(), static_cast<size_t>(world / ep));
  }
}

TEST(RankGrid, Errors) {
  EXPECT_THROW(RankGrid(12, 8, 1, 1, 8, 1), UserError);
  EXPECT_THROW(RankGrid(16, 2, 1, 3, 1, 2), UserError);
  EXPECT_THROW(RankGrid(0, 1, 1, 1, 1, 1), UserError);
  EXPECT_THROW(RankGrid(16, 2, 1, 4, 1, 2, RankOrder::kTpCpEpPpDp), UserError);  // EDP 2 != DP 4
  try {
    RankGrid(12, 8, 1, 1, 8, 1);
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--world-size 12 is not a multiple of tp x cp x pp = 8"),
              std::string::npos);
  }
}

// A stream per communicator: each group is named by the first group (CommGroup order) of the same members.
TEST(RankGrid, StreamGroupsShareAStreamOnlyWhereTheMembersAreTheSame) {
  using G = CommGroup;
  struct Expected {
    const char* grid;
    RankGrid layout;
    int rank;
    std::vector<std::pair<G, G>> group_stream;
  };
  const std::vector<Expected> cases = {
      // world 8, tp2 cp2 dp2: every dense group differs, dp-cp is its own, the world is nobody else's.
      {"tp2 cp2 dp2",
       RankGrid(8, 2, 2, 1, 2, 1),
       5,
       {{G::kNone, G::kNone},
        {G::kTensor, G::kTensor},
        {G::kContext, G::kContext},
        {G::kData, G::kData},
        {G::kDataContext, G::kDataContext},
        {G::kWorld, G::kWorld}}},
      // Without cp, dp-cp is dp: one communicator, one stream. The expert grid with etp = tp repeats tp.
      {"tp2 dp4 ep2",
       RankGrid(8, 2, 1, 2, 2, 1),
       3,
       {{G::kDataContext, G::kData},
        {G::kExpertTensor, G::kTensor},
        {G::kExpert, G::kExpert},
        {G::kExpertData, G::kExpertData}}},
  };
  for (const Expected& c : cases) {
    SCOPED_TRACE(c.grid);
    const auto streams = c.layout.stream_groups(c.rank);
    for (const auto& [group, stream] : c.group_stream)
      EXPECT_EQ(streams[static_cast<int>(group)], stream) << comm_group_name(group);
    // Each group's stream is a group of exactly its members.
    for (int g = 1; g < kCommGroupCount; ++g) {
      const auto group = static_cast<CommGroup>(g);
      EXPECT_EQ(c.layout.comm_group_members(c.rank, streams[g]), c.layout.comm_group_members(c.rank, group))
          << comm_group_name(group);
    }
  }
}

}  // namespace
}  // namespace megatune::layouts
