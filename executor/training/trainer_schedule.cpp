// The trainer's schedule glue (trainer_schedule.h): activation slots per chunk, the step items of a
// schedule without a walk and the single-stage schedule.
#include "executor/training/trainer_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace megatune::executor {

using layouts::P2pDirection;
using layouts::P2pTensor;
using layouts::ScheduleItemKind;

std::vector<int> activation_slots_per_chunk(const layouts::RankSchedule& schedule,
                                            const std::vector<StageSpan>& chunks) {
  const int n = static_cast<int>(chunks.size());
  std::vector<int> peak(n, 1);
  std::vector<std::vector<bool>> live(n, std::vector<bool>(schedule.num_microbatches, false));
  std::vector<int> count(n, 0);
  auto acquire = [&](int chunk, int mb) {
    if (!live.at(chunk).at(mb)) {
      live[chunk][mb] = true;
      peak[chunk] = std::max(peak[chunk], ++count[chunk]);
    }
  };
  auto release = [&](int chunk, int mb) {
    if (live.at(chunk).at(mb)) {
      live[chunk][mb] = false;
      --count[chunk];
    }
  };
  for (const layouts::ScheduleItem& item : schedule.items) {
    if (item.kind == ScheduleItemKind::kForward) acquire(item.chunk, item.microbatch);
    if (item.kind == ScheduleItemKind::kBackward && chunks.at(item.chunk).has_embedding)
      release(item.chunk, item.microbatch);
    if (item.kind != ScheduleItemKind::kP2p) continue;
    // A batch's receive buffers are taken before its sent gradients' slots are free (both are in flight).
    for (const layouts::P2pTransfer& t : item.transfers)
      if (t.direction == P2pDirection::kRecv && t.tensor == P2pTensor::kActivation)
        acquire(t.chunk, t.microbatch);
    for (const layouts::P2pTransfer& t : item.transfers)
      if (t.direction == P2pDirection::kSend && t.tensor == P2pTensor::kGradient)
        release(t.chunk, t.microbatch);
  }
  return peak;
}

std::vector<layouts::StepItem> items_from_schedule(const layouts::RankSchedule& schedule,
                                                   const std::vector<StageSpan>& chunks, int mtp_num_layers) {
  std::vector<layouts::StepItem> items;
  for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i) {
    const layouts::ScheduleItem& s = schedule.items[i];
    if (s.kind == ScheduleItemKind::kP2p)
      throw std::invalid_argument("p2p item in a schedule without a walk");
    layouts::StepItem item;
    item.kind = s.kind == ScheduleItemKind::kForward ? layouts::StepItemKind::kForward
                                                     : layouts::StepItemKind::kBackward;
    item.schedule_item = i;
    item.microbatch = s.microbatch;
    item.chunk = s.chunk;
    const StageSpan& c = chunks.at(s.chunk);
    // The loss stage holds the MTP layers (GPTModel::with_mtp_layers).
    const int mtp = c.num_mtp_layers > 0 ? c.num_mtp_layers : c.has_loss ? mtp_num_layers : 0;
    item.entry_count = c.num_layers + mtp + (c.has_embedding ? 1 : 0) + (c.has_loss ? 1 : 0);
    item.entry_end = item.entry_count;
    if (item.kind == layouts::StepItemKind::kForward)
      item.forward_groups = layouts::forward_segment_groups(c);
    items.push_back(item);
  }
  for (layouts::OptimizerStep step : {layouts::OptimizerStep::kGradNorm, layouts::OptimizerStep::kAdamW}) {
    layouts::StepItem item;
    item.kind = layouts::StepItemKind::kOptimizer;
    item.optimizer_step = step;
    items.push_back(item);
  }
  return items;
}

layouts::RankSchedule single_stage_schedule(int num_layers, int num_microbatches) {
  return layouts::build_rank_schedule(layouts::PipelineLayout::uniform(num_layers, 1), num_microbatches, 1,
                                      0);
}

}  // namespace megatune::executor
