// Schedule walker: a rank's schedule items with peers resolved, gradient buckets placed at their ready
// points, then the post-schedule steps (order in schedule_walker.h).
#include "layouts/schedule_walker.h"

#include <algorithm>
#include <stdexcept>

namespace megatune::layouts {
namespace {

// Appends the items of one rank's walk.
class Walker {
 public:
  Walker(const ParallelConfig& config, const RankGrid& grid, RankStep& step)
      : config_(config), grid_(grid), step_(step) {}

  void p2p(const ScheduleItem& item, int index) {
    StepItem out = base(StepItemKind::kP2p, index);
    for (int pass = 0; pass < 2; ++pass) {
      for (const P2pTransfer& t : item.transfers) {
        if ((t.direction == P2pDirection::kSend) != (pass == 0)) continue;
        out.transfers.push_back(transfer(t));
      }
    }
    step_.items.push_back(std::move(out));
  }

  void forward(const ScheduleItem& item, int index) {
    StepItem out = base(StepItemKind::kForward, index);
    out.microbatch = item.microbatch;
    out.chunk = item.chunk;
    out.stage_index = item.stage_index;
    const PipelineStage& stage = step_.stages.at(item.chunk);
    const StageContents contents = contents_of(stage);
    out.forward_groups = forward_segment_groups(contents);
    step_.items.push_back(std::move(out));
  }

  // The backward of (microbatch, chunk); `last` when it is the chunk's last one, which completes the buckets.
  void backward(const ScheduleItem& item, int index, bool last) {
    const std::vector<GradBucket>& buckets = step_.buckets.at(item.chunk);
    const int count = static_cast<int>(step_.stages.at(item.chunk).symbols.size());
    if (!last || buckets.empty() || !config_.overlap_grad_reduce) {
      step_.items.push_back(segment(item, index, 0, count, count));
      if (last) {
        for (int b = 0; b < static_cast<int>(buckets.size()); ++b)
          deferred_.push_back(bucket(item.chunk, b, buckets[b].ready_after_entry, -1));
      }
      return;
    }
    int begin = 0;
    std::size_t next = 0;
    for (int e = 0; e < count; ++e) {
      if (next >= buckets.size() || buckets[next].ready_after_entry != e) continue;
      step_.items.push_back(segment(item, index, begin, e + 1, count));
      for (; next < buckets.size() && buckets[next].ready_after_entry == e; ++next)
        step_.items.push_back(bucket(item.chunk, static_cast<int>(next), e, index));
      begin = e + 1;
    }
    if (begin < count) step_.items.push_back(segment(item, index, begin, count, count));
  }

  void after_schedule(const RankShape& shape) {
    for (StepItem& item : deferred_) step_.items.push_back(std::move(item));
    bool has_embedding = false, has_loss = false, has_mtp = false;
    for (const PipelineStage& stage : step_.stages) {
      has_embedding |= stage.has_embedding;
      has_loss |= stage.has_loss;
      has_mtp |= stage.num_mtp_layers > 0;
    }
    // The word embedding's copies: a tied head's, and the MTP layers' (Megatron reduces both over the
    // embedding group of the first and the last stage).
    const bool tied_copy = shape.tied && (has_embedding || has_loss);
    const bool mtp_copy = shape.mtp_num_layers > 0 && (has_embedding || has_mtp);
    if (shape.pp > 1 && (tied_copy || mtp_copy)) optimizer(OptimizerStep::kEmbeddingGradReduce);
    if (shape.reduces_replicated_grads()) optimizer(OptimizerStep::kSequenceParallelNormGradReduce);
    optimizer(OptimizerStep::kGradNorm);
    optimizer(OptimizerStep::kAdamW);
    if (!config_.shards_optimizer_state() || config_.shards_parameters()) return;
    for (int c = 0; c < static_cast<int>(step_.buckets.size()); ++c) {
      for (int b = 0; b < static_cast<int>(step_.buckets[c].size()); ++b) {
        StepItem gather = base(StepItemKind::kParamGather, -1);
        gather.chunk = c;
        gather.bucket = b;
        step_.items.push_back(std::move(gather));
      }
    }
  }

 private:
  static StepItem base(StepItemKind kind, int index) {
    StepItem item;
    item.kind = kind;
    item.schedule_item = index;
    return item;
  }

  StepTransfer transfer(const P2pTransfer& t) const {
    StepTransfer out;
    out.direction = t.direction;
    out.tensor = t.tensor;
    out.peer_pp_rank = t.peer_pp_rank;
    DenseCoordinates peer = step_.coordinates;
    peer.pp = t.peer_pp_rank;
    out.peer_rank = grid_.rank_of(peer);
    out.microbatch = t.microbatch;
    out.chunk = t.chunk;
    out.peer_chunk = t.peer_chunk;
    const int pp = grid_.pp();
    const int own_stage = t.chunk * pp + step_.coordinates.pp;
    out.producer_stage = t.direction == P2pDirection::kSend ? own_stage : t.peer_chunk * pp + t.peer_pp_rank;
    return out;
  }

  static StepItem segment(const ScheduleItem& item, int index, int begin, int end_entry, int count) {
    StepItem out = base(StepItemKind::kBackward, index);
    out.microbatch = item.microbatch;
    out.chunk = item.chunk;
    out.stage_index = item.stage_index;
    out.entry_begin = begin;
    out.entry_end = end_entry;
    out.entry_count = count;
    return out;
  }

  static StepItem bucket(int chunk, int index, int ready_after_entry, int schedule_item) {
    StepItem out = base(StepItemKind::kGradBucket, schedule_item);
    out.chunk = chunk;
    out.bucket = index;
    out.ready_after_entry = ready_after_entry;
    return out;
  }

  void optimizer(OptimizerStep which) {
    StepItem out = base(StepItemKind::kOptimizer, -1);
    out.optimizer_step = which;
    step_.items.push_back(std::move(out));
  }

  const ParallelConfig& config_;
  const RankGrid& grid_;
  RankStep& step_;
  std::vector<StepItem> deferred_;  // bucket items issued after the schedule (no overlap)
};

}  // namespace

namespace {

RankStep walk(const ModelSpec& model, const ParallelConfig& config, int rank,
              const StepProgramOptions& options, bool forward_only) {
  const RankGrid grid = RankGrid::from_config(config);
  if (rank < 0 || rank >= grid.world_size()) {
    throw std::out_of_range("rank " + std::to_string(rank) + " outside the world of " +
                            std::to_string(grid.world_size()));
  }
  RankStep step;
  step.rank = rank;
  step.coordinates = grid.dense_coordinates(rank);
  step.streams = grid.stream_groups(rank);
  step.shape = resolve_rank_shape(model, config);
  const std::vector<int> ring = grid.comm_group_members(rank, CommGroup::kContext);
  const int cp = static_cast<int>(ring.size()), cp_rank = step.coordinates.cp;
  step.shape.cp_ring = {cp_rank, ring.at((cp_rank + 1) % cp), ring.at((cp_rank + cp - 1) % cp)};
  const PipelineLayout layout = config.resolved_pipeline_layout(model);
  const RankSchedule schedule = build_schedule(model, config, step.coordinates.pp, forward_only);
  step.schedule_kind = schedule.kind;
  for (const PipelineStage* stage : layout.stages_of_rank(step.coordinates.pp)) {
    step.stages.push_back(*stage);
    step.buckets.push_back(forward_only ? std::vector<GradBucket>{}
                                        : grad_sync_buckets(step.shape, config,
                                                            stage_parameters(model, step.shape, *stage),
                                                            stage->vpp_rank, options));
  }
  std::vector<int> last_backward(step.stages.size(), -1);
  for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i)
    if (schedule.items[i].kind == ScheduleItemKind::kBackward) last_backward.at(schedule.items[i].chunk) = i;

  Walker walker(config, grid, step);
  for (int i = 0; i < static_cast<int>(schedule.items.size()); ++i) {
    const ScheduleItem& item = schedule.items[i];
    switch (item.kind) {
      case ScheduleItemKind::kP2p:
        walker.p2p(item, i);
        break;
      case ScheduleItemKind::kForward:
        walker.forward(item, i);
        break;
      case ScheduleItemKind::kBackward:
        walker.backward(item, i, i == last_backward[item.chunk]);
        break;
    }
  }
  if (!forward_only) walker.after_schedule(step.shape);
  return step;
}

}  // namespace

std::vector<int> forward_segment_groups(const StageContents& stage) {
  std::vector<int> groups;
  if (stage.has_embedding) groups.push_back(-1);
  for (int i = 0; i < stage.num_layers; ++i) groups.push_back(stage.first_layer + i);
  if (stage.has_loss || stage.num_mtp_layers > 0) groups.push_back(-2);
  return groups;
}

RankStep walk_rank_step(const ModelSpec& model, const ParallelConfig& config, int rank,
                        const StepProgramOptions& options) {
  return walk(model, config, rank, options, false);
}

RankStep walk_rank_forward(const ModelSpec& model, const ParallelConfig& config, int rank) {
  return walk(model, config, rank, {}, true);
}

std::string format_rank_step(const RankStep& step) {
  static const char* optimizer_names[] = {"embedding", "sp_norm", "grad_norm", "adamw"};
  std::string out;
  for (const StepItem& item : step.items) {
    if (!out.empty()) out += ' ';
    const std::string mb_chunk = std::to_string(item.microbatch) + "." + std::to_string(item.chunk);
    switch (item.kind) {
      case StepItemKind::kForward:
        out += "F" + mb_chunk;
        break;
      case StepItemKind::kBackward:
        out += "B" + mb_chunk;
        if (item.entry_begin > 0 || item.entry_end < item.entry_count)
          out += "{" + std::to_string(item.entry_begin) + "-" + std::to_string(item.entry_end) + "}";
        break;
      case StepItemKind::kP2p:
        out += '[';
        for (std::size_t i = 0; i < item.transfers.size(); ++i) {
          const StepTransfer& t = item.transfers[i];
          if (i > 0) out += ' ';
          out += format_transfer(t.direction, t.tensor, t.microbatch, t.chunk,
                                 "r" + std::to_string(t.peer_rank));
        }
        out += ']';
        break;
      case StepItemKind::kGradBucket:
        out += "G" + std::to_string(item.chunk) + "." + std::to_string(item.bucket) + "@" +
               std::to_string(item.ready_after_entry);
        break;
      case StepItemKind::kParamGather:
        out += "P" + std::to_string(item.chunk) + "." + std::to_string(item.bucket);
        break;
      case StepItemKind::kOptimizer:
        out += std::string("O:") + optimizer_names[static_cast<int>(item.optimizer_step)];
        break;
    }
  }
  return out;
}

}  // namespace megatune::layouts
