// RankGrid: Megatron's RankGenerator (dense and expert grids) and generate_masked_orthogonal_rank_groups.
#include "layouts/rank_grid.h"

#include <array>
#include <stdexcept>
#include <string>

#include "base/user_error.h"

namespace megatune::layouts {

namespace {

constexpr std::array kAllKinds = {GroupKind::kTp,       GroupKind::kCp,        GroupKind::kDp,
                                  GroupKind::kDpCp,     GroupKind::kPp,        GroupKind::kMp,
                                  GroupKind::kTpCp,     GroupKind::kTpDpCp,    GroupKind::kEp,
                                  GroupKind::kExpertTp, GroupKind::kTpEp,      GroupKind::kTpEpPp,
                                  GroupKind::kExpertDp, GroupKind::kEmbedding, GroupKind::kPositionEmbedding};

// Dimension slots in Megatron's order string; first varies fastest.
enum Dim { kDimTp = 0, kDimCp = 1, kDimEp = 2, kDimDp = 3, kDimPp = 4, kNumDims = 5 };

struct GridShape {
  std::array<int, kNumDims> size_by_dim;  // indexed by Dim
  std::array<Dim, kNumDims> order;        // dims from fastest to slowest
};

GridShape dense_shape(int tp, int cp, int dp, int pp, RankOrder order) {
  GridShape g{{tp, cp, 1, dp, pp}, {kDimTp, kDimCp, kDimEp, kDimDp, kDimPp}};
  if (order == RankOrder::kTpCpEpPpDp) g.order = {kDimTp, kDimCp, kDimEp, kDimPp, kDimDp};
  return g;
}

GridShape expert_shape(int etp, int ep, int edp, int pp, RankOrder order) {
  GridShape g{{etp, 1, ep, edp, pp}, {kDimTp, kDimCp, kDimEp, kDimDp, kDimPp}};
  if (order == RankOrder::kTpCpEpPpDp) g.order = {kDimTp, kDimCp, kDimEp, kDimPp, kDimDp};
  return g;
}

std::array<int, kNumDims> strides(const GridShape& g) {
  std::array<int, kNumDims> stride{};
  int running = 1;
  for (Dim d : g.order) {
    stride[d] = running;
    running *= g.size_by_dim[d];
  }
  return stride;
}

// generate_masked_orthogonal_rank_groups: vary the masked dims, fix the others.
std::vector<std::vector<int>> masked_groups(const GridShape& g, const std::array<bool, kNumDims>& varying) {
  const auto stride = strides(g);
  std::vector<Dim> masked, unmasked;
  for (Dim d : g.order) (varying[d] ? masked : unmasked).push_back(d);
  int group_size = 1, num_groups = 1;
  for (Dim d : masked) group_size *= g.size_by_dim[d];
  for (Dim d : unmasked) num_groups *= g.size_by_dim[d];
  std::vector<std::vector<int>> groups(num_groups);
  for (int group_index = 0; group_index < num_groups; ++group_index) {
    int base = 0, rest = group_index;
    for (Dim d : unmasked) {
      base += (rest % g.size_by_dim[d]) * stride[d];
      rest /= g.size_by_dim[d];
    }
    groups[group_index].reserve(group_size);
    for (int rank_in_group = 0; rank_in_group < group_size; ++rank_in_group) {
      int rank = base, r = rank_in_group;
      for (Dim d : masked) {
        rank += (r % g.size_by_dim[d]) * stride[d];
        r /= g.size_by_dim[d];
      }
      groups[group_index].push_back(rank);
    }
  }
  return groups;
}

// The one group of masked_groups(g, varying) that holds `rank`, in the same member order.
std::vector<int> masked_group_of(const GridShape& g, const std::array<bool, kNumDims>& varying, int rank) {
  const auto stride = strides(g);
  int base = 0, rest = rank, group_size = 1;
  std::vector<Dim> masked;
  for (Dim d : g.order) {
    const int index = rest % g.size_by_dim[d];
    rest /= g.size_by_dim[d];
    if (varying[d]) {
      masked.push_back(d);
      group_size *= g.size_by_dim[d];
    } else {
      base += index * stride[d];
    }
  }
  std::vector<int> group;
  group.reserve(group_size);
  for (int rank_in_group = 0; rank_in_group < group_size; ++rank_in_group) {
    int member = base, r = rank_in_group;
    for (Dim d : masked) {
      member += (r % g.size_by_dim[d]) * stride[d];
      r /= g.size_by_dim[d];
    }
    group.push_back(member);
  }
  return group;
}

std::array<int, kNumDims> decompose(const GridShape& g, int rank) {
  std::array<int, kNumDims> index{};
  for (Dim d : g.order) {
    index[d] = rank % g.size_by_dim[d];
    rank /= g.size_by_dim[d];
  }
  return index;
}

std::array<bool, kNumDims> mask(std::initializer_list<Dim> dims) {
  std::array<bool, kNumDims> m{};
  for (Dim d : dims) m[d] = true;
  return m;
}

}  // namespace

std::string_view to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::kTp:
      return "tp";
    case GroupKind::kCp:
      return "cp";
    case GroupKind::kDp:
      return "dp";
    case GroupKind::kDpCp:
      return "dp-cp";
    case GroupKind::kPp:
      return "pp";
    case GroupKind::kMp:
      return "tp-pp";
    case GroupKind::kTpCp:
      return "tp-cp";
    case GroupKind::kTpDpCp:
      return "tp-dp-cp";
    case GroupKind::kEp:
      return "ep";
    case GroupKind::kExpertTp:
      return "etp";
    case GroupKind::kTpEp:
      return "tp-ep";
    case GroupKind::kTpEpPp:
      return "tp-ep-pp";
    case GroupKind::kExpertDp:
      return "edp";
    case GroupKind::kEmbedding:
      return "embedding";
    case GroupKind::kPositionEmbedding:
      return "position-embedding";
  }
  return "?";
}

std::span<const GroupKind> all_group_kinds() { return kAllKinds; }

RankGrid::RankGrid(int world_size, int tp, int cp, int ep, int etp, int pp, RankOrder order)
    : world_(world_size), tp_(tp), cp_(cp), dp_(0), pp_(pp), ep_(ep), etp_(etp), edp_(0), order_(order) {
  if (world_size < 1 || tp < 1 || cp < 1 || ep < 1 || etp < 1 || pp < 1) {
    throw UserError(
        "rank grid: --world-size, --tp, --cp, --ep, --expert-tensor-parallel-size and --pp must be >= 1");
  }
  const int64_t dense = int64_t{tp} * cp * pp;
  const int64_t expert = int64_t{etp} * ep * pp;
  if (world_size % dense != 0) {
    throw UserError("--world-size " + std::to_string(world_size) + " is not a multiple of tp x cp x pp = " +
                    std::to_string(dense) + ": change the world size or the parallel sizes");
  }
  if (world_size % expert != 0) {
    throw UserError("--world-size " + std::to_string(world_size) + " is not a multiple of etp x ep x pp = " +
                    std::to_string(expert) + ": change the world size or the expert parallel sizes");
  }
  dp_ = static_cast<int>(world_size / dense);
  edp_ = static_cast<int>(world_size / expert);
  if (order == RankOrder::kTpCpEpPpDp && edp_ != dp_) {
    throw UserError("rank order tp-cp-ep-pp-dp needs the expert data-parallel size (" + std::to_string(edp_) +
                    ") to equal the data-parallel size (" + std::to_string(dp_) +
                    "): make etp x ep equal tp x cp, or use the default order tp-cp-ep-dp-pp");
  }
}

RankGrid RankGrid::from_config(const ParallelConfig& config) {
  return RankGrid(config.world_size, config.tp(), config.cp(), config.ep(), config.etp(), config.pp(),
                  config.rank_order);
}

DenseCoordinates RankGrid::dense_coordinates(int rank) const {
  if (rank < 0 || rank >= world_)
    throw std::out_of_range("rank " + std::to_string(rank) + " outside the world");
  const auto i = decompose(dense_shape(tp_, cp_, dp_, pp_, order_), rank);
  return {i[kDimTp], i[kDimCp], i[kDimDp], i[kDimPp]};
}

ExpertCoordinates RankGrid::expert_coordinates(int rank) const {
  if (rank < 0 || rank >= world_)
    throw std::out_of_range("rank " + std::to_string(rank) + " outside the world");
  const auto i = decompose(expert_shape(etp_, ep_, edp_, pp_, order_), rank);
  return {i[kDimTp], i[kDimEp], i[kDimDp], i[kDimPp]};
}

int RankGrid::rank_of(const DenseCoordinates& c) const {
  const GridShape g = dense_shape(tp_, cp_, dp_, pp_, order_);
  const auto s = strides(g);
  return c.tp * s[kDimTp] + c.cp * s[kDimCp] + c.dp * s[kDimDp] + c.pp * s[kDimPp];
}

int RankGrid::rank_of(const ExpertCoordinates& c) const {
  const GridShape g = expert_shape(etp_, ep_, edp_, pp_, order_);
  const auto s = strides(g);
  return c.etp * s[kDimTp] + c.ep * s[kDimEp] + c.edp * s[kDimDp] + c.pp * s[kDimPp];
}

std::vector<std::vector<int>> RankGrid::groups(GroupKind kind) const {
  const GridShape dense = dense_shape(tp_, cp_, dp_, pp_, order_);
  const GridShape expert = expert_shape(etp_, ep_, edp_, pp_, order_);
  switch (kind) {
    case GroupKind::kTp:
      return masked_groups(dense, mask({kDimTp}));
    case GroupKind::kCp:
      return masked_groups(dense, mask({kDimCp}));
    case GroupKind::kDp:
      return masked_groups(dense, mask({kDimDp}));
    case GroupKind::kDpCp:
      return masked_groups(dense, mask({kDimDp, kDimCp}));
    case GroupKind::kPp:
      return masked_groups(dense, mask({kDimPp}));
    case GroupKind::kMp:
      return masked_groups(dense, mask({kDimTp, kDimPp}));
    case GroupKind::kTpCp:
      return masked_groups(dense, mask({kDimTp, kDimCp}));
    case GroupKind::kTpDpCp:
      return masked_groups(dense, mask({kDimTp, kDimDp, kDimCp}));
    case GroupKind::kEp:
      return masked_groups(expert, mask({kDimEp}));
    case GroupKind::kExpertTp:
      return masked_groups(expert, mask({kDimTp}));
    case GroupKind::kTpEp:
      return masked_groups(expert, mask({kDimTp, kDimEp}));
    case GroupKind::kTpEpPp:
      return masked_groups(expert, mask({kDimTp, kDimEp, kDimPp}));
    case GroupKind::kExpertDp:
      return masked_groups(expert, mask({kDimDp}));
    case GroupKind::kEmbedding:
    case GroupKind::kPositionEmbedding: {
      std::vector<std::vector<int>> out;
      for (const auto& pp_group : masked_groups(dense, mask({kDimPp}))) {
        if (kind == GroupKind::kPositionEmbedding || pp_group.size() == 1) {
          out.push_back({pp_group.front()});
        } else {
          out.push_back({pp_group.front(), pp_group.back()});
        }
      }
      return out;
    }
  }
  return {};
}

std::vector<int> RankGrid::group_of(int rank, GroupKind kind) const {
  if (rank < 0 || rank >= world_)
    throw std::out_of_range("rank " + std::to_string(rank) + " outside the world");
  const GridShape dense = dense_shape(tp_, cp_, dp_, pp_, order_);
  const GridShape expert = expert_shape(etp_, ep_, edp_, pp_, order_);
  switch (kind) {
    case GroupKind::kTp:
      return masked_group_of(dense, mask({kDimTp}), rank);
    case GroupKind::kCp:
      return masked_group_of(dense, mask({kDimCp}), rank);
    case GroupKind::kDp:
      return masked_group_of(dense, mask({kDimDp}), rank);
    case GroupKind::kDpCp:
      return masked_group_of(dense, mask({kDimDp, kDimCp}), rank);
    case GroupKind::kPp:
      return masked_group_of(dense, mask({kDimPp}), rank);
    case GroupKind::kMp:
      return masked_group_of(dense, mask({kDimTp, kDimPp}), rank);
    case GroupKind::kTpCp:
      return masked_group_of(dense, mask({kDimTp, kDimCp}), rank);
    case GroupKind::kTpDpCp:
      return masked_group_of(dense, mask({kDimTp, kDimDp, kDimCp}), rank);
    case GroupKind::kEp:
      return masked_group_of(expert, mask({kDimEp}), rank);
    case GroupKind::kExpertTp:
      return masked_group_of(expert, mask({kDimTp}), rank);
    case GroupKind::kTpEp:
      return masked_group_of(expert, mask({kDimTp, kDimEp}), rank);
    case GroupKind::kTpEpPp:
      return masked_group_of(expert, mask({kDimTp, kDimEp, kDimPp}), rank);
    case GroupKind::kExpertDp:
      return masked_group_of(expert, mask({kDimDp}), rank);
    case GroupKind::kEmbedding:
    case GroupKind::kPositionEmbedding: {
      const std::vector<int> pp_group = masked_group_of(dense, mask({kDimPp}), rank);
      std::vector<int> group = {pp_group.front()};
      if (kind == GroupKind::kEmbedding && pp_group.size() > 1) group.push_back(pp_group.back());
      for (int member : group) {
        if (member == rank) return group;
      }
      return {};
    }
  }
  return {};
}

GroupKind group_kind_of(CommGroup group) {
  switch (group) {
    case CommGroup::kTensor:
      return GroupKind::kTp;
    case CommGroup::kContext:
      return GroupKind::kCp;
    case CommGroup::kData:
      return GroupKind::kDp;
    case CommGroup::kDataContext:
      return GroupKind::kDpCp;
    case CommGroup::kPipeline:
      return GroupKind::kPp;
    case CommGroup::kExpert:
      return GroupKind::kEp;
    case CommGroup::kExpertTensor:
      return GroupKind::kExpertTp;
    case CommGroup::kExpertData:
      return GroupKind::kExpertDp;
    case CommGroup::kTensorExpert:
      return GroupKind::kTpEp;
    case CommGroup::kEmbedding:
      return GroupKind::kEmbedding;
    case CommGroup::kNone:
    case CommGroup::kWorld:
      break;
  }
  throw std::invalid_argument(std::string("no rank-grid group for ") + comm_group_name(group));
}

std::vector<int> RankGrid::comm_group_members(int rank, CommGroup group) const {
  if (group == CommGroup::kWorld) {
    std::vector<int> all(world_);
    for (int r = 0; r < world_; ++r) all[r] = r;
    return all;
  }
  if (group == CommGroup::kNone) return {rank};
  std::vector<int> members = group_of(rank, group_kind_of(group));
  if (members.empty()) members = {rank};
  return members;
}

std::array<CommGroup, kCommGroupCount> RankGrid::stream_groups(int rank) const {
  return layouts::stream_groups([&](CommGroup g) { return comm_group_members(rank, g); });
}

std::array<CommGroup, kCommGroupCount> stream_groups(
    const std::function<std::vector<int>(CommGroup)>& members_of) {
  std::array<CommGroup, kCommGroupCount> streams{};
  std::array<std::vector<int>, kCommGroupCount> members;
  for (int g = 1; g < kCommGroupCount; ++g) {
    members[g] = members_of(static_cast<CommGroup>(g));
    streams[g] = static_cast<CommGroup>(g);
    for (int earlier = 1; earlier < g; ++earlier)
      if (members[earlier] == members[g]) {
        streams[g] = static_cast<CommGroup>(earlier);
        break;
      }
  }
  return streams;
}

}  // namespace megatune::layouts
