// MoeAllGatherDispatcher: Megatron's allgather token dispatcher (MoEAllGatherTokenDispatcher) over the tp-ep
// group (CommGroup::kTensorExpert): every rank's routing and rows are all-gathered, each rank permutes the
// gathered rows routed to its local experts (the caller runs the experts and unpermutes them into the
// gathered order), and a reduce-scatter returns each rank its own rows' sums. The backward all-gathers the
// output gradient and reduce-scatters the input's and the routing probabilities' gradients.
#pragma once
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/model/moe_router.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

class MoeAllGatherDispatcher {
 public:
  // Scratch for local_tokens rows of `hidden` per rank and `experts` routing columns.
  MoeAllGatherDispatcher(Backend& backend, Communicator& communicator, std::int64_t experts,
                         std::int64_t local_tokens, std::int64_t hidden, DType dtype);

  int size() const { return size_; }
  std::int64_t gathered_tokens() const { return size_ * local_tokens_; }
  std::int64_t local_experts() const { return local_experts_; }
  // Rows the local experts may receive: every gathered token once per local expert it chose.
  std::int64_t max_expert_rows(int topk) const;

  // Gathers the routing (probabilities with the routing map folded in, fp32 (T/tp, E)) and x (T/tp, h);
  // returns the permutation of the gathered rows routed to this rank's experts (sorted by local expert, then
  // gathered token; "topk" = the local experts) and their first row per local expert (local experts + 1).
  MoePermutation dispatch(const MoeRouting& routing, Tensor x, std::vector<std::int64_t>& expert_offset,
                          int layer, layouts::OpPhase phase);
  Tensor gathered_rows() const { return gathered_; }  // (T/tp * size, h) after dispatch
  // The experts' outputs unpermuted into combine_rows() (T/tp * size, h) -> y (T/tp, h): the sum over ranks.
  Tensor combine_rows() const { return combined_; }
  void combine(Tensor y, int layer, layouts::OpPhase phase);

  // Backward: d_y (T/tp, h) gathered into the returned (T/tp * size, h).
  Tensor gather_output_grad(Tensor d_y, int layer);
  // input_grad_rows() (T/tp * size, h), the permutation's gradient -> d_x (T/tp, h); the gathered
  // probabilities' gradient (the plan's (gathered tokens, local experts)) -> d_probs (T/tp, k) of this rank's
  // own routing.
  Tensor input_grad_rows() const { return d_gathered_; }
  void scatter_input_grad(Tensor d_x, const MoePermutation& plan, const std::vector<float>& plan_d_probs,
                          const MoeRouting& routing, std::vector<float>& d_probs, int layer);

 private:
  Backend& backend_;
  Communicator& communicator_;
  std::int64_t experts_ = 0, local_tokens_ = 0, local_experts_ = 0;
  int size_ = 1, ep_rank_ = 0;
  Tensor routing_, all_routing_;  // (T/tp, E), (T/tp * size, E) fp32; the probabilities' gradient too
  Tensor gathered_, combined_;    // (T/tp * size, h)
  Tensor d_gathered_;             // (T/tp * size, h) the output's gradient, then the input's
};

}  // namespace megatune::executor
