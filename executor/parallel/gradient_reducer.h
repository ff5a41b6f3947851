// GradientReducer: the data-parallel gradient reduction of one model chunk's grad buffer, bucket by bucket
// (Megatron's DDP with --overlap-grad-reduce): a bucket's reduction is launched as soon as every gradient in
// it is final, or all at the end of the backward.
#pragma once
#include <vector>

#include "executor/parallel/communicator.h"
#include "executor/parallel/grad_buckets.h"

namespace megatune::executor {

struct GradientReducerOptions {
  bool overlap_grad_reduce = false;    // launch each bucket when its last gradient is marked ready
  bool distributed_optimizer = false;  // reduce-scatter into this rank's shard instead of all-reduce
  CommGroup group = CommGroup::kDataContext;
  bool expert = false;  // the expert-parameter buffer (over kExpertData): recorded as expert_grad_bucket
  // Multiply each bucket by 1 / group size before its collective (Megatron's gradient_scaling_factor). Off
  // when the loss gradient already carries 1 / (dp * cp) (the Trainer's choice: no extra op per bucket).
  bool scale_to_mean = true;
};

// Scaling: each bucket is multiplied by 1 / group size just before its collective (Megatron's
// gradient_scaling_factor, "before the reduction"), so the sum the collective forms is the mean over
// dp * cp. For a power-of-two group this is exactly the mean of the members' gradients.
// After finish(): without the distributed optimizer the whole buffer holds the mean; with it, this rank's
// shard of every bucket (GradBufferLayout::shard_begin) does, and the rest of the buffer holds this rank's
// scaled local gradients.
// Ops: per bucket an elementwise "grad_scale" then an all-reduce / reduce-scatter "grad_bucket", phase
// kGradSync, over `group`; nothing when the group has one member.
class GradientReducer {
 public:
  // `grads`: the (1, >= layout.total_elements()) fp32 buffer laid out by `layout`, whose
  // data_parallel_size must be the group's size.
  GradientReducer(Communicator& communicator, const GradBufferLayout& layout, Tensor grads,
                  const GradientReducerOptions& options);

  // The gradient of `entry` (GradBufferLayout index) is final for this iteration. With overlap, the last
  // entry of a bucket launches its reduction. Throws std::logic_error when marked twice.
  void mark_ready(int entry);
  // Launches every bucket not yet launched, in bucket order, and waits for all of them; then the next
  // iteration may start (nothing is ready).
  void finish();
  // Launches bucket `bucket` now if it has not been (the schedule walker's kGradBucket point).
  void launch_bucket(int bucket) {
    if (!handles_launched_.at(bucket)) launch(bucket);
  }

  Tensor bucket_grads(int bucket) const;  // (1, numel) view of the buffer
  Tensor shard_grads(int bucket) const;   // (1, numel / dp) this rank's shard
  bool launched(int bucket) const { return handles_launched_.at(bucket) != 0; }

 private:
  void launch(int bucket);
  void reset();  // nothing ready, nothing launched

  Communicator& communicator_;
  const GradBufferLayout& layout_;
  Tensor grads_;
  GradientReducerOptions options_;
  std::vector<char> ready_;             // per entry
  std::vector<int> pending_;            // per bucket: entries not yet ready
  std::vector<char> handles_launched_;  // per bucket
  std::vector<CommHandle> handles_;     // per bucket (nullptr: completed eagerly or nothing to do)
};

}  // namespace megatune::executor
