// ParameterLayout: where every parameter lives in the contiguous per-dtype buffers (bf16 model weights,
// fp32 main weights, fp32 gradients), laid out like Megatron's param_and_grad_buffer: its gradient buckets
// and their padding included.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "executor/model/transformer_config.h"
#include "executor/parallel/grad_buckets.h"
#include "layouts/parameter_table.h"

namespace megatune::executor {

using layouts::ParameterInit;
using layouts::StageContents;
using layouts::TensorParallelSplit;
using StageSpan = layouts::StageContents;  // the part of the model a pipeline stage (model chunk) holds

// A parameter of layouts' table (name, TP-rank shape, TP split, init) and where it lives in the buffers.
struct ParameterEntry : layouts::ParameterSpec {
  std::int64_t offset = 0;  // elements into the buffers, 64-element aligned
};

// The unsharded values of a parameter from its tensor-parallel slices (slices[r]: TP rank r's values of the
// entry's split over slices.size() ranks); the inverse of tensor_parallel_slice.
std::vector<float> tensor_parallel_assemble(const ParameterEntry& entry,
                                            const std::vector<std::vector<float>>& slices);
// This rank's slice of a parameter's unsharded values (global_rows x global_cols, row-major) under TP.
std::vector<float> tensor_parallel_slice(const ParameterEntry& entry, const std::vector<float>& global,
                                         int tp_rank, int tp_size);

// Offsets follow Megatron's buffer order: parameters are placed in reverse of their forward order (so the
// buffer fills back to front during the backward pass, which is what bucketed gradient reduction overlaps
// with), each start aligned to 64 elements, each bucket's end padded as `bucketing` says (lcm(dp, 128) under
// the distributed optimizer). MoE: the routed experts' parameters come first, in a region of their own
// (Megatron's expert-parallel buffer), then the dense ones.
class ParameterLayout {
 public:
  static constexpr std::int64_t kAlignElements = layouts::kParameterAlignElements;
  explicit ParameterLayout(const TransformerConfig& config, const StageSpan& stage = {},
                           const BufferBucketing& bucketing = {});

  const std::vector<ParameterEntry>& entries() const { return entries_; }  // forward order
  const ParameterEntry& find(const std::string& name) const;               // throws if unknown
  std::int64_t total_elements() const { return total_elements_; }          // buffer size incl. padding
  std::int64_t expert_elements() const { return expert_elements_; }        // the expert region [0, this)
  std::int64_t parameter_count() const;                                    // without padding
  // The gradient buffers of the two regions (offsets relative to the region's first element: 0 for the
  // experts', expert_elements() for the dense one); null: the chunk holds no routed experts.
  const GradBufferLayout* expert_buffer() const { return expert_buffer_ ? &*expert_buffer_ : nullptr; }
  const GradBufferLayout& dense_buffer() const { return *dense_buffer_; }

 private:
  std::vector<ParameterEntry> entries_;
  std::int64_t total_elements_ = 0;
  std::int64_t expert_elements_ = 0;
  std::optional<GradBufferLayout> expert_buffer_, dense_buffer_;
};

// The chunk's parameters of one region (the routed experts', or the dense ones) in buffer order (the reverse
// of ParameterLayout::entries()), as grad_buffer_entry sees them.
std::vector<GradBufferEntry> grad_buffer_entries(const ParameterLayout& layout, bool shared_embedding = false,
                                                 bool experts = false);

// Standard parameter names.
std::string layer_parameter(int layer, const char* suffix);  // "decoder.layers.<l>.<suffix>"

}  // namespace megatune::executor
