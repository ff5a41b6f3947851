// MoeDispatcher: counts exchange over tp-ep, all-to-all with each pair's count over EP, all-gather /
// reduce-scatter over ETP and the (ETP rank, source, expert) <-> (expert, ETP rank, source) sort.
#include "executor/model/moe_dispatch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megatune::executor {

namespace {
constexpr layouts::OpRole kDispatchRole = layouts::OpRole::kExpertDispatch;

Tensor first_rows(Tensor t, std::int64_t rows) {
  if (rows > t.rows) throw std::logic_error("MoeDispatcher: a row buffer is smaller than the step's rows");
  t.rows = rows;
  return t;
}
}  // namespace

std::int64_t MoeDispatchPlan::sent_rows(int source, int destination, int etp_slice) const {
  std::int64_t n = 0;
  for (std::int64_t e = destination * local_experts; e < (destination + 1) * local_experts; ++e)
    n += count(source, etp_slice, e);
  return n;
}

std::vector<std::int64_t> MoeDispatchPlan::send_splits() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(ep));
  for (int j = 0; j < ep; ++j) out[j] = sent_rows(ep_rank, j, etp_rank);
  return out;
}

std::vector<std::int64_t> MoeDispatchPlan::receive_splits() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(ep));
  for (int i = 0; i < ep; ++i) out[i] = sent_rows(i, ep_rank, etp_rank);
  return out;
}

std::int64_t MoeDispatchPlan::slice_rows(int etp_slice) const {
  std::int64_t n = 0;
  for (int i = 0; i < ep; ++i) n += sent_rows(i, ep_rank, etp_slice);
  return n;
}

std::int64_t MoeDispatchPlan::slice_stride() const {
  if (etp == 1) return slice_rows(0);
  std::int64_t widest = 0;
  for (int t = 0; t < etp; ++t) widest = std::max(widest, slice_rows(t));
  return widest;
}

std::int64_t MoeDispatchPlan::received_rows() const {
  std::int64_t n = 0;
  for (int t = 0; t < etp; ++t) n += slice_rows(t);
  return n;
}

std::vector<std::int64_t> MoeDispatchPlan::expert_offsets() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(local_experts + 1), 0);
  for (std::int64_t e = 0; e < local_experts; ++e) {
    out[e + 1] = out[e];
    for (int t = 0; t < etp; ++t)
      for (int i = 0; i < ep; ++i) out[e + 1] += count(i, t, ep_rank * local_experts + e);
  }
  return out;
}

MoeDispatcher::MoeDispatcher(Backend& backend, Communicator& communicator, std::int64_t experts)
    : backend_(backend), communicator_(communicator), experts_(experts) {
  ep_ = communicator_.size(CommGroup::kExpert);
  ep_rank_ = communicator_.rank(CommGroup::kExpert);
  etp_ = communicator_.size(CommGroup::kExpertTensor);
  etp_rank_ = communicator_.rank(CommGroup::kExpertTensor);
  tp_ep_ = communicator_.size(CommGroup::kTensorExpert);
  if (experts_ % ep_ != 0)
    throw std::invalid_argument("MoeDispatcher: " + std::to_string(ep_) + " expert-parallel ranks for " +
                                std::to_string(experts_) + " experts");
  // Megatron's expert grid: the tp-ep group enumerates its members ETP rank fastest.
  if (tp_ep_ != ep_ * etp_ || communicator_.rank(CommGroup::kTensorExpert) != ep_rank_ * etp_ + etp_rank_)
    throw std::logic_error("MoeDispatcher: the tp-ep group is not the expert grid's etp x ep");
  const char* label = "MoE all-to-all counts";
  counts_ = backend_.allocate(DType::kFP32, 1, experts_, label);
  all_counts_ = backend_.allocate(DType::kFP32, tp_ep_, experts_, label);
}

MoeDispatchPlan MoeDispatcher::plan(const std::vector<std::int64_t>& tokens_per_expert, int layer,
                                    layouts::OpPhase phase) {
  MoeDispatchPlan p;
  p.ep = ep_;
  p.ep_rank = ep_rank_;
  p.etp = etp_;
  p.etp_rank = etp_rank_;
  p.experts = experts_;
  p.local_experts = experts_ / ep_;
  const std::vector<float> mine(tokens_per_expert.begin(), tokens_per_expert.end());  // exact below 2^24
  backend_.upload(counts_, mine.data());
  communicator_.all_gather(CommGroup::kTensorExpert, counts_, all_counts_,
                           {"dispatch_counts_ag", layer, phase, kDispatchRole});
  std::vector<float> all(static_cast<std::size_t>(tp_ep_ * experts_));
  backend_.download(all_counts_, all.data());
  p.counts.assign(all.begin(), all.end());
  return p;
}

void MoeDispatcher::copy_rows(Tensor from, std::int64_t first, std::int64_t n, Tensor to,
                              std::int64_t to_first) {
  if (n == 0) return;
  auto rows = [&](Tensor t, std::int64_t r) {
    Tensor v = t;
    v.data = static_cast<char*>(t.data) + r * t.row_stride * backend_.storage_bytes(t.dtype);
    v.rows = n;
    return v;
  };
  backend_.copy(rows(from, first), rows(to, to_first));
}

template <class Visit>
void MoeDispatcher::for_each_chunk(const MoeDispatchPlan& plan, Visit visit) const {
  // Slice t's rows start at t * slice_stride; within a slice, source i's rows follow source i - 1's, and
  // within a source's rows its local experts are in order.
  const std::int64_t stride = plan.slice_stride();
  std::vector<std::int64_t> next(static_cast<std::size_t>(etp_ * ep_));  // (ETP rank, source)
  for (int t = 0; t < etp_; ++t) {
    std::int64_t row = t * stride;
    for (int i = 0; i < ep_; ++i) {
      next[t * ep_ + i] = row;
      row += plan.sent_rows(i, ep_rank_, t);
    }
  }
  std::int64_t sorted = 0;
  for (std::int64_t e = 0; e < plan.local_experts; ++e)
    for (int t = 0; t < etp_; ++t)
      for (int i = 0; i < ep_; ++i) {
        const std::int64_t n = plan.count(i, t, ep_rank_ * plan.local_experts + e);
        visit(next[t * ep_ + i], sorted, n);
        next[t * ep_ + i] += n;
        sorted += n;
      }
}

void MoeDispatcher::dispatch(const MoeDispatchPlan& plan, Tensor local_rows,
                             const MoeDispatchBuffers& buffers, Tensor expert_rows, const char* a2a_label,
                             const char* gather_label, int layer, layouts::OpPhase phase) {
  // The local rows are sorted by global expert, so each EP rank's rows are one run, in rank order: they are
  // the all-to-all's input as they are. At EP 1 they are the received rows.
  const std::int64_t stride = plan.slice_stride();
  Tensor received = local_rows;
  if (ep_ > 1) {
    received = first_rows(buffers.received, stride);
    communicator_.all_to_all(CommGroup::kExpert, local_rows, plan.send_splits(), received,
                             plan.receive_splits(), {a2a_label, layer, phase, kDispatchRole});
  }
  Tensor expert_side = received;
  if (etp_ > 1) {
    // Equal parts for the all-gather: this slice's rows, padded to the widest slice of the group.
    if (ep_ == 1) {
      copy_rows(local_rows, 0, plan.slice_rows(etp_rank_), buffers.received, 0);
      received = buffers.received;
    }
    expert_side = first_rows(buffers.gathered, std::int64_t{etp_} * stride);
    communicator_.all_gather(CommGroup::kExpertTensor, first_rows(received, stride), expert_side,
                             {gather_label, layer, phase, kDispatchRole});
  }
  for_each_chunk(plan, [&](std::int64_t side_row, std::int64_t sorted_row, std::int64_t n) {
    copy_rows(expert_side, side_row, n, expert_rows, sorted_row);
  });
}

void MoeDispatcher::combine(const MoeDispatchPlan& plan, Tensor expert_rows,
                            const MoeDispatchBuffers& buffers, Tensor local_rows, const char* scatter_label,
                            const char* a2a_label, int layer, layouts::OpPhase phase) {
  // The expert side's rows back in the all-to-all's output layout (ETP > 1: every ETP rank's slice, whose
  // sums over the group the reduce-scatter leaves in this rank's slice).
  const std::int64_t stride = plan.slice_stride();
  const Tensor packed = etp_ > 1 ? first_rows(buffers.gathered, std::int64_t{etp_} * stride)
                                 : first_rows(buffers.received, stride);
  for_each_chunk(plan, [&](std::int64_t side_row, std::int64_t sorted_row, std::int64_t n) {
    copy_rows(expert_rows, sorted_row, n, packed, side_row);
  });
  Tensor slice = packed;
  if (etp_ > 1) {
    slice = first_rows(buffers.received, stride);
    communicator_.reduce_scatter(CommGroup::kExpertTensor, packed, slice,
                                 {scatter_label, layer, phase, kDispatchRole});
  }
  if (ep_ > 1) {
    communicator_.all_to_all(CommGroup::kExpert, slice, plan.receive_splits(), local_rows, plan.send_splits(),
                             {a2a_label, layer, phase, kDispatchRole});
    return;
  }
  copy_rows(slice, 0, plan.slice_rows(etp_rank_), local_rows, 0);
}

}  // namespace megatune::executor
