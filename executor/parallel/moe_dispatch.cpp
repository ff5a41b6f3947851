// MoeDispatcher: counts exchange, padded all-to-all and the (source, expert) <-> (expert, source) sort.
#include "executor/parallel/moe_dispatch.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace megatune::executor {

namespace {
constexpr layouts::OpRole kDispatchRole = layouts::OpRole::kExpertDispatch;
}  // namespace

std::int64_t MoeDispatchPlan::sent_rows(int source, int destination) const {
  std::int64_t n = 0;
  for (std::int64_t e = destination * local_experts; e < (destination + 1) * local_experts; ++e)
    n += count(source, e);
  return n;
}

std::int64_t MoeDispatchPlan::received_rows() const {
  std::int64_t n = 0;
  for (int i = 0; i < ep; ++i) n += sent_rows(i, ep_rank);
  return n;
}

std::vector<std::int64_t> MoeDispatchPlan::expert_offsets() const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(local_experts + 1), 0);
  for (std::int64_t e = 0; e < local_experts; ++e) {
    out[e + 1] = out[e];
    for (int i = 0; i < ep; ++i) out[e + 1] += count(i, ep_rank * local_experts + e);
  }
  return out;
}

MoeDispatcher::MoeDispatcher(Backend& backend, Communicator& communicator, std::int64_t experts,
                             std::int64_t max_local_rows, std::int64_t hidden, DType dtype)
    : backend_(backend), communicator_(communicator), experts_(experts), max_local_rows_(max_local_rows) {
  ep_ = communicator_.size(CommGroup::kExpert);
  ep_rank_ = communicator_.rank(CommGroup::kExpert);
  if (experts_ % ep_ != 0)
    throw std::invalid_argument("MoeDispatcher: " + std::to_string(ep_) + " expert-parallel ranks for " +
                                std::to_string(experts_) + " experts");
  send_ = backend_.allocate(dtype, ep_ * max_local_rows_, hidden, "MoE all-to-all buffers");
  receive_ = backend_.allocate(dtype, ep_ * max_local_rows_, hidden, "MoE all-to-all buffers");
  counts_ = backend_.allocate(DType::kFP32, 1, experts_, "MoE all-to-all buffers");
  all_counts_ = backend_.allocate(DType::kFP32, ep_, experts_, "MoE all-to-all buffers");
}

MoeDispatchPlan MoeDispatcher::plan(const std::vector<std::int64_t>& tokens_per_expert, int layer,
                                    layouts::OpPhase phase) {
  MoeDispatchPlan p;
  p.ep = ep_;
  p.ep_rank = ep_rank_;
  p.experts = experts_;
  p.local_experts = experts_ / ep_;
  const std::vector<float> mine(tokens_per_expert.begin(), tokens_per_expert.end());  // exact below 2^24
  backend_.upload(counts_, mine.data());
  communicator_.all_gather(CommGroup::kExpert, counts_, all_counts_,
                           {"dispatch_counts_ag", layer, phase, kDispatchRole});
  std::vector<float> all(static_cast<std::size_t>(ep_ * experts_));
  backend_.download(all_counts_, all.data());
  p.counts.assign(all.begin(), all.end());
  for (int i = 0; i < ep_; ++i)
    for (int j = 0; j < ep_; ++j) p.block_rows = std::max(p.block_rows, p.sent_rows(i, j));
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

template <class Visit>
void MoeDispatcher::for_each_chunk(const MoeDispatchPlan& plan, Visit visit) const {
  std::int64_t sorted = 0;
  std::vector<std::int64_t> in_block(static_cast<std::size_t>(ep_), 0);
  for (std::int64_t e = 0; e < plan.local_experts; ++e)
    for (int i = 0; i < ep_; ++i) {
      const std::int64_t n = plan.count(i, ep_rank_ * plan.local_experts + e);
      visit(i * plan.block_rows + in_block[i], sorted, n);
      in_block[i] += n;
      sorted += n;
    }
}

void MoeDispatcher::dispatch(const MoeDispatchPlan& plan, Tensor local_rows, Tensor expert_rows,
                             const char* label, int layer, layouts::OpPhase phase) {
  std::int64_t first = 0;
  for (int j = 0; j < ep_; ++j) {
    const std::int64_t n = plan.sent_rows(ep_rank_, j);
    copy_rows(local_rows, first, n, send_, j * plan.block_rows);
    first += n;
  }
  Tensor send = send_, receive = receive_;
  send.rows = receive.rows = ep_ * plan.block_rows;
  communicator_.all_to_all(CommGroup::kExpert, send, receive, {label, layer, phase, kDispatchRole});
  for_each_chunk(plan, [&](std::int64_t block_row, std::int64_t sorted_row, std::int64_t n) {
    copy_rows(receive_, block_row, n, expert_rows, sorted_row);
  });
}

void MoeDispatcher::combine(const MoeDispatchPlan& plan, Tensor expert_rows, Tensor local_rows,
                            const char* label, int layer, layouts::OpPhase phase) {
  for_each_chunk(plan, [&](std::int64_t block_row, std::int64_t sorted_row, std::int64_t n) {
    copy_rows(expert_rows, sorted_row, n, send_, block_row);
  });
  Tensor send = send_, receive = receive_;
  send.rows = receive.rows = ep_ * plan.block_rows;
  communicator_.all_to_all(CommGroup::kExpert, send, receive, {label, layer, phase, kDispatchRole});
  std::int64_t first = 0;
  for (int j = 0; j < ep_; ++j) {
    const std::int64_t n = plan.sent_rows(ep_rank_, j);
    copy_rows(receive_, j * plan.block_rows, n, local_rows, first);
    first += n;
  }
}

}  // namespace megatune::executor
