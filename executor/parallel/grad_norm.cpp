// GlobalGradNorm: local sum of squares through the backend's multi-tensor norm, one world all-reduce.
#include "executor/parallel/grad_norm.h"

#include <cmath>

#include "executor/backend/backend.h"

namespace megatune::executor {

using layouts::OpPhase;

bool counts_in_grad_norm(const GradBufferEntry& entry, int tensor_parallel_rank) {
  return !entry.shared && (!entry.tensor_parallel_duplicate || tensor_parallel_rank == 0);
}

GlobalGradNorm::GlobalGradNorm(Backend& backend)
    : backend_(backend), scratch_(backend.allocate(DType::kFP32, 1, 1, "global grad norm (fp32)")) {}

float GlobalGradNorm::compute(Communicator& communicator) {
  const float local = backend_.grad_norm({"grad_norm", -1, OpPhase::kOptimizer});
  local_norm_ = local;
  if (communicator.size(CommGroup::kWorld) <= 1) return local;  // grad_norm() already set it
  float sum_of_squares = local * local;
  backend_.upload(scratch_, &sum_of_squares);
  communicator.all_reduce(CommGroup::kWorld, scratch_, ReduceOp::kSum,
                          {"grad_norm_ar", -1, OpPhase::kOptimizer, layouts::OpRole::kGradNormReduce});
  backend_.download(scratch_, &sum_of_squares);
  const float global = std::sqrt(sum_of_squares);
  backend_.set_grad_norm(global);
  return global;
}

}  // namespace megatune::executor
