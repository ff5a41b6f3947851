// MoeDispatcher: Megatron's alltoall token dispatcher (MoEAlltoAllTokenDispatcher) over the expert-parallel
// group, with expert tensor parallelism. The tp-ep ranks first exchange how many rows each sends each expert
// (an all-gather of the (E) counts over CommGroup::kTensorExpert, as Megatron gathers them over its tp-ep
// group), then the permuted rows travel in one all-to-all over kExpert with each pair's own count (Megatron's
// input and output splits: no block is padded); at ETP > 1 the received rows are all-gathered over the
// expert-tensor-parallel group (kExpertTensor), so that each ETP rank's slice of an expert sees the rows of
// the whole ETP group (the all-gather takes equal parts: each ETP rank's received rows padded to the largest
// of the group's); the rows are then sorted from (ETP rank, source rank, local expert) into (local expert,
// ETP rank, source rank) order for the expert GEMMs. combine() is the inverse way back: the experts' partial
// sums (fc2 is row-parallel over ETP) reduce-scattered over ETP, the all-to-all back. The dispatcher holds
// only the counts; the rows' buffers are the caller's (sized to what this step routes, moe_row_arena.h).
#pragma once
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

// Where one micro-batch's rows of one MoE layer go (the same on every rank of the tp-ep group).
struct MoeDispatchPlan {
  int ep = 1, ep_rank = 0, etp = 1, etp_rank = 0;
  std::int64_t experts = 0, local_experts = 0;
  // (ep * etp, E): rows tp-ep member (source * etp + etp rank) sends expert e (Megatron's tp-ep order).
  std::vector<std::int64_t> counts;
  std::int64_t count(int source, int etp_slice, std::int64_t expert) const {
    return counts[(source * etp + etp_slice) * experts + expert];
  }
  // Rows EP rank `source` sends EP rank `destination` in ETP slice `etp_slice`.
  std::int64_t sent_rows(int source, int destination, int etp_slice) const;
  // This rank's all-to-all splits: rows it sends each EP rank, rows it receives from each.
  std::vector<std::int64_t> send_splits() const;
  std::vector<std::int64_t> receive_splits() const;
  std::int64_t received_rows() const;  // rows this rank's experts process (all ETP slices)
  // Rows this rank's all-to-all receives in ETP slice t (all sources).
  std::int64_t slice_rows(int etp_slice) const;
  // Rows of each ETP rank's part of the all-gather: the largest slice (ETP > 1); this rank's slice at ETP 1.
  std::int64_t slice_stride() const;
  // Rows the expert side's buffers need: the received rows, and at ETP > 1 the padded all-gather.
  std::int64_t expert_side_rows() const { return etp > 1 ? etp * slice_stride() : received_rows(); }
  // (local experts + 1): first row of each local expert in the received, expert-sorted order.
  std::vector<std::int64_t> expert_offsets() const;
};

// The expert side's row buffers a dispatch or combine works in (at least plan.expert_side_rows() rows of h):
// the all-to-all's received rows and, at ETP > 1, the all-gather's output.
struct MoeDispatchBuffers {
  Tensor received;  // (rows, h)
  Tensor gathered;  // (rows, h); ETP > 1 only
};

class MoeDispatcher {
 public:
  MoeDispatcher(Backend& backend, Communicator& communicator, std::int64_t experts);

  // The counts exchange: every tp-ep rank's rows per expert (this rank's: tokens_per_expert, (E)).
  MoeDispatchPlan plan(const std::vector<std::int64_t>& tokens_per_expert, int layer, layouts::OpPhase phase);
  // local_rows (sum of this rank's counts, h), sorted by global expert -> expert_rows (received_rows, h),
  // sorted by local expert, then ETP rank, then source rank. Labels: the all-to-all's and the ETP
  // all-gather's.
  void dispatch(const MoeDispatchPlan& plan, Tensor local_rows, const MoeDispatchBuffers& buffers,
                Tensor expert_rows, const char* a2a_label, const char* gather_label, int layer,
                layouts::OpPhase phase);
  // The inverse: expert_rows (partial sums at ETP > 1) reduce-scattered over ETP and sent back to the ranks
  // they came from, into local_rows' order. Labels: the ETP reduce-scatter's and the all-to-all's.
  void combine(const MoeDispatchPlan& plan, Tensor expert_rows, const MoeDispatchBuffers& buffers,
               Tensor local_rows, const char* scatter_label, const char* a2a_label, int layer,
               layouts::OpPhase phase);
  int size() const { return ep_; }

 private:
  // Copies rows [first, first + n) of `from` to rows [to_first, ...) of `to` (both (rows, h)).
  void copy_rows(Tensor from, std::int64_t first, std::int64_t n, Tensor to, std::int64_t to_first);
  // Visits each (local expert e, ETP rank t, source i) chunk in expert-sorted order: its row in the
  // expert-side buffer (slice t's part from source i) and in the expert-sorted rows.
  template <class Visit>
  void for_each_chunk(const MoeDispatchPlan& plan, Visit visit) const;

  Backend& backend_;
  Communicator& communicator_;
  std::int64_t experts_ = 0;
  int ep_ = 1, ep_rank_ = 0, etp_ = 1, etp_rank_ = 0, tp_ep_ = 1;
  Tensor counts_, all_counts_;  // (1, E), (ep * etp, E) fp32: the counts exchange
};

}  // namespace megatune::executor
