// ParameterLayout: where every parameter lives in the contiguous per-dtype buffers (bf16 model weights,
// fp32 main weights, fp32 gradients), laid out like Megatron's param_and_grad_buffer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/model/transformer_config.h"

namespace megatune::executor {

enum class ParameterInit { kNormal, kScaledNormal, kOnes, kZeros };

// How a parameter is split over the tensor-parallel group (Megatron's conjugate mappings): column-parallel
// linears (QKV, fc1) and the vocab-parallel embedding / LM head split their rows (out-features), row-parallel
// linears (proj, fc2) their columns (in-features); norms, row-parallel biases and learned positions are
// replicated.
enum class TensorParallelSplit { kReplicated, kRows, kColumns };

struct ParameterEntry {
  std::string name;                 // Megatron-like: "decoder.layers.3.mlp.linear_fc1.weight"
  std::int64_t rows = 0, cols = 0;  // (rows, cols) on this TP rank; 1-D parameters have rows == 1
  std::int64_t offset = 0;          // elements into the buffers, 64-element aligned
  ParameterInit init = ParameterInit::kNormal;
  bool weight_decay = true;  // false for 1-D parameters and biases
  TensorParallelSplit split = TensorParallelSplit::kReplicated;
  // The unsharded tensor is the concatenation of parts along the split dimension, each split over TP on its
  // own (QKV: [q | k | v]; SwiGLU fc1: [gate | up]); global sizes of the parts (one part: the whole).
  std::vector<std::int64_t> global_parts;
  bool sequence_parallel_grad = false;  // a norm under SP: its gradient is all-reduced over TP
  std::int64_t numel() const { return rows * cols; }
  std::int64_t global_rows() const;
  std::int64_t global_cols() const;
};

// This rank's slice of a parameter's unsharded values (global_rows x global_cols, row-major) under TP.
std::vector<float> tensor_parallel_slice(const ParameterEntry& entry, const std::vector<float>& global,
                                         int tp_rank, int tp_size);

// The part of the model a pipeline stage (one model chunk) holds: decoder layers [first_layer,
// first_layer + num_layers) in global numbering, the embedding, the final norm + LM head + loss.
struct StageSpan {
  int first_layer = 0;
  int num_layers = -1;  // -1: every layer of the model
  bool has_embedding = true;
  bool has_loss = true;
};

// Offsets follow Megatron's buffer order: parameters are placed in reverse of their forward order (so the
// buffer fills back to front during the backward pass, which is what bucketed gradient reduction overlaps
// with), each start aligned to 64 elements.
class ParameterLayout {
 public:
  static constexpr std::int64_t kAlignElements = 64;
  explicit ParameterLayout(const TransformerConfig& config, const StageSpan& stage = {});

  const std::vector<ParameterEntry>& entries() const { return entries_; }  // forward order
  const ParameterEntry& find(const std::string& name) const;               // throws if unknown
  std::int64_t total_elements() const { return total_elements_; }          // buffer size incl. padding
  std::int64_t parameter_count() const;                                    // without padding

 private:
  ParameterEntry& add(std::string name, std::int64_t rows, std::int64_t cols, ParameterInit init, bool decay,
                      TensorParallelSplit split = TensorParallelSplit::kReplicated,
                      std::vector<std::int64_t> global_parts = {});
  std::vector<ParameterEntry> entries_;
  std::int64_t total_elements_ = 0;
};

// Standard parameter names.
std::string layer_parameter(int layer, const char* suffix);  // "decoder.layers.<l>.<suffix>"

}  // namespace megatune::executor
