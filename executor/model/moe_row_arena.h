// MoeRowArena: the MoE layers' rows at the experts, sized to what is routed, as Megatron's dropless MoE
// allocates them each step. Each (slot, layer) in flight keeps its saved rows (the experts' input and fc1
// output, ...) in a segment of `capacity` rows of one block outside the arena, and the layers share scratch
// rows in a second block. Both start at the rows a balanced routing brings (moe_expert_rows); a step that
// routes more rows than any step before grows them (larger blocks; the saved segments are copied over),
// never beyond the dropless bound. With a capacity factor the bound is the capacity, and the start is it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/model/transformer_config.h"

namespace megatune::executor {

// The rows one MoE layer's experts process on a rank, per micro-batch: `expected` under balanced routing
// (what the blocks start at, and what a sizing pass reports), `bound` the most a step can route there.
struct MoeExpertRows {
  std::int64_t expected = 0, bound = 0;
  std::string rule;  // how `expected` was reached, in words for the memory report
};
// local_tokens: the rows entering the layer on this rank (T / tp); ep, etp: the expert grid. Both
// dispatchers bring the same rows: the tp-ep group's copies routed to this rank's experts.
MoeExpertRows moe_expert_rows(const TransformerConfig& config, std::int64_t local_tokens, int ep, int etp);

class MoeRowArena {
 public:
  static constexpr const char* kSavedLabel = "saved: MoE expert rows (sized to the routed tokens)";
  static constexpr const char* kScratchLabel = "MoE expert-row scratch (sized to the routed tokens)";
  // `entries` saved segments, each with buffers of saved_cols[b] columns; shared scratch buffers of
  // scratch_cols[b] columns; all `rows.expected` rows to begin with.
  MoeRowArena(Backend& backend, DType dtype, int entries, std::vector<std::int64_t> saved_cols,
              std::vector<std::int64_t> scratch_cols, const MoeExpertRows& rows);

  // Makes every buffer hold at least `rows` rows (a step that routes that many); true when it grew.
  // std::logic_error past the bound.
  bool reserve(std::int64_t rows);
  Tensor saved(int entry, int buffer) const;  // (capacity_rows, saved_cols[buffer])
  Tensor scratch(int buffer) const;           // (capacity_rows, scratch_cols[buffer])
  std::int64_t capacity_rows() const { return capacity_; }
  std::int64_t start_rows() const { return start_; }  // the expected count it began with
  std::int64_t bound_rows() const { return bound_; }
  int growths() const { return growths_; }

 private:
  Tensor view(Tensor block, std::int64_t first_col, std::int64_t cols) const;
  void allocate(std::int64_t rows);

  Backend& backend_;
  DType dtype_;
  int entries_ = 0;
  std::vector<std::int64_t> saved_cols_, scratch_cols_, saved_first_, scratch_first_;
  std::int64_t saved_width_ = 0, scratch_width_ = 0, capacity_ = 0, start_ = 0, bound_ = 0;
  int growths_ = 0;
  Tensor saved_block_,
      scratch_block_;  // (1, entries * saved width * capacity), (1, scratch width * capacity)
};

}  // namespace megatune::executor
