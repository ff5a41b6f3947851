// A stage's parameter table (forward order: dense, MoE, MLA and MTP layers) and the global shapes of its TP
// splits.
#include "layouts/parameter_table.h"

#include "layouts/pipeline_layout.h"
#include "layouts/rank_shape.h"

namespace megatune::layouts {

StageContents contents_of(const PipelineStage& stage) {
  StageContents contents;
  contents.first_layer = stage.first_decoder_layer;
  contents.num_layers = stage.num_decoder_layers;
  contents.has_embedding = stage.has_embedding;
  contents.has_loss = stage.has_loss;
  contents.first_mtp_layer = stage.first_mtp_layer;
  contents.num_mtp_layers = stage.num_mtp_layers;
  return contents;
}

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

std::string layer_name(int layer, const char* suffix) {
  return "decoder.layers." + std::to_string(layer) + "." + suffix;
}

}  // namespace

std::int64_t ParameterSpec::global_rows() const {
  return split == TensorParallelSplit::kRows ? parts_sum(global_parts) : rows;
}
std::int64_t ParameterSpec::global_cols() const {
  return split == TensorParallelSplit::kColumns ? parts_sum(global_parts) : cols;
}

namespace {

class StageTable {
  using Split = TensorParallelSplit;

 public:
  StageTable(const RankShape& c, std::vector<ParameterSpec>& out) : c_(c), t_(out) {}

  ParameterSpec& add(std::string name, int layer, std::int64_t rows, std::int64_t cols, ParameterInit init,
                     TensorParallelSplit split = TensorParallelSplit::kReplicated,
                     std::vector<std::int64_t> parts = {}) {
    return t_.add(std::move(name), layer, rows, cols, init, split, std::move(parts));
  }

  void norm(const std::string& prefix, int layer, std::int64_t width) {
    t_.add(prefix + ".weight", layer, 1, width, ParameterInit::kOnes).sequence_parallel_grad = c_.sp;
    if (!c_.rms)
      t_.add(prefix + ".bias", layer, 1, width, ParameterInit::kZeros).sequence_parallel_grad = c_.sp;
  }
  void norm(const std::string& prefix, int layer) { norm(prefix, layer, c_.hidden); }
  // A qk head norm (--qk-layernorm): over head_dim, shared by the heads; each TP rank normalizes its own
  // heads, so its gradient is summed over TP with or without SP.
  void head_norm(const std::string& prefix, int layer) {
    const bool reduced = c_.tp > 1;
    t_.add(prefix + ".weight", layer, 1, c_.head_dim, ParameterInit::kOnes).sequence_parallel_grad = reduced;
    if (!c_.rms)
      t_.add(prefix + ".bias", layer, 1, c_.head_dim, ParameterInit::kZeros).sequence_parallel_grad = reduced;
  }

  // A GEMM weight (out rows on this rank, in columns).
  ParameterSpec& gemm(std::string name, int layer, std::int64_t rows, std::int64_t cols,
                      ParameterInit init = ParameterInit::kNormal, Split split = Split::kReplicated,
                      std::vector<std::int64_t> parts = {}) {
    ParameterSpec& p = t_.add(std::move(name), layer, rows, cols, init, split, std::move(parts));
    p.gemm_weight = true;
    return p;
  }

  // One transformer layer; `prefix` ends with '.' ("decoder.layers.3.").
  void layer(const std::string& prefix, int layer) {
    const std::int64_t h = c_.hidden, d = c_.head_dim, ffn = c_.ffn;
    norm(prefix + "input_layernorm", layer);
    if (c_.mla) {
      mla_attention(prefix + "self_attention.", layer);
    } else {
      const std::vector<std::int64_t> qkv_parts = {c_.heads * d, c_.groups * d, c_.groups * d};
      const std::int64_t qkv_rows = c_.qkv_width();
      gemm(prefix + "self_attention.linear_qkv.weight", layer, qkv_rows, h, ParameterInit::kNormal,
           Split::kRows, qkv_parts);
      if (c_.bias)
        t_.add(prefix + "self_attention.linear_qkv.bias", layer, 1, qkv_rows, ParameterInit::kZeros,
               Split::kColumns, qkv_parts);
      if (c_.qk_norm) {
        head_norm(prefix + "self_attention.q_layernorm", layer);
        head_norm(prefix + "self_attention.k_layernorm", layer);
      }
    }
    const std::int64_t proj_in = c_.heads * (c_.mla ? c_.v_head_dim : d);
    gemm(prefix + "self_attention.linear_proj.weight", layer, h, c_.attention_width(),
         ParameterInit::kScaledNormal, Split::kColumns, {proj_in});
    if (c_.bias) t_.add(prefix + "self_attention.linear_proj.bias", layer, 1, h, ParameterInit::kZeros);
    norm(prefix + "pre_mlp_layernorm", layer);
    if (c_.is_moe_layer(layer) || (layer <= -3 && c_.is_moe_mtp_layer())) {
      moe_mlp(prefix + "mlp.", layer);
      return;
    }
    const std::vector<std::int64_t> fc1_parts =
        c_.swiglu ? std::vector<std::int64_t>{ffn, ffn} : std::vector<std::int64_t>{ffn};
    const std::int64_t fc1_rows = c_.fc1_width();
    gemm(prefix + "mlp.linear_fc1.weight", layer, fc1_rows, h, ParameterInit::kNormal, Split::kRows,
         fc1_parts);
    if (c_.bias)
      t_.add(prefix + "mlp.linear_fc1.bias", layer, 1, fc1_rows, ParameterInit::kZeros, Split::kColumns,
             fc1_parts);
    gemm(prefix + "mlp.linear_fc2.weight", layer, h, c_.ffn_per_rank(), ParameterInit::kScaledNormal,
         Split::kColumns, {ffn});
    if (c_.bias) t_.add(prefix + "mlp.linear_fc2.bias", layer, 1, h, ParameterInit::kZeros);
  }

  // An MoE layer's MLP after its pre-MLP norm (Megatron's names: mlp.router, the SequentialMLP experts by
  // global index, mlp.shared_experts). Routed experts live on their expert-parallel rank, fc1 column- and
  // fc2 row-parallel over the expert-tensor-parallel group (Megatron's expert TP); the shared expert is
  // split over TP like the dense MLP.
  void moe_mlp(const std::string& prefix, int layer) {
    const std::int64_t h = c_.hidden, glu = c_.glu_factor(), ffn = c_.moe_ffn_per_rank();
    // Replicated over TP and run on the sequence shard: its gradient is all-reduced over TP under SP.
    gemm(prefix + "router.weight", layer, c_.experts, h).sequence_parallel_grad = c_.sp;
    const std::int64_t local = c_.local_experts();
    for (std::int64_t e = c_.ep_rank * local; e < (c_.ep_rank + 1) * local; ++e) {
      const std::string expert = prefix + "experts.local_experts." + std::to_string(e) + ".";
      gemm(expert + "linear_fc1.weight", layer, glu * ffn, h, ParameterInit::kNormal, Split::kRows,
           ffn_parts(c_.moe_ffn))
          .expert = static_cast<int>(e);
      gemm(expert + "linear_fc2.weight", layer, h, ffn, ParameterInit::kScaledNormal, Split::kColumns,
           {c_.moe_ffn})
          .expert = static_cast<int>(e);
    }
    if (c_.shared_ffn == 0) return;
    gemm(prefix + "shared_experts.linear_fc1.weight", layer, glu * c_.shared_ffn_per_rank(), h,
         ParameterInit::kNormal, Split::kRows, ffn_parts(c_.shared_ffn));
    gemm(prefix + "shared_experts.linear_fc2.weight", layer, h, c_.shared_ffn_per_rank(),
         ParameterInit::kScaledNormal, Split::kColumns, {c_.shared_ffn});
  }

  // An MLP fc1's parts along its rows: [gate | up] under SwiGLU, else one.
  std::vector<std::int64_t> ffn_parts(std::int64_t ffn) const {
    return c_.swiglu ? std::vector<std::int64_t>{ffn, ffn} : std::vector<std::int64_t>{ffn};
  }

  // Megatron's MLA projections (no biases): the down-projections are replicated over TP (their gradients,
  // like the latent norms', computed on sequence shards under SP, are all-reduced over TP), the
  // up-projections column-parallel over heads.
  void mla_attention(const std::string& prefix, int layer) {
    const std::int64_t h = c_.hidden, n = c_.heads, n_rank = c_.heads_per_rank();
    const std::vector<std::int64_t> q_parts = {n * c_.qk_head_dim, n * c_.qk_pos_emb_head_dim};
    const std::int64_t q_rows = n_rank * (c_.qk_head_dim + c_.qk_pos_emb_head_dim);
    if (c_.q_lora_rank > 0) {
      gemm(prefix + "linear_q_down_proj.weight", layer, c_.q_lora_rank, h).sequence_parallel_grad = c_.sp;
      norm(prefix + "q_layernorm", layer, c_.q_lora_rank);
      gemm(prefix + "linear_q_up_proj.weight", layer, q_rows, c_.q_lora_rank, ParameterInit::kNormal,
           Split::kRows, q_parts);
    } else {
      gemm(prefix + "linear_q_proj.weight", layer, q_rows, h, ParameterInit::kNormal, Split::kRows, q_parts);
    }
    gemm(prefix + "linear_kv_down_proj.weight", layer, c_.kv_lora_rank + c_.qk_pos_emb_head_dim, h)
        .sequence_parallel_grad = c_.sp;
    norm(prefix + "kv_layernorm", layer, c_.kv_lora_rank);
    gemm(prefix + "linear_kv_up_proj.weight", layer, n_rank * (c_.qk_head_dim + c_.v_head_dim),
         c_.kv_lora_rank, ParameterInit::kNormal, Split::kRows, {n * c_.qk_head_dim, n * c_.v_head_dim});
  }

  // MTP layer k: enorm, hnorm, eh_proj ([embedding | hidden] 2h -> h, column-parallel, no bias), the
  // transformer layer, the final norm.
  void mtp_layer(int k) {
    const int layer = -3 - k;
    norm(mtp_parameter(k, "enorm"), layer);
    norm(mtp_parameter(k, "hnorm"), layer);
    gemm(mtp_parameter(k, "eh_proj.weight"), layer, c_.hidden / c_.tp, 2 * c_.hidden, ParameterInit::kNormal,
         Split::kRows, {c_.hidden});
    this->layer(mtp_parameter(k, "transformer_layer."), layer);
    norm(mtp_parameter(k, "final_layernorm"), layer);
  }

 private:
  const RankShape& c_;
  TableBuilder t_;
};

}  // namespace

std::string mtp_parameter(int mtp_layer, const std::string& suffix) {
  return "mtp.layers." + std::to_string(mtp_layer) + "." + suffix;
}

std::vector<ParameterSpec> stage_parameter_table(const RankShape& c, const StageContents& stage) {
  using Split = TensorParallelSplit;
  std::vector<ParameterSpec> out;
  StageTable t(c, out);
  const std::int64_t h = c.hidden, vocab = c.vocab_padded;
  auto embedding = [&](int layer) {
    t.add("embedding.word_embeddings.weight", layer, c.vocab_per_rank(), h, ParameterInit::kNormal,
          Split::kRows, {vocab});
    if (!c.rope)
      t.add("embedding.position_embeddings.weight", layer, c.max_positions, h, ParameterInit::kNormal);
  };
  if (stage.has_embedding) embedding(-1);
  const int layers = stage.num_layers < 0 ? c.num_layers - stage.first_layer : stage.num_layers;
  for (int l = stage.first_layer; l < stage.first_layer + layers; ++l) t.layer(layer_name(l, ""), l);
  const bool holds_last_layer = layers > 0 && stage.first_layer + layers == c.num_layers;
  if (c.final_norm_with_last_layer() && holds_last_layer) t.norm("decoder.final_layernorm", c.num_layers - 1);
  if (stage.num_mtp_layers > 0 && !stage.has_embedding) {
    embedding(-3 - stage.first_mtp_layer);
    // A tied head reads this copy.
    if (c.tied) out[out.size() - (!c.rope ? 2 : 1)].gemm_weight = true;
  }
  for (int k = stage.first_mtp_layer; k < stage.first_mtp_layer + stage.num_mtp_layers; ++k) t.mtp_layer(k);
  if (stage.has_loss) {
    if (!c.final_norm_with_last_layer()) t.norm("decoder.final_layernorm", -2);
    // Untied: the output layer. Tied on a stage without the embedding (pp > 1): the last stage's own copy of
    // the word embedding (same name and initial values; its gradient is all-reduced with the first stage's),
    // unless the stage's MTP layers brought one.
    if (!c.tied)
      t.gemm("output_layer.weight", -2, c.vocab_per_rank(), h, ParameterInit::kNormal, Split::kRows, {vocab});
    else if (!stage.has_embedding && stage.num_mtp_layers == 0)
      t.gemm("embedding.word_embeddings.weight", -2, c.vocab_per_rank(), h, ParameterInit::kNormal,
             Split::kRows, {vocab});
    else if (stage.has_embedding)
      out.front().gemm_weight = true;  // the tied head is the embedding table
  }
  return out;
}

}  // namespace megatune::layouts
