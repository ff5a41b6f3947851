// ParameterLayout: where every parameter lives in the contiguous per-dtype buffers (bf16 model weights,
// fp32 main weights, fp32 gradients), laid out like Megatron's param_and_grad_buffer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/model/transformer_config.h"

namespace megatune::executor {

enum class ParameterInit { kNormal, kScaledNormal, kOnes, kZeros };

struct ParameterEntry {
  std::string name;                 // Megatron-like: "decoder.layers.3.mlp.linear_fc1.weight"
  std::int64_t rows = 0, cols = 0;  // (rows, cols); 1-D parameters have rows == 1
  std::int64_t offset = 0;          // elements into the buffers, 64-element aligned
  ParameterInit init = ParameterInit::kNormal;
  bool weight_decay = true;  // false for 1-D parameters and biases
  std::int64_t numel() const { return rows * cols; }
};

// Offsets follow Megatron's buffer order: parameters are placed in reverse of their forward order (so the
// buffer fills back to front during the backward pass, which is what bucketed gradient reduction overlaps
// with), each start aligned to 64 elements.
class ParameterLayout {
 public:
  static constexpr std::int64_t kAlignElements = 64;
  explicit ParameterLayout(const TransformerConfig& config);

  const std::vector<ParameterEntry>& entries() const { return entries_; }  // forward order
  const ParameterEntry& find(const std::string& name) const;               // throws if unknown
  std::int64_t total_elements() const { return total_elements_; }          // buffer size incl. padding
  std::int64_t parameter_count() const;                                    // without padding

 private:
  void add(std::string name, std::int64_t rows, std::int64_t cols, ParameterInit init, bool decay);
  std::vector<ParameterEntry> entries_;
  std::int64_t total_elements_ = 0;
};

// Standard parameter names.
std::string layer_parameter(int layer, const char* suffix);  // "decoder.layers.<l>.<suffix>"

}  // namespace megatune::executor
