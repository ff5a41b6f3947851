// Schedule walker: the ordered items of one global rank's training iteration, the one walk of the schedule
// that every interpreter of the step program loops over: the step-program builder (build_step_program:
// step_item_ops per item), the simulator (planner/simulator.cpp) and the executor's pipeline runner. It
// resolves once what the pipeline schedule (layouts/schedule.h) leaves implicit: the peers' global ranks,
// each chunk's gradient buckets and the point where each becomes ready, and the steps after the schedule.
//
// Order of the items (the order of build_step_program's ops):
// 1. The schedule's items (RankSchedule::items) in order: kForward, kBackward and kP2p, each with
//    schedule_item = its index there. A kForward lists its forward segments (forward_groups): the embedding,
//    each decoder layer, the head; the executor's pipeline runner waits each segment's parameters before it.
//    With --overlap-grad-reduce the last backward of each chunk that has gradient buckets is split into
//    kBackward segments at the buckets' ready points: a segment runs the parameter entries [entry_begin,
//    entry_end) (StageParameters' reverse order: loss, layers last..first, embedding) and is followed by the
//    kGradBucket items of the buckets that its last entry completes (schedule_item of that backward): the
//    point where the bucket's reduction is launched. Every other backward is one kBackward item over all
//    entries [0, entry_count).
// 2. Without overlap: the kGradBucket items of every chunk (schedule_item -1), chunks in the order of their
//    last backward, buckets in index order.
// 3. kOptimizer items, in OptimizerStep order, those that apply to the rank (schedule_item -1).
// 4. With the distributed optimizer (or FSDP optim, optim_grads): a kParamGather per bucket, chunks in
//    order (schedule_item -1). The simulator issues them at the start of the iteration with
//    --overlap-param-gather (the gather of the previous iteration's update overlapping the first forwards).
//    FSDP optim_grads_params has none: its gathers are ops of the kForward and kBackward items
//    (step_item_ops), each right before the segment or entry that reads the bucket.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"
#include "layouts/rank_grid.h"
#include "layouts/schedule.h"
#include "layouts/step_program.h"

namespace megatune::layouts {

enum class StepItemKind {
  kForward,   // forward pass of (microbatch, chunk) through stage stage_index
  kBackward,  // backward pass of (microbatch, chunk), or one segment of it: entries [entry_begin, entry_end)
  kP2p,       // one batched group of pipeline transfers (posted together, done when all met their peers)
  kGradBucket,   // RankStep::buckets[chunk][bucket] is complete: its reduction is issued here
  kParamGather,  // the distributed optimizer's all-gather of RankStep::buckets[chunk][bucket]'s params
  kOptimizer,    // one post-schedule step (optimizer_step)
};

// One tensor of a kP2p item: the schedule's P2pTransfer plus the peer's global rank and the producer stage.
struct StepTransfer {
  P2pDirection direction = P2pDirection::kSend;
  P2pTensor tensor = P2pTensor::kActivation;
  int peer_rank = 0;       // global rank on the other side (Op::peer_rank)
  int peer_pp_rank = 0;    // its pipeline rank
  int microbatch = 0;      // microbatch the tensor belongs to
  int chunk = 0;           // model chunk on this rank that produced (send) / will consume (recv) it
  int peer_chunk = 0;      // model chunk on the peer that consumes (send) / produced (recv) it
  int producer_stage = 0;  // global stage index (chunk * pp + pp rank) whose pass produced the tensor:
                           // with tensor and microbatch it names the message on its (src, dst) channel
  friend bool operator==(const StepTransfer&, const StepTransfer&) = default;
};

struct StepItem {
  StepItemKind kind = StepItemKind::kForward;
  int schedule_item = -1;  // index into RankSchedule::items; -1 after the schedule
  int microbatch = -1;     // kForward / kBackward
  int chunk = -1;          // kForward / kBackward / kGradBucket / kParamGather: model chunk (vpp rank)
  int stage_index = -1;    // kForward / kBackward: global stage index in the layout
  // kBackward: the parameter entries this item runs, of entry_count (= the stage's symbols). A whole pass
  // is [0, entry_count); a segmented pass starts at entry_begin == 0 and ends at entry_end == entry_count.
  int entry_begin = 0, entry_end = 0, entry_count = 0;
  // kForward: the pass's segments in forward order, each named by the parameter group it reads
  // (forward_segment_groups): an interpreter runs the pass segment by segment and waits a group's parameters
  // (a per-layer parameter gather) right before the segment that reads them.
  std::vector<int> forward_groups;
  std::vector<StepTransfer> transfers;  // kP2p: sends first, then receives (each in schedule order)
  int bucket = -1;                      // kGradBucket / kParamGather: index into RankStep::buckets[chunk]
  int ready_after_entry = -1;           // kGradBucket: the backward entry whose gradient completes it
  OptimizerStep optimizer_step = OptimizerStep::kGradNorm;  // kOptimizer
};

// One rank's iteration: the items and the facts they index.
struct RankStep {
  int rank = 0;
  DenseCoordinates coordinates;
  std::array<CommGroup, kCommGroupCount> streams{};  // RankGrid::stream_groups(rank): each op's stream
  ScheduleKind schedule_kind = ScheduleKind::kNoPipelining;
  RankShape shape;
  std::vector<PipelineStage> stages;             // per chunk (vpp rank) of this rank
  std::vector<std::vector<GradBucket>> buckets;  // per chunk: grad_sync_buckets, in reduction order
  std::vector<StepItem> items;                   // in issue order
};

// The forward segments of a stage holding `stage`, by the parameter group each reads (the codes of
// StageParameters::layer_reverse): -1 the embedding (E), the global index of each decoder layer (t), then -2
// once for the head (the final norm, the MTP layers and the LM head with its loss: the MTP layers read the
// LM head and the embedding) when the stage holds L or m. An empty stage has none.
std::vector<int> forward_segment_groups(const StageContents& stage);
// The forward segment (its group code) of a parameter code of StageParameters::layer_reverse: the code
// itself, -2 (the head) for the MTP layers' codes.
inline int forward_segment_group_of(int layer_code) { return layer_code <= -2 ? -2 : layer_code; }

// The walk of one global rank of a validated (model, config). Throws std::out_of_range for a rank outside
// the world.
RankStep walk_rank_step(const ModelSpec& model, const ParallelConfig& config, int rank,
                        const StepProgramOptions& options = {});

// The forward-only walk of the same rank (evaluation, Megatron's forward_only=True): the items of
// build_schedule(..., forward_only) — kForward and kP2p only, no buckets, no optimizer steps.
RankStep walk_rank_forward(const ModelSpec& model, const ParallelConfig& config, int rank);

// Compact text of the items, separated by spaces: F<mb>.<chunk>, B<mb>.<chunk> (a segment adds
// {<begin>-<end>}, its entry range), p2p groups in brackets as format_schedule writes them with the peer's
// global rank (+a0.0@r3), G<chunk>.<bucket>@<ready entry> for a bucket, P<chunk>.<bucket> for a param
// gather, O:<step> for an optimizer step (embedding, sp_norm, grad_norm, adamw).
std::string format_rank_step(const RankStep& step);

}  // namespace megatune::layouts
