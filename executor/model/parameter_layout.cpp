// ParameterLayout: the list of the model's parameters and their aligned offsets in the flat buffers.
#include "executor/model/parameter_layout.h"

#include <stdexcept>

namespace megatune::executor {

std::string layer_parameter(int layer, const char* suffix) {
  return "decoder.layers." + std::to_string(layer) + "." + suffix;
}

ParameterEntry& ParameterLayout::add(std::string name, std::int64_t rows, std::int64_t cols, ParameterInit init,
                                    bool decay, TensorParallelSplit split,
                                    std::vector<std::int64_t> global_parts) {
  ParameterEntry entry;
  entry.name = std::move(name);
  entry.rows = rows;
  entry.cols = cols;
  entry.init = init;
  entry.weight_decay = decay && rows > 1;
  entry.split = split;
  entry.global_parts = std::move(global_parts);
  entries_.push_back(std::move(entry));
  return entries_.back();
}

ParameterLayout::ParameterLayout(const TransformerConfig& c, const StageSpan& stage) {
  using Split = TensorParallelSplit;
  const std::int64_t h = c.hidden, tp = c.tensor_parallel_size, d = c.head_dim;
  const bool layernorm = c.norm == NormKind::kLayerNorm;
  const std::int64_t vocab = c.vocab_size, ffn = c.ffn_hidden;
  const std::vector<std::int64_t> qkv_parts = {c.heads * d, c.kv_heads * d, c.kv_heads * d};
  const std::vector<std::int64_t> fc1_parts =
      c.activation == ActivationKind::kSwiglu ? std::vector<std::int64_t>{ffn, ffn} : std::vector<std::int64_t>{ffn};
  auto norm = [&](const std::string& prefix) {
    add(prefix + ".weight", 1, h, ParameterInit::kOnes, false).sequence_parallel_grad = c.sequence_parallel;
    if (layernorm)
      add(prefix + ".bias", 1, h, ParameterInit::kZeros, false).sequence_parallel_grad = c.sequence_parallel;
  };
  if (stage.has_embedding) {
    add("embedding.word_embeddings.weight", vocab / tp, h, ParameterInit::kNormal, true, Split::kRows, {vocab});
    if (c.position == PositionEmbedding::kLearned)
      add("embedding.position_embeddings.weight", c.max_seq, h, ParameterInit::kNormal, true);
  }
  const int layers = stage.num_layers < 0 ? c.num_layers : stage.num_layers;
  for (int l = stage.first_layer; l < stage.first_layer + layers; ++l) {
    norm(layer_parameter(l, "input_layernorm"));
    add(layer_parameter(l, "self_attention.linear_qkv.weight"), c.qkv_width(), h, ParameterInit::kNormal, true,
        Split::kRows, qkv_parts);
    if (c.bias)
      add(layer_parameter(l, "self_attention.linear_qkv.bias"), 1, c.qkv_width(), ParameterInit::kZeros, false,
          Split::kColumns, qkv_parts);
    add(layer_parameter(l, "self_attention.linear_proj.weight"), h, c.attention_width(),
        ParameterInit::kScaledNormal, true, Split::kColumns, {c.heads * d});
    if (c.bias)
      add(layer_parameter(l, "self_attention.linear_proj.bias"), 1, h, ParameterInit::kZeros, false);
    norm(layer_parameter(l, "pre_mlp_layernorm"));
    add(layer_parameter(l, "mlp.linear_fc1.weight"), c.fc1_width(), h, ParameterInit::kNormal, true, Split::kRows,
        fc1_parts);
    if (c.bias)
      add(layer_parameter(l, "mlp.linear_fc1.bias"), 1, c.fc1_width(), ParameterInit::kZeros, false,
          Split::kColumns, fc1_parts);
    add(layer_parameter(l, "mlp.linear_fc2.weight"), h, c.ffn_per_rank(), ParameterInit::kScaledNormal, true,
        Split::kColumns, {ffn});
    if (c.bias) add(layer_parameter(l, "mlp.linear_fc2.bias"), 1, h, ParameterInit::kZeros, false);
  }
  if (stage.has_loss) {
    norm("decoder.final_layernorm");
    // Untied: the output layer. Tied on a stage without the embedding (pp > 1): the last stage's own copy of
    // the word embedding (same name and initial values; its gradient is all-reduced with the first stage's).
    if (!c.tied_embeddings)
      add("output_layer.weight", vocab / tp, h, ParameterInit::kNormal, true, Split::kRows, {vocab});
    else if (!stage.has_embedding)
      add("embedding.word_embeddings.weight", vocab / tp, h, ParameterInit::kNormal, true, Split::kRows, {vocab});
  }
  for (ParameterEntry& e : entries_)
    if (e.global_parts.empty()) e.global_parts = {e.split == Split::kColumns ? e.cols : e.rows};

  std::int64_t offset = 0;
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    it->offset = offset;
    offset += (it->numel() + kAlignElements - 1) / kAlignElements * kAlignElements;
  }
  total_elements_ = offset;
}

namespace {
std::int64_t parts_sum(const std::vector<std::int64_t>& parts) {
  std::int64_t n = 0;
  for (std::int64_t p : parts) n += p;
  return n;
}
}  // namespace

std::int64_t ParameterEntry::global_rows() const {
  return split == TensorParallelSplit::kRows ? parts_sum(global_parts) : rows;
}
std::int64_t ParameterEntry::global_cols() const {
  return split == TensorParallelSplit::kColumns ? parts_sum(global_parts) : cols;
}

std::vector<float> tensor_parallel_slice(const ParameterEntry& e, const std::vector<float>& global, int tp_rank,
                                         int tp_size) {
  const std::int64_t grows = e.global_rows(), gcols = e.global_cols();
  if (static_cast<std::int64_t>(global.size()) != grows * gcols)
    throw std::invalid_argument("tensor_parallel_slice: " + e.name + " has the wrong element count");
  if (e.split == TensorParallelSplit::kReplicated || tp_size == 1) return global;
  std::vector<float> out;
  out.reserve(static_cast<std::size_t>(e.numel()));
  if (e.split == TensorParallelSplit::kRows) {
    std::int64_t part_start = 0;
    for (std::int64_t part : e.global_parts) {
      const std::int64_t share = part / tp_size, first = part_start + tp_rank * share;
      out.insert(out.end(), global.begin() + first * gcols, global.begin() + (first + share) * gcols);
      part_start += part;
    }
  } else {
    for (std::int64_t r = 0; r < grows; ++r) {
      std::int64_t part_start = 0;
      for (std::int64_t part : e.global_parts) {
        const std::int64_t share = part / tp_size, first = part_start + tp_rank * share;
        out.insert(out.end(), global.begin() + r * gcols + first, global.begin() + r * gcols + first + share);
        part_start += part;
      }
    }
  }
  if (static_cast<std::int64_t>(out.size()) != e.numel())
    throw std::logic_error("tensor_parallel_slice: " + e.name + " slice does not match its shard shape");
  return out;
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
