// MoeDispatcher: counts exchange over tp-ep, padded all-to-all over EP, all-gather / reduce-scatter over ETP
// and the (ETP rank, source, expert) <-> (expert, ETP rank, source) sort.
#include "executor/model/moe_dispatch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megatune::executor {

namespace {
constexpr layouts::OpRole kDispatchRole = layouts::OpRole::kExpertDispatch;
}  // namespace

std::int64_t MoeDispatchPlan::sent_rows(int source, int destination, int etp_slice) const {
  std::int64_t n = 0;
  for (std::int64_t e = destination * local_experts; e < (destination + 1) * local_experts; ++e)
    n += count(source, etp_slice, e);
  return n;
}

std::int64_t MoeDispatchPlan::received_rows() const {
  std::int64_t n = 0;
  for (int t = 0; t < etp; ++t)
    for (int i = 0; i < ep; ++i) n += sent_rows(i, ep_rank, t);
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

MoeDispatcher::MoeDispatcher(Backend& backend, Communicator& communicator, std::int64_t experts,
                             std::int64_t max_local_rows, std::int64_t hidden, DType dtype)
    : backend_(backend), communicator_(communicator), experts_(experts), max_local_rows_(max_local_rows) {
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
  const char* label = "MoE all-to-all buffers";
  send_ = backend_.allocate(dtype, ep_ * max_local_rows_, hidden, label);
  if (ep_ > 1) receive_ = backend_.allocate(dtype, ep_ * max_local_rows_, hidden, label);
  if (etp_ > 1) gathered_ = backend_.allocate(dtype, max_received_rows(), hidden, label);
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
  for (int t = 0; t < etp_; ++t)
    for (int i = 0; i < ep_; ++i)
      for (int j = 0; j < ep_; ++j) p.block_rows = std::max(p.block_rows, p.sent_rows(i, j, t));
  if (p.block_rows > max_local_rows_)
    throw std::logic_error("MoeDispatcher: a rank sends more rows than the dropless bound");
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

Tensor MoeDispatcher::blocks(Tensor t, const MoeDispatchPlan& plan, std::int64_t blocks) {
  t.rows = blocks * plan.block_rows;
  return t;
}

template <class Visit>
void MoeDispatcher::for_each_chunk(const MoeDispatchPlan& plan, Visit visit) const {
  std::int64_t sorted = 0;
  std::vector<std::int64_t> in_block(static_cast<std::size_t>(etp_ * ep_), 0);  // (ETP rank, source)
  for (std::int64_t e = 0; e < plan.local_experts; ++e)
    for (int t = 0; t < etp_; ++t)
      for (int i = 0; i < ep_; ++i) {
        const std::int64_t n = plan.count(i, t, ep_rank_ * plan.local_experts + e);
        const int block = t * ep_ + i;
        visit(block * plan.block_rows + in_block[block], sorted, n);
        in_block[block] += n;
        sorted += n;
      }
}

void MoeDispatcher::dispatch(const MoeDispatchPlan& plan, Tensor local_rows, Tensor expert_rows,
                             const char* a2a_label, const char* gather_label, int layer,
                             layouts::OpPhase phase) {
  std::int64_t first = 0;
  for (int j = 0; j < ep_; ++j) {
    const std::int64_t n = plan.sent_rows(ep_rank_, j, etp_rank_);
    copy_rows(local_rows, first, n, send_, j * plan.block_rows);
    first += n;
  }
  if (ep_ > 1)
    communicator_.all_to_all(CommGroup::kExpert, blocks(send_, plan, ep_), blocks(receive_, plan, ep_),
                             {a2a_label, layer, phase, kDispatchRole});
  if (etp_ > 1)
    communicator_.all_gather(CommGroup::kExpertTensor, blocks(received(), plan, ep_),
                             blocks(gathered_, plan, std::int64_t{etp_} * ep_),
                             {gather_label, layer, phase, kDispatchRole});
  for_each_chunk(plan, [&](std::int64_t block_row, std::int64_t sorted_row, std::int64_t n) {
    copy_rows(expert_side(), block_row, n, expert_rows, sorted_row);
  });
}

void MoeDispatcher::combine(const MoeDispatchPlan& plan, Tensor expert_rows, Tensor local_rows,
                            const char* scatter_label, const char* a2a_label, int layer,
                            layouts::OpPhase phase) {
  // The expert side's blocks in the all-to-all's output layout (ETP > 1: all ETP ranks' blocks, whose sums
  // over the group the reduce-scatter leaves in this rank's all-to-all input).
  const Tensor packed = etp_ > 1 ? gathered_ : send_;
  for_each_chunk(plan, [&](std::int64_t block_row, std::int64_t sorted_row, std::int64_t n) {
    copy_rows(expert_rows, sorted_row, n, packed, block_row);
  });
  if (etp_ > 1)
    communicator_.reduce_scatter(CommGroup::kExpertTensor, blocks(gathered_, plan, std::int64_t{etp_} * ep_),
                                 blocks(send_, plan, ep_), {scatter_label, layer, phase, kDispatchRole});
  if (ep_ > 1)
    communicator_.all_to_all(CommGroup::kExpert, blocks(send_, plan, ep_), blocks(receive_, plan, ep_),
                             {a2a_label, layer, phase, kDispatchRole});
  std::int64_t first = 0;
  for (int j = 0; j < ep_; ++j) {
    const std::int64_t n = plan.sent_rows(ep_rank_, j, etp_rank_);
    copy_rows(received(), j * plan.block_rows, n, local_rows, first);
    first += n;
  }
}

}  // namespace megatune::executor
