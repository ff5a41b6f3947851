// GlobalGradNorm: Megatron's global gradient L2 norm across the model-parallel and data-parallel ranks:
// each rank sums the squares of the gradients it owns (each element of the model counted once over the
// world), the sums are all-reduced over the world, and the norm is what AdamW clips by and skips on.
#pragma once
#include "executor/parallel/communicator.h"
#include "executor/parallel/grad_buckets.h"

namespace megatune::executor {

// Whether a rank at `tensor_parallel_rank` counts `entry`'s gradient: not a shared copy, and a
// TP-replicated parameter only on tp rank 0 (Megatron's param_is_not_shared and
// param_is_not_tensor_parallel_duplicate). Without the distributed optimizer, only dp rank 0 counts
// (every data-parallel rank holds the same reduced gradients); with it, each rank counts its shard.
bool counts_in_grad_norm(const GradBufferEntry& entry, int tensor_parallel_rank);

class GlobalGradNorm {
 public:
  explicit GlobalGradNorm(Backend& backend);  // allocates a (1, 1) fp32 scratch (sizing mode included)

  // backend.grad_norm() over this rank's registered in_grad_norm tensors ("grad_norm"), squared, summed
  // over CommGroup::kWorld ("grad_norm_ar", phase kOptimizer), square-rooted; handed to
  // backend.set_grad_norm() and returned. Non-finite when any rank's gradients are. On one rank: the local
  // norm itself.
  float compute(Communicator& communicator);
  // This rank's own part of the last compute(): the norm of the gradients it counts.
  float local_norm() const { return local_norm_; }

 private:
  Backend& backend_;
  float local_norm_ = 0.0f;
  Tensor scratch_;  // (1, 1) fp32
};

}  // namespace megatune::executor
