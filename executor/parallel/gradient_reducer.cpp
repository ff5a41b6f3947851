// GradientReducer: readiness counting per bucket, the 1/dp scaling and the bucket collectives.
#include "executor/parallel/gradient_reducer.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "executor/backend/backend.h"

namespace megatune::executor {

using layouts::OpPhase;

GradientReducer::GradientReducer(Communicator& communicator, const GradBufferLayout& layout, Tensor grads,
                                 const GradientReducerOptions& options)
    : communicator_(communicator),
      layout_(layout),
      grads_(grads),
      options_(options),
      ready_(layout.entries().size(), 0),
      handles_launched_(layout.buckets().size(), 0),
      handles_(layout.buckets().size()) {
  require_layout_for_group(layout, communicator, options.group, "GradientReducer");
  if (grads.dtype != DType::kFP32 || grads.rows != 1 || grads.cols < layout.total_elements())
    throw std::invalid_argument("GradientReducer: grads must be an fp32 (1, >= " +
                                std::to_string(layout.total_elements()) + ") buffer");
  reset();
}

void GradientReducer::reset() {
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(handles_launched_.begin(), handles_launched_.end(), 0);
  pending_.clear();
  for (const GradBucketRange& b : layout_.buckets()) pending_.push_back(b.end_entry - b.first_entry);
}

Tensor GradientReducer::bucket_grads(int bucket) const {
  const GradBucketRange& b = layout_.buckets().at(bucket);
  return flat_range(communicator_.backend(), grads_, b.begin, b.numel());
}

Tensor GradientReducer::shard_grads(int bucket) const {
  const int rank = communicator_.rank(options_.group);
  return flat_range(communicator_.backend(), grads_, layout_.shard_begin(bucket, rank),
                    layout_.shard_elements(bucket));
}

void GradientReducer::mark_ready(int entry) {
  if (entry < 0 || entry >= static_cast<int>(ready_.size()))
    throw std::out_of_range("GradientReducer::mark_ready: no entry " + std::to_string(entry));
  if (ready_[entry])
    throw std::logic_error("GradientReducer: " + layout_.entries()[entry].name +
                           " marked ready twice in one iteration");
  ready_[entry] = 1;
  const int bucket = layout_.bucket_of(entry);
  if (--pending_[bucket] == 0 && options_.overlap_grad_reduce) launch(bucket);
}

void GradientReducer::launch(int bucket) {
  handles_launched_[bucket] = 1;
  const int group_size = communicator_.size(options_.group);
  if (group_size <= 1) return;
  const GradBucketRange& b = layout_.buckets()[bucket];
  Backend& backend = communicator_.backend();
  const Tensor all = bucket_grads(bucket);
  if (options_.scale_to_mean)
    backend.scale(all, 1.0f / static_cast<float>(group_size), {"grad_scale", -1, OpPhase::kGradSync});
  const OpTag tag =
      options_.expert
          ? OpTag{"expert_grad_bucket", -1, OpPhase::kGradSync, layouts::OpRole::kExpertGradReduce}
          : OpTag{"grad_bucket", -1, OpPhase::kGradSync, layouts::OpRole::kGradReduce};
  if (options_.distributed_optimizer) {
    handles_[bucket] = communicator_.reduce_scatter_async(
        options_.group, flat_range(backend, grads_, b.begin, b.numel(), group_size), shard_grads(bucket),
        tag);
  } else {
    handles_[bucket] = communicator_.all_reduce_async(options_.group, all, ReduceOp::kSum, tag);
  }
}

void GradientReducer::finish() {
  for (int b = 0; b < static_cast<int>(handles_launched_.size()); ++b)
    if (!handles_launched_[b]) launch(b);
  for (CommHandle& h : handles_) {
    if (h) h->wait();
    h.reset();
  }
  reset();
}

}  // namespace megatune::executor
