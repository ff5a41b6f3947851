// MoeRowArena: the expected and largest rows at a rank's experts, and the growing blocks that hold them.
#include "executor/model/moe_row_arena.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace megatune::executor {

MoeExpertRows moe_expert_rows(const TransformerConfig& config, std::int64_t local_tokens, int ep, int etp) {
  const std::int64_t k = config.router.topk, local_experts = config.num_experts / ep;
  const std::int64_t senders = std::int64_t{ep} * etp;  // the tp-ep ranks whose rows reach these experts
  MoeExpertRows rows;
  // A token picks distinct experts: at most min(k, local experts) of its copies reach one EP rank.
  rows.bound = senders * local_tokens * std::min(k, local_experts);
  if (config.router.drops_tokens()) {
    // Megatron's get_capacity on each rank's own tokens (at most every token once per expert); padded, each
    // expert gets exactly that from every sender.
    const std::int64_t capacity = config.router.expert_capacity(local_tokens);
    rows.bound = senders * local_experts * capacity;
    if (!config.router.pad_to_capacity)
      rows.bound = std::min(rows.bound, senders * local_tokens * std::min(k, local_experts));
    rows.expected = rows.bound;
    char factor[32];
    std::snprintf(factor, sizeof factor, "%g", config.router.capacity_factor);
    rows.rule = std::string("capacity factor ") + factor +
                ": ceil(tokens x topk / experts x factor) = " + std::to_string(capacity) +
                " rows per expert from each of " + std::to_string(senders) + " rank(s)" +
                (config.router.pad_to_capacity ? ", padded to it" : "");
    return rows;
  }
  rows.expected = std::min(rows.bound, etp * local_tokens * k);
  rows.rule = senders == 1
                  ? "dropless: every token's top-k choices"
                  : "balanced routing: tokens x topk / ep = " + std::to_string(local_tokens * k / ep) +
                        " rows from each of " + std::to_string(senders) +
                        " tp-ep ranks; a step that routes more grows it";
  return rows;
}

MoeRowArena::MoeRowArena(Backend& backend, DType dtype, int entries, std::vector<std::int64_t> saved_cols,
                         std::vector<std::int64_t> scratch_cols, const MoeExpertRows& rows)
    : backend_(backend),
      dtype_(dtype),
      entries_(entries),
      saved_cols_(std::move(saved_cols)),
      scratch_cols_(std::move(scratch_cols)),
      start_(rows.expected),
      bound_(rows.bound) {
  for (std::int64_t c : saved_cols_) saved_first_.push_back(std::exchange(saved_width_, saved_width_ + c));
  for (std::int64_t c : scratch_cols_)
    scratch_first_.push_back(std::exchange(scratch_width_, scratch_width_ + c));
  allocate(rows.expected);
}

void MoeRowArena::allocate(std::int64_t rows) {
  capacity_ = rows;
  saved_block_ = backend_.allocate_block(dtype_, 1, std::max<std::int64_t>(entries_ * saved_width_ * rows, 1),
                                         kSavedLabel);
  scratch_block_ =
      backend_.allocate_block(dtype_, 1, std::max<std::int64_t>(scratch_width_ * rows, 1), kScratchLabel);
}

Tensor MoeRowArena::view(Tensor block, std::int64_t first_col, std::int64_t cols) const {
  // Buffer-major: a buffer's rows are consecutive, capacity_ rows of `cols` starting at element
  // first_col * capacity_.
  Tensor t;
  t.dtype = dtype_;
  t.rows = capacity_;
  t.cols = t.row_stride = cols;
  if (block.data != nullptr)
    t.data = static_cast<char*>(block.data) + first_col * capacity_ * backend_.storage_bytes(dtype_);
  return t;
}

Tensor MoeRowArena::saved(int entry, int buffer) const {
  return view(saved_block_, entry * saved_width_ + saved_first_.at(buffer), saved_cols_.at(buffer));
}

Tensor MoeRowArena::scratch(int buffer) const {
  return view(scratch_block_, scratch_first_.at(buffer), scratch_cols_.at(buffer));
}

bool MoeRowArena::reserve(std::int64_t rows) {
  if (rows <= capacity_) return false;
  if (rows > bound_)
    throw std::logic_error("MoeRowArena: " + std::to_string(rows) + " rows routed past the bound of " +
                           std::to_string(bound_));
  // The saved rows of the micro-batches in flight move to the larger block; the scratch holds nothing
  // between layers.
  const Tensor old_saved = saved_block_, old_scratch = scratch_block_;
  const std::int64_t old_capacity = capacity_;
  std::vector<Tensor> before;
  for (int e = 0; e < entries_; ++e)
    for (std::size_t b = 0; b < saved_cols_.size(); ++b) before.push_back(saved(e, static_cast<int>(b)));
  allocate(rows);
  std::size_t i = 0;
  for (int e = 0; e < entries_; ++e)
    for (std::size_t b = 0; b < saved_cols_.size(); ++b, ++i) {
      Tensor to = saved(e, static_cast<int>(b));
      to.rows = old_capacity;
      if (old_capacity > 0) backend_.copy(before[i], to);
    }
  backend_.release_block(old_saved, kSavedLabel);
  backend_.release_block(old_scratch, kScratchLabel);
  ++growths_;
  return true;
}

}  // namespace megatune::executor
