// Tests of the parameter table: MLA and MTP parameters (names, TP splits, counts against ModelSpec's),
// --qk-layernorm's head norms, and the step program's sequence-parallel gradient all-reduce sized from the
// table.
#include "layouts/parameter_table.h"

#include <gtest/gtest.h>

#include <string>

#include "layouts/model_spec.h"
#include "layouts/step_program.h"

namespace megatune::layouts {
namespace {

// The tiny-deepseek-v3-mla preset (MLA, qk 24 + 8, v 16) with 2 layers, one MTP layer and the given query
// compression.
ModelSpec tiny_mla(int q_lora_rank) {
  ModelSpec m = model_preset("tiny-deepseek-v3-mla");
  m.num_layers = 2;
  m.q_lora_rank = q_lora_rank;
  m.mtp_num_layers = 1;
  m.validate();
  return m;
}

ParallelConfig tp_config(int tp, bool sp) {
  ParallelConfig c;
  c.world_size = tp;
  c.tensor_model_parallel_size = tp;
  c.sequence_parallel = sp;
  c.micro_batch_size = 1;
  c.global_batch_size = 1;
  return c;
}

RankShape shape_of(const ModelSpec& m, int tp, bool sp) { return resolve_rank_shape(m, tp_config(tp, sp)); }

std::int64_t total(const std::vector<ParameterSpec>& table) {
  std::int64_t n = 0;
  for (const ParameterSpec& p : table) n += p.numel();
  return n;
}

const ParameterSpec& find(const std::vector<ParameterSpec>& table, const std::string& name) {
  for (const ParameterSpec& p : table)
    if (p.name == name) return p;
  ADD_FAILURE() << "no parameter " << name;
  return table.front();
}

StageContents one_layer(int layer) {
  StageContents c;
  c.first_layer = layer;
  c.num_layers = 1;
  c.has_embedding = false;
  c.has_loss = false;
  return c;
}

TEST(ParameterTable, MlaLayerCountsMatchTheModelSpecAtEveryTpSize) {
  for (int q_lora : {0, 16}) {
    for (int tp : {1, 2, 4}) {
      const ModelSpec m = tiny_mla(q_lora);
      const auto table = stage_parameter_table(shape_of(m, tp, false), one_layer(0));
      EXPECT_EQ(total(table), attention_parameters(m, tp) + decoder_mlp_parameters(m, false, tp))
          << "q_lora_rank " << q_lora << " tp " << tp;
      // With MTP the last decoder layer brings the final norm (Megatron's placement).
      const auto last = stage_parameter_table(shape_of(m, tp, false), one_layer(1));
      EXPECT_EQ(total(last), total(table) + m.hidden_size);
      EXPECT_EQ(find(last, "decoder.final_layernorm.weight").layer, 1);
    }
  }
}

TEST(ParameterTable, MlaSplitsFollowMegatronsTpPlan) {
  const ModelSpec m = tiny_mla(16);
  const auto table = stage_parameter_table(shape_of(m, 2, true), one_layer(0));
  const std::string a = "decoder.layers.0.self_attention.";
  const ParameterSpec& q_down = find(table, a + "linear_q_down_proj.weight");
  EXPECT_EQ(q_down.split, TensorParallelSplit::kReplicated);
  EXPECT_EQ(q_down.rows, 16);
  EXPECT_EQ(q_down.cols, 64);
  EXPECT_TRUE(q_down.sequence_parallel_grad);  // computed on sequence shards under SP
  const ParameterSpec& q_up = find(table, a + "linear_q_up_proj.weight");
  EXPECT_EQ(q_up.split, TensorParallelSplit::kRows);
  EXPECT_EQ(q_up.rows, 4 * (24 + 8) / 2);
  EXPECT_EQ(q_up.global_parts, (std::vector<std::int64_t>{4 * 24, 4 * 8}));
  const ParameterSpec& kv_down = find(table, a + "linear_kv_down_proj.weight");
  EXPECT_EQ(kv_down.split, TensorParallelSplit::kReplicated);
  EXPECT_EQ(kv_down.rows, 32 + 8);  // latent | shared rotary key
  EXPECT_TRUE(kv_down.sequence_parallel_grad);
  EXPECT_TRUE(kv_down.gemm_weight);
  const ParameterSpec& kv_norm = find(table, a + "kv_layernorm.weight");
  EXPECT_EQ(kv_norm.cols, 32);
  EXPECT_TRUE(kv_norm.sequence_parallel_grad);
  const ParameterSpec& kv_up = find(table, a + "linear_kv_up_proj.weight");
  EXPECT_EQ(kv_up.global_parts, (std::vector<std::int64_t>{4 * 24, 4 * 16}));
  EXPECT_EQ(kv_up.global_rows(), 4 * (24 + 16));
  const ParameterSpec& proj = find(table, a + "linear_proj.weight");
  EXPECT_EQ(proj.split, TensorParallelSplit::kColumns);
  EXPECT_EQ(proj.cols, 4 * 16 / 2);  // heads * v_head_dim / tp
  for (const ParameterSpec& p : table) EXPECT_EQ(p.name.find("linear_qkv"), std::string::npos) << p.name;
}

TEST(ParameterTable, MtpLayerHoldsItsNormsProjectionAndTransformerLayer) {
  const ModelSpec m = tiny_mla(0);
  for (int tp : {1, 2}) {
    StageContents c = one_layer(0);
    c.num_layers = 0;
    c.first_mtp_layer = 0;
    c.num_mtp_layers = 1;
    const auto table = stage_parameter_table(shape_of(m, tp, false), c);
    // A stage without the embedding holds the MTP layers' own copy of it.
    const std::int64_t copy = m.padded_vocab_size(tp) / tp * m.hidden_size;
    EXPECT_EQ(total(table), copy + mtp_extra_parameters(m, tp) + attention_parameters(m, tp) +
                                decoder_mlp_parameters(m, false, tp));
    EXPECT_EQ(find(table, "embedding.word_embeddings.weight").layer, -3);
    const ParameterSpec& eh = find(table, "mtp.layers.0.eh_proj.weight");
    EXPECT_EQ(eh.rows, 64 / tp);
    EXPECT_EQ(eh.cols, 2 * 64);
    EXPECT_EQ(eh.split, TensorParallelSplit::kRows);
    EXPECT_EQ(eh.layer, -3);
    EXPECT_EQ(find(table, "mtp.layers.0.transformer_layer.self_attention.linear_kv_down_proj.weight").rows,
              32 + 8);
    EXPECT_EQ(find(table, "mtp.layers.0.final_layernorm.weight").cols, 64);
    EXPECT_EQ(find(table, "mtp.layers.0.enorm.weight").layer, -3);
  }
}

TEST(ParameterTable, StepProgramSequenceParallelAllReduceCoversTheTablesMarkedParameters) {
  const ModelSpec m = tiny_mla(16);
  const ParallelConfig config = tp_config(2, true);
  config.validate(m);
  const StepProgram program = build_step_program(m, config, 0);
  const auto table = stage_parameter_table(shape_of(m, 2, true), StageContents{0, -1, true, true, 0, 1});
  std::int64_t marked = 0;
  for (const ParameterSpec& p : table)
    if (p.sequence_parallel_grad) marked += p.numel();
  // Per layer: two norms of h, the q and kv latent norms, both down-projections.
  const std::int64_t per_layer = 2 * 64 + 16 + 32 + 16 * 64 + (32 + 8) * 64;
  EXPECT_EQ(marked, 3 * per_layer + 2 * 64 /* MTP enorm, hnorm */ + 64 /* MTP final norm */ + 64 /* final */);
  int found = 0;
  for (const Op& op : program.ops) {
    if (op.label != "sp_norm_grad_ar") continue;
    ++found;
    EXPECT_EQ(op.bytes, marked * 4);
  }
  EXPECT_EQ(found, 1);
}

// --qk-layernorm: a q and a k norm of head_dim per layer (weights, + biases under LayerNorm), replicated over
// TP and counted by ModelSpec; the step program normalizes the rank's heads after qkv and before RoPE, and
// sums the norms' gradients over TP with or without SP (each rank holds other heads); MLA's latent norms
// are not head norms.
TEST(ParameterTable, QkLayernormHeadNormsAreCountedNormalizedAndReducedOverTp) {
  ModelSpec m = model_preset("tiny");  // 2 layers, h 64, 4 heads of 16, 2 query groups, RMSNorm, RoPE
  m.qk_layernorm = true;
  for (int tp : {1, 2}) {
    const auto table = stage_parameter_table(shape_of(m, tp, false), one_layer(0));
    EXPECT_EQ(total(table), attention_parameters(m, tp) + decoder_mlp_parameters(m, false, tp)) << tp;
    for (const char* name : {"decoder.layers.0.self_attention.q_layernorm.weight",
                             "decoder.layers.0.self_attention.k_layernorm.weight"}) {
      const ParameterSpec& p = find(table, name);
      EXPECT_EQ(p.cols, 16);
      EXPECT_EQ(p.split, TensorParallelSplit::kReplicated);
      EXPECT_EQ(p.sequence_parallel_grad, tp > 1) << name;
    }
  }
  ModelSpec plain = m;
  plain.qk_layernorm = false;
  EXPECT_EQ(m.total_parameters() - plain.total_parameters(), 2 * 2 * 16);
  ModelSpec layernorm = m;
  layernorm.normalization = Normalization::kLayerNorm;
  EXPECT_EQ(find(stage_parameter_table(shape_of(layernorm, 1, false), one_layer(1)),
                 "decoder.layers.1.self_attention.k_layernorm.bias")
                .init,
            ParameterInit::kZeros);
  const ParallelConfig config = tp_config(2, false);
  config.validate(m);
  const StepProgram program = build_step_program(m, config, 0);
  std::vector<std::string> attention;
  int reduced = 0;
  for (const Op& op : program.ops) {
    if (op.layer == 0 && op.phase == OpPhase::kForward &&
        (op.label == "qkv" || op.label == "q_norm" || op.label == "k_norm" || op.label == "rope"))
      attention.push_back(op.label);
    if (op.label == "q_norm" && op.phase == OpPhase::kForward && op.layer == 0 && op.microbatch == 0) {
      EXPECT_EQ(op.kind, OpKind::kNorm);
      EXPECT_EQ(op.bytes, 2 * 32 * 2 * 16 * 2);  // read + write, 32 tokens x 2 heads x 16, bf16
    }
    if (op.label == "sp_norm_grad_ar") {
      ++reduced;
      EXPECT_EQ(op.bytes, 2 * 2 * 16 * 4);  // 2 layers x (q + k) x 16, fp32
    }
  }
  ASSERT_GE(attention.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(attention.begin(), attention.begin() + 4),
            (std::vector<std::string>{"qkv", "q_norm", "k_norm", "rope"}));
  EXPECT_EQ(reduced, 1);
  ModelSpec mla = tiny_mla(16);
  mla.qk_layernorm = true;
  for (const ParameterSpec& p : stage_parameter_table(shape_of(mla, 1, false), one_layer(0)))
    EXPECT_EQ(p.name.find("k_layernorm"), std::string::npos) << p.name;
}

}  // namespace
}  // namespace megatune::layouts
