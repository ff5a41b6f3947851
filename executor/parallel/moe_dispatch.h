// MoeDispatcher: Megatron's alltoall token dispatcher over the expert-parallel group (ETP 1). The ranks
// first exchange how many rows each sends each expert (an all-gather of the (E) counts over kExpert), then
// the permuted rows travel in one all-to-all (every block as long as the largest rank-to-rank count, so the
// collective has equal blocks), and the received rows are sorted from (source rank, local expert) into
// (local expert, source rank) order for the expert GEMMs; combine() is the inverse way back.
#pragma once
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

// Where one micro-batch's rows of one MoE layer go (the same on every rank of the EP group).
struct MoeDispatchPlan {
  int ep = 1, ep_rank = 0;
  std::int64_t experts = 0, local_experts = 0;
  std::vector<std::int64_t> counts;  // (ep, E): rows EP rank i sends expert e
  std::int64_t block_rows = 0;       // rows of each all-to-all block (the largest rank-to-rank count)
  std::int64_t count(int source, std::int64_t expert) const { return counts[source * experts + expert]; }
  std::int64_t sent_rows(int source, int destination) const;  // rows `source` sends `destination`
  std::int64_t received_rows() const;                         // rows this rank's experts process
  // (local experts + 1): first row of each local expert in the received, expert-sorted order.
  std::vector<std::int64_t> expert_offsets() const;
};

class MoeDispatcher {
 public:
  // Scratch for up to max_local_rows rows of `hidden` per rank (the dropless bound T * k).
  MoeDispatcher(Backend& backend, Communicator& communicator, std::int64_t experts,
                std::int64_t max_local_rows, std::int64_t hidden, DType dtype);

  // The counts exchange: every rank's rows per expert (this rank's: tokens_per_expert, (E)).
  MoeDispatchPlan plan(const std::vector<std::int64_t>& tokens_per_expert, int layer, layouts::OpPhase phase);
  // local_rows (sum of this rank's counts, h), sorted by global expert -> expert_rows (received_rows, h),
  // sorted by local expert, then source rank.
  void dispatch(const MoeDispatchPlan& plan, Tensor local_rows, Tensor expert_rows, const char* label,
                int layer, layouts::OpPhase phase);
  // The inverse: expert_rows back to the ranks they came from, into local_rows' order.
  void combine(const MoeDispatchPlan& plan, Tensor expert_rows, Tensor local_rows, const char* label,
               int layer, layouts::OpPhase phase);
  int size() const { return ep_; }
  // Rows the expert side may receive: every rank's max_local_rows.
  std::int64_t max_received_rows() const { return ep_ * max_local_rows_; }

 private:
  // Copies rows [first, first + n) of `from` to rows [to_first, ...) of `to` (both (rows, h)).
  void copy_rows(Tensor from, std::int64_t first, std::int64_t n, Tensor to, std::int64_t to_first);
  // Visits each (local expert e, source i) chunk in expert-sorted order: its row in block i of the
  // all-to-all buffer and in the expert-sorted rows.
  template <class Visit>
  void for_each_chunk(const MoeDispatchPlan& plan, Visit visit) const;

  Backend& backend_;
  Communicator& communicator_;
  std::int64_t experts_ = 0, max_local_rows_ = 0;
  int ep_ = 1, ep_rank_ = 0;
  Tensor send_, receive_;       // (ep * max_local_rows, h) the all-to-all buffers
  Tensor counts_, all_counts_;  // (1, E), (ep, E) fp32: the counts exchange
};

}  // namespace megatune::executor
