// Pipeline schedules: per pp rank, the ordered forward/backward passes of (microbatch, model chunk) and
// the batched p2p exchanges they imply, in Megatron's order (no pipelining, 1F1B, interleaved 1F1B).
// This is the schedule level of the step program (DESIGN.md).
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"

namespace megatune::layouts {

enum class ScheduleKind { kNoPipelining, kOneForwardOneBackward, kInterleaved };
std::string_view to_string(ScheduleKind kind);  // "no-pipelining" | "1f1b" | "interleaved-1f1b"

enum class ScheduleItemKind { kForward, kBackward, kP2p };
enum class P2pDirection { kSend, kRecv };
enum class P2pTensor {
  kActivation,
  kGradient
};  // activation flows to the next stage, gradient to the previous

// One tensor of a p2p exchange. Shape: [s/cp (/tp with SP), micro_batch, hidden] (megatron.md §3).
struct P2pTransfer {
  P2pDirection direction = P2pDirection::kSend;
  P2pTensor tensor = P2pTensor::kActivation;
  int peer_pp_rank = 0;
  int microbatch = 0;  // microbatch the tensor belongs to
  int chunk = 0;       // model chunk on this rank that produced (send) / will consume (recv) it
  int peer_chunk = 0;  // model chunk on the peer that consumes (send) / produced (recv) it
  friend bool operator==(const P2pTransfer&, const P2pTransfer&) = default;
};

// One step of a rank's schedule.
// - kForward / kBackward: the pass of (microbatch, chunk) through stage `stage_index` of the layout
//   (PipelineLayout::stages()[stage_index]); an empty stage is an identity pass that still takes part
//   in the p2p chain, a stage holding only E or L runs just the embedding or the output layer + loss.
// - kP2p: one batched group of sends and receives (Megatron's _communicate / batch_isend_irecv): all are
//   posted together and the item completes when every transfer met its peer's matching transfer.
struct ScheduleItem {
  ScheduleItemKind kind = ScheduleItemKind::kForward;
  int microbatch = -1;                 // kForward / kBackward
  int chunk = -1;                      // kForward / kBackward: model chunk (vpp rank)
  int stage_index = -1;                // kForward / kBackward: global stage index in the layout
  std::vector<P2pTransfer> transfers;  // kP2p
};

struct RankSchedule {
  ScheduleKind kind = ScheduleKind::kNoPipelining;
  int pp_rank = 0;
  int pp = 1;
  int vpp = 1;
  int num_microbatches = 0;
  int microbatch_group_size = 0;  // interleaved only
  int num_warmup_forwards = 0;    // forwards before the first backward (Megatron's num_warmup_microbatches)
  bool all_forwards_in_warmup = false;
  bool forward_only = false;  // evaluation: forwards and activation transfers only
  std::vector<ScheduleItem> items;
};

// Megatron's table over virtual microbatch ids k in [0, m*v): groups of g microbatches; inside a group,
// for chunk c = 0..v-1, each microbatch of the group. Returns (microbatch, chunk) per k (forward order;
// backward of k uses chunk v-1-c).
struct VirtualMicrobatch {
  int microbatch = 0;
  int chunk = 0;
};
std::vector<VirtualMicrobatch> interleaved_schedule_table(int num_microbatches, int vpp, int group_size);

// Megatron's warm-up forward count for pp rank r (get_pp_rank_microbatches): pp == 1: 0;
// 1F1B: min(p - r - 1, m); interleaved: min(2(p - r - 1) + (v - 1) g, m v).
int warmup_forward_count(int pp, int pp_rank, int vpp, int num_microbatches, int group_size);

// Builds the schedule of one pp rank for a layout (pp and vpp from the layout). Throws UserError on the
// interleaving constraints (p <= g <= m, m % g == 0 or >= p) and pp == 1 with several chunks.
// forward_only (Megatron's forward_only=True, evaluation): every forward is a warm-up forward, in the
// training schedule's forward order, with its receive and send of activations; no backward, no gradient.
RankSchedule build_rank_schedule(const PipelineLayout& layout, int num_microbatches, int group_size,
                                 int pp_rank, bool forward_only = false);
// Same for a validated (model, config).
RankSchedule build_schedule(const ModelSpec& model, const ParallelConfig& config, int pp_rank,
                            bool forward_only = false);
std::vector<RankSchedule> build_all_schedules(const ModelSpec& model, const ParallelConfig& config);

// Largest number of (microbatch, chunk) forwards whose backward has not run yet, over the schedule:
// the activations a rank holds at its peak. Megatron: min(W + 1, m v) with W the warm-up count.
int max_in_flight_microbatches(const RankSchedule& schedule);

// Compact text, items separated by spaces: F<mb>.<chunk>, B<mb>.<chunk>, and p2p groups in brackets with
// +a/-a (send/recv activation) and +g/-g (gradient) followed by <mb>.<chunk>@<peer pp rank>,
// e.g. "F0.0 [+a0.0@1] F1.0 [+a1.0@1 -g0.0@1] B0.0". Without p2p: "F0.0 F1.0 B0.0".
std::string format_schedule(const RankSchedule& schedule, bool include_p2p = true);
// One transfer in that text: +a/-a/+g/-g, then <microbatch>.<chunk>@<peer> (e.g. "-g3.0@1").
std::string format_transfer(P2pDirection direction, P2pTensor tensor, int microbatch, int chunk,
                            const std::string& peer);

}  // namespace megatune::layouts
