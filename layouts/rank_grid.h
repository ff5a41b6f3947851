// RankGrid: Megatron's mapping of global ranks onto the dense (tp, cp, dp, pp) grid and the expert
// (etp, ep, edp, pp) grid, and every process group derived from them.
#pragma once
#include <array>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "layouts/op.h"
#include "layouts/parallel_config.h"

namespace megatune::layouts {

struct DenseCoordinates {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  friend bool operator==(const DenseCoordinates&, const DenseCoordinates&) = default;
};
struct ExpertCoordinates {
  int etp = 0, ep = 0, edp = 0, pp = 0;
  friend bool operator==(const ExpertCoordinates&, const ExpertCoordinates&) = default;
};

// The groups of Megatron's parallel_state (names as its rank-generator tokens).
enum class GroupKind {
  kTp,                 // "tp"
  kCp,                 // "cp"
  kDp,                 // "dp"
  kDpCp,               // "dp-cp": gradient reduction of dense params
  kPp,                 // "pp"
  kMp,                 // "tp-pp": model parallel
  kTpCp,               // "tp-cp"
  kTpDpCp,             // "tp-dp-cp"
  kEp,                 // "ep" (expert grid)
  kExpertTp,           // "etp" (expert grid, tp token)
  kTpEp,               // "tp-ep" (expert grid): the MoE token-dispatch group
  kTpEpPp,             // "tp-ep-pp" (expert grid)
  kExpertDp,           // "edp" (expert grid, dp token): gradient reduction of expert params
  kEmbedding,          // first and last rank of each pp group (one rank when pp == 1)
  kPositionEmbedding,  // first rank of each pp group
};
std::string_view to_string(GroupKind kind);
// The rank-grid group a step-program CommGroup runs over (kWorld and kNone have none: see
// RankGrid::comm_group_members).
GroupKind group_kind_of(CommGroup group);
std::span<const GroupKind> all_group_kinds();

// A stream per communicator: the communication stream a rank issues `group`'s collectives on is named by
// the first group, in CommGroup order, whose members (in group order) on this rank are `group`'s. Groups of
// the same members share one communicator, and one communicator's work stays on one stream (NCCL gives no
// guarantee that one communicator's operations on two streams make progress). kNone: the compute stream.
// members_of(g): this rank's members of its group of g; a rank alone in a group issues nothing on it.
std::array<CommGroup, kCommGroupCount> stream_groups(
    const std::function<std::vector<int>(CommGroup)>& members_of);

class RankGrid {
 public:
  // Throws UserError when the sizes do not tile the world.
  RankGrid(int world_size, int tp, int cp, int ep, int etp, int pp, RankOrder order = RankOrder::kTpCpEpDpPp);
  static RankGrid from_config(const ParallelConfig& config);

  int world_size() const { return world_; }
  int tp() const { return tp_; }
  int cp() const { return cp_; }
  int dp() const { return dp_; }
  int pp() const { return pp_; }
  int ep() const { return ep_; }
  int etp() const { return etp_; }
  int edp() const { return edp_; }
  RankOrder order() const { return order_; }

  DenseCoordinates dense_coordinates(int rank) const;
  ExpertCoordinates expert_coordinates(int rank) const;
  int rank_of(const DenseCoordinates& coordinates) const;
  int rank_of(const ExpertCoordinates& coordinates) const;

  // All groups of a kind, in Megatron's enumeration order (ranks inside a group ascending along the
  // varying dims, first token fastest). Every kind except the embedding ones partitions the world.
  std::vector<std::vector<int>> groups(GroupKind kind) const;
  // The group of `kind` holding `rank`; empty when the rank is in none (embedding groups).
  std::vector<int> group_of(int rank, GroupKind kind) const;
  // The members (global ranks, in group order) of the group `group` that `rank` issues a collective over:
  // every rank for kWorld, the rank alone for kNone or when it is in no group of that kind.
  std::vector<int> comm_group_members(int rank, CommGroup group) const;
  // The stream `rank` issues each group's work on (indexed by CommGroup; see layouts::stream_group).
  std::array<CommGroup, kCommGroupCount> stream_groups(int rank) const;

 private:
  int world_, tp_, cp_, dp_, pp_, ep_, etp_, edp_;
  RankOrder order_;
};

}  // namespace megatune::layouts
