// ParameterLayout: the list of the model's parameters and their aligned offsets in the flat buffers.
#include "executor/model/parameter_layout.h"

#include <stdexcept>

namespace megatune::executor {

std::string layer_parameter(int layer, const char* suffix) {
  return "decoder.layers." + std::to_string(layer) + "." + suffix;
}

void ParameterLayout::add(std::string name, std::int64_t rows, std::int64_t cols, ParameterInit init,
                          bool decay) {
  ParameterEntry entry;
  entry.name = std::move(name);
  entry.rows = rows;
  entry.cols = cols;
  entry.init = init;
  entry.weight_decay = decay && rows > 1;
  entries_.push_back(std::move(entry));
}

ParameterLayout::ParameterLayout(const TransformerConfig& c) {
  const std::int64_t h = c.hidden;
  const bool layernorm = c.norm == NormKind::kLayerNorm;
  add("embedding.word_embeddings.weight", c.vocab_per_rank(), h, ParameterInit::kNormal, true);
  if (c.position == PositionEmbedding::kLearned)
    add("embedding.position_embeddings.weight", c.max_seq, h, ParameterInit::kNormal, true);
  for (int l = 0; l < c.num_layers; ++l) {
    add(layer_parameter(l, "input_layernorm.weight"), 1, h, ParameterInit::kOnes, false);
    if (layernorm) add(layer_parameter(l, "input_layernorm.bias"), 1, h, ParameterInit::kZeros, false);
    add(layer_parameter(l, "self_attention.linear_qkv.weight"), c.qkv_width(), h, ParameterInit::kNormal,
        true);
    if (c.bias)
      add(layer_parameter(l, "self_attention.linear_qkv.bias"), 1, c.qkv_width(), ParameterInit::kZeros,
          false);
    add(layer_parameter(l, "self_attention.linear_proj.weight"), h, c.attention_width(),
        ParameterInit::kScaledNormal, true);
    if (c.bias)
      add(layer_parameter(l, "self_attention.linear_proj.bias"), 1, h, ParameterInit::kZeros, false);
    add(layer_parameter(l, "pre_mlp_layernorm.weight"), 1, h, ParameterInit::kOnes, false);
    if (layernorm) add(layer_parameter(l, "pre_mlp_layernorm.bias"), 1, h, ParameterInit::kZeros, false);
    add(layer_parameter(l, "mlp.linear_fc1.weight"), c.fc1_width(), h, ParameterInit::kNormal, true);
    if (c.bias)
      add(layer_parameter(l, "mlp.linear_fc1.bias"), 1, c.fc1_width(), ParameterInit::kZeros, false);
    add(layer_parameter(l, "mlp.linear_fc2.weight"), h, c.ffn_per_rank(), ParameterInit::kScaledNormal, true);
    if (c.bias) add(layer_parameter(l, "mlp.linear_fc2.bias"), 1, h, ParameterInit::kZeros, false);
  }
  add("decoder.final_layernorm.weight", 1, h, ParameterInit::kOnes, false);
  if (layernorm) add("decoder.final_layernorm.bias", 1, h, ParameterInit::kZeros, false);
  if (!c.tied_embeddings) add("output_layer.weight", c.vocab_per_rank(), h, ParameterInit::kNormal, true);

  std::int64_t offset = 0;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    it->offset = offset;
    offset += (it->numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  total_elements_ = offset;
}

const ParameterEntry& ParameterLayout::find(const std::string& name) const {
  for (const ParameterEntry& e : entries_)
    if (e.name == name) return e;
  throw std::out_of_range("no parameter named " + name);
}

std::int64_t ParameterLayout::parameter_count() const {
  std::int64_t n = 0;
  for (const ParameterEntry& e : entries_) n += e.numel();
  return n;
}

}  // namespace megatune::executor
