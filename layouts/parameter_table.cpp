// A stage's parameter table (forward order: dense and MoE layers) and the global shapes of its TP splits.
#include "layouts/parameter_table.h"

namespace megatune::layouts {
namespace {

std::int64_t parts_sum(const std::vector<std::int64_t>& parts) {
  std::int64_t n = 0;
  for (std::int64_t p : parts) n += p;
  return n;
}

class TableBuilder {
 public:
  explicit TableBuilder(std::vector<ParameterSpec>& out) : out_(out) {}
  ParameterSpec& add(std::string name, int layer, std::int64_t rows, std::int64_t cols, ParameterInit init,
                     TensorParallelSplit split = TensorParallelSplit::kReplicated,
                     std::vector<std::int64_t> parts = {}) {
    ParameterSpec p;
    p.name = std::move(name);
    p.layer = layer;
    p.rows = rows;
    p.cols = cols;
    p.init = init;
    p.weight_decay = rows > 1;
    p.split = split;
    p.global_parts = parts.empty()
                         ? std::vector<std::int64_t>{split == TensorParallelSplit::kColumns ? cols : rows}
                         : std::move(parts);
    out_.push_back(std::move(p));
    return out_.back();
  }

 private:
  std::vector<ParameterSpec>& out_;
};

std::string layer_name(int layer, const std::string& suffix) {
  return "decoder.layers." + std::to_string(layer) + "." + suffix;
}

// An MoE layer's MLP after its pre-MLP norm (Megatron's names: mlp.router, the SequentialMLP experts by
// global index, mlp.shared_experts). Routed experts are whole on their expert-parallel rank (expert tensor
// parallelism 1); the shared expert is split over TP like the dense MLP.
void add_moe_mlp(TableBuilder& t, const DenseParameterShape& c, int l) {
  using Split = TensorParallelSplit;
  const std::int64_t h = c.hidden, glu = c.swiglu ? 2 : 1;
  t.add(layer_name(l, "mlp.router.weight"), l, c.num_experts, h, ParameterInit::kNormal).gemm_weight = true;
  const std::int64_t local = c.num_experts / c.ep;
  for (std::int64_t e = c.ep_rank * local; e < (c.ep_rank + 1) * local; ++e) {
    const std::string prefix = "mlp.experts.local_experts." + std::to_string(e) + ".";
    auto expert_weight = [e](ParameterSpec& p) {
      p.expert = static_cast<int>(e);
      p.gemm_weight = true;
    };
    expert_weight(
        t.add(layer_name(l, prefix + "linear_fc1.weight"), l, glu * c.moe_ffn, h, ParameterInit::kNormal));
    expert_weight(
        t.add(layer_name(l, prefix + "linear_fc2.weight"), l, h, c.moe_ffn, ParameterInit::kScaledNormal));
  }
  if (c.shared_ffn == 0) return;
  const std::vector<std::int64_t> parts = c.swiglu ? std::vector<std::int64_t>{c.shared_ffn, c.shared_ffn}
                                                   : std::vector<std::int64_t>{c.shared_ffn};
  t.add(layer_name(l, "mlp.shared_experts.linear_fc1.weight"), l, glu * c.shared_ffn / c.tp, h,
        ParameterInit::kNormal, Split::kRows, parts)
      .gemm_weight = true;
  t.add(layer_name(l, "mlp.shared_experts.linear_fc2.weight"), l, h, c.shared_ffn / c.tp,
        ParameterInit::kScaledNormal, Split::kColumns, {c.shared_ffn})
      .gemm_weight = true;
}

}  // namespace

std::int64_t ParameterSpec::global_rows() const {
  return split == TensorParallelSplit::kRows ? parts_sum(global_parts) : rows;
}
std::int64_t ParameterSpec::global_cols() const {
  return split == TensorParallelSplit::kColumns ? parts_sum(global_parts) : cols;
}

std::vector<ParameterSpec> stage_parameter_table(const DenseParameterShape& c, const StageContents& stage) {
  using Split = TensorParallelSplit;
  std::vector<ParameterSpec> out;
  TableBuilder t(out);
  const std::int64_t h = c.hidden, tp = c.tp, d = c.head_dim, ffn = c.ffn, vocab = c.vocab_padded;
  const std::vector<std::int64_t> qkv_parts = {c.heads * d, c.groups * d, c.groups * d};
  const std::int64_t qkv_rows = (c.heads + 2 * c.groups) * d / tp;
  const std::vector<std::int64_t> fc1_parts =
      c.swiglu ? std::vector<std::int64_t>{ffn, ffn} : std::vector<std::int64_t>{ffn};
  const std::int64_t fc1_rows = (c.swiglu ? 2 : 1) * ffn / tp;
  auto norm = [&](const std::string& prefix, int layer) {
    t.add(prefix + ".weight", layer, 1, h, ParameterInit::kOnes).sequence_parallel_grad = c.sequence_parallel;
    if (c.layernorm)
      t.add(prefix + ".bias", layer, 1, h, ParameterInit::kZeros).sequence_parallel_grad =
          c.sequence_parallel;
  };
  auto gemm = [&](ParameterSpec& p) { p.gemm_weight = true; };
  if (stage.has_embedding) {
    t.add("embedding.word_embeddings.weight", -1, vocab / tp, h, ParameterInit::kNormal, Split::kRows,
          {vocab});
    if (c.learned_positions)
      t.add("embedding.position_embeddings.weight", -1, c.max_positions, h, ParameterInit::kNormal);
  }
  const int layers = stage.num_layers < 0 ? c.num_layers - stage.first_layer : stage.num_layers;
  for (int l = stage.first_layer; l < stage.first_layer + layers; ++l) {
    norm(layer_name(l, "input_layernorm"), l);
    gemm(t.add(layer_name(l, "self_attention.linear_qkv.weight"), l, qkv_rows, h, ParameterInit::kNormal,
               Split::kRows, qkv_parts));
    if (c.bias)
      t.add(layer_name(l, "self_attention.linear_qkv.bias"), l, 1, qkv_rows, ParameterInit::kZeros,
            Split::kColumns, qkv_parts);
    gemm(t.add(layer_name(l, "self_attention.linear_proj.weight"), l, h, c.heads * d / tp,
               ParameterInit::kScaledNormal, Split::kColumns, {c.heads * d}));
    if (c.bias) t.add(layer_name(l, "self_attention.linear_proj.bias"), l, 1, h, ParameterInit::kZeros);
    norm(layer_name(l, "pre_mlp_layernorm"), l);
    if (c.is_moe_layer(l)) {
      add_moe_mlp(t, c, l);
      continue;
    }
    gemm(t.add(layer_name(l, "mlp.linear_fc1.weight"), l, fc1_rows, h, ParameterInit::kNormal, Split::kRows,
               fc1_parts));
    if (c.bias)
      t.add(layer_name(l, "mlp.linear_fc1.bias"), l, 1, fc1_rows, ParameterInit::kZeros, Split::kColumns,
            fc1_parts);
    gemm(t.add(layer_name(l, "mlp.linear_fc2.weight"), l, h, ffn / tp, ParameterInit::kScaledNormal,
               Split::kColumns, {ffn}));
    if (c.bias) t.add(layer_name(l, "mlp.linear_fc2.bias"), l, 1, h, ParameterInit::kZeros);
  }
  if (stage.has_loss) {
    norm("decoder.final_layernorm", -2);
    // Untied: the output layer. Tied on a stage without the embedding (pp > 1): the last stage's own copy of
    // the word embedding (same name and initial values; its gradient is all-reduced with the first stage's).
    if (!c.tied)
      gemm(t.add("output_layer.weight", -2, vocab / tp, h, ParameterInit::kNormal, Split::kRows, {vocab}));
    else if (!stage.has_embedding)
      gemm(t.add("embedding.word_embeddings.weight", -2, vocab / tp, h, ParameterInit::kNormal, Split::kRows,
                 {vocab}));
    else
      out.front().gemm_weight = true;  // the tied head is the embedding table
  }
  return out;
}

}  // namespace megatune::layouts
