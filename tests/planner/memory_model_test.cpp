// Memory model against Megatron's formulas (megatron.md §5): bytes per parameter with and without the
// distributed optimizer, per-layer activations under TP / SP / recomputation, and in-flight microbatches.
#include "planner/memory_model.h"

#include <gtest/gtest.h>

namespace megatune::planner {
namespace {

using layouts::ModelSpec;
using layouts::ParallelConfig;
using layouts::RecomputeGranularity;

ParallelConfig make_config(int world, int tp, int pp, int gbs, bool sp = false) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  c.global_batch_size = gbs;
  c.micro_batch_size = 1;
  c.sequence_parallel = sp;
  return c;
}

// GPT-3 175B: h 12288, a 96, s 2048, F = 4h, LayerNorm, GELU, dropout: Korthikanti et al.'s setting.
class Activations : public ::testing::Test {
 protected:
  ModelSpec model = layouts::model_preset("gpt3-175b");
  const std::int64_t s = 2048, b = 1, h = 12288, a = 96;
  std::int64_t per_layer(const ParallelConfig& config, bool flash) {
    MemoryOptions options;
    options.flash_attention = flash;
    return layer_activation_bytes(model, layouts::resolve_rank_shape(model, config), false, options);
  }
};

TEST_F(Activations, TensorParallelWithoutSequenceParallel) {
  ParallelConfig c = make_config(8, 8, 1, 1);
  const std::int64_t t = 8;
  c.recompute_granularity = RecomputeGranularity::kNone;
  // sbh(10 + 24/t + 5as/(ht)) without flash attention.
  EXPECT_EQ(per_layer(c, false), s * b * h * 10 + s * b * h * 24 / t + 5 * a * s * s * b / t);
  c.recompute_granularity = RecomputeGranularity::kSelective;
  EXPECT_EQ(per_layer(c, false), s * b * h * 10 + s * b * h * 24 / t);
}

TEST_F(Activations, SequenceParallelAndRecomputation) {
  ParallelConfig c = make_config(8, 8, 1, 1, /*sp=*/true);
  const std::int64_t t = 8;
  c.recompute_granularity = RecomputeGranularity::kSelective;
  EXPECT_EQ(per_layer(c, false), 34 * s * b * h / t);  // TP+SP + selective
  c.recompute_granularity = RecomputeGranularity::kNone;
  EXPECT_EQ(per_layer(c, false), 34 * s * b * h / t + 5 * a * s * s * b / t);  // sbh/t (34 + 5as/h)
  c.recompute_granularity = RecomputeGranularity::kFull;
  c.recompute_method = layouts::RecomputeMethod::kUniform;
  c.recompute_num_layers = 1;
  EXPECT_EQ(per_layer(c, false), 2 * s * b * h / t);  // only the layer input, sharded by SP
  c.sequence_parallel = false;
  EXPECT_EQ(per_layer(c, false), 2 * s * b * h);
}

TEST_F(Activations, FlashAttentionKeepsOnlyTheLogSumExp) {
  ParallelConfig c = make_config(8, 8, 1, 1, /*sp=*/true);
  EXPECT_EQ(per_layer(c, true), 34 * s * b * h / 8 + 4 * s * b * a / 8);
}

TEST(MemoryModel, BytesPerParameterFollowMegatronsTable) {
  ModelSpec model = layouts::model_preset("llama3-8b");
  ParallelConfig c = make_config(8, 1, 1, 8);
  c.validate(model);
  MemoryEstimate plain = estimate_memory(model, c, 0);
  const std::int64_t params = model.parameter_counts(1).total;
  EXPECT_EQ(plain.parameters, params);
  EXPECT_EQ(plain.weight_bytes + plain.gradient_bytes + plain.optimizer_bytes, 18 * params);  // bf16 / fp32
  c.use_distributed_optimizer = true;
  MemoryEstimate dist = estimate_memory(model, c, 0);
  const std::int64_t d = 8;
  EXPECT_EQ(dist.weight_bytes + dist.gradient_bytes + dist.optimizer_bytes,
            6 * params + 12 * ((params + d - 1) / d));
  EXPECT_LT(dist.total_bytes, plain.total_bytes);
  EXPECT_NE(dist.itemize().find("optimizer state"), std::string::npos);
  EXPECT_NE(dist.itemize().find("total"), std::string::npos);
}

TEST(MemoryModel, InFlightMicrobatchesFollowTheWarmup) {
  ParallelConfig c = make_config(4, 1, 4, 16);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_flight_microbatches_per_chunk(c, 1, r), std::vector<int>{4 - r});
  ParallelConfig few = make_config(4, 1, 4, 2);
  EXPECT_EQ(in_flight_microbatches_per_chunk(few, 1, 0), std::vector<int>{2});  // min(p - r, m)
  // Interleaved, p = 4, v = 2, m = 8, g = 4: rank 0 runs 2(p-1) + (v-1)g = 10 warm-up forwards: the first
  // 11 entries of the table are 4 x chunk 0, 4 x chunk 1, then 3 more of chunk 0.
  EXPECT_EQ(in_flight_microbatches_per_chunk(make_config(4, 1, 4, 8), 2, 0), (std::vector<int>{7, 4}));
}

TEST(MemoryModel, FirstStageHoldsActivationsOfEveryLayerAsMegatronEstimates) {
  // Megatron: first stage with p microbatches in flight x L/p layers = all L layers' activations.
  ModelSpec model = layouts::model_preset("gpt3-175b");
  ParallelConfig c = make_config(64, 8, 8, 64, /*sp=*/true);
  c.recompute_granularity = RecomputeGranularity::kSelective;
  c.validate(model);
  MemoryOptions options;
  options.flash_attention = false;
  MemoryEstimate e = estimate_memory(model, c, 0, options);
  const std::int64_t s = 2048, h = 12288, t = 8, p = 8, L = 96;
  const std::int64_t per_layer = 34 * s * h / t;
  const std::int64_t embedding = p * (8 * s + s * h / t);  // token ids + embedding dropout per microbatch
  EXPECT_EQ(e.activation_bytes, L * per_layer + embedding);
}

}  // namespace
}  // namespace megatune::planner

namespace megatune::planner {
namespace {

// Partial full recomputation, Megatron's model per chunk: a uniform unit saves its input once, a kept layer
// (block's after the first N) all it saves without recomputation, and the re-run of the largest unit is the
// working set (llama3-8b, tp1 pp1, one microbatch in flight: 32 layers).
TEST(PartialRecomputation, UnitsSaveTheirInputOnceAndKeptLayersEverything) {
  const ModelSpec model = layouts::model_preset("llama3-8b");
  ParallelConfig c = make_config(1, 1, 1, 1);
  const auto estimate = [&](layouts::RecomputeGranularity g, layouts::RecomputeMethod m, int n) {
    ParallelConfig x = c;
    x.recompute_granularity = g;
    x.recompute_method = m;
    x.recompute_num_layers = n;
    x.validate(model);
    return estimate_memory(model, x, 0);
  };
  using layouts::RecomputeMethod;
  const RecomputeGranularity kFull = RecomputeGranularity::kFull;
  const MemoryEstimate none = estimate(RecomputeGranularity::kNone, RecomputeMethod::kNone, 0);
  const MemoryEstimate u1 = estimate(kFull, RecomputeMethod::kUniform, 1);
  const MemoryEstimate u2 = estimate(kFull, RecomputeMethod::kUniform, 2);
  const MemoryEstimate b8 = estimate(kFull, RecomputeMethod::kBlock, 8);
  const MemoryEstimate b32 = estimate(kFull, RecomputeMethod::kBlock, 32);
  const layouts::RankShape shape = layouts::resolve_rank_shape(model, c);
  const std::int64_t input = 2 * shape.tokens * shape.hidden;
  const std::int64_t full = layer_activation_bytes(model, shape, false, {});  // a kept layer
  const std::int64_t rest = none.activation_bytes - 32 * full;                // embedding, loss
  EXPECT_EQ(u1.activation_bytes, rest + 32 * input);
  EXPECT_EQ(u2.activation_bytes, rest + 16 * input);
  EXPECT_EQ(b8.activation_bytes, rest + 8 * input + 24 * full);
  EXPECT_EQ(b32.activation_bytes, u1.activation_bytes);
  // The working set: one recomputed layer, or a unit of two.
  EXPECT_EQ(u2.transient_bytes - u1.transient_bytes, full);
  EXPECT_EQ(b8.transient_bytes, u1.transient_bytes);
  EXPECT_EQ(none.transient_bytes + full, u1.transient_bytes);
  EXPECT_LT(u1.total_bytes, b8.total_bytes);
  EXPECT_LT(b8.total_bytes, none.total_bytes);
}

}  // namespace
}  // namespace megatune::planner
