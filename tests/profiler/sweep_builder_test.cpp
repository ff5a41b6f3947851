// Sweep generation: the shapes a model issues under candidate layouts (from the step program), their
// executor variants, deduplication, the generic grid and the collective sizes.
#include "profiler/sweep_builder.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

namespace megatune::profiler {
namespace {

bool has_gemm(const Sweep& sweep, std::int64_t m, std::int64_t n, std::int64_t k, GemmVariant variant) {
  for (const GemmItem& item : sweep.gemms) {
    if (item.m == m && item.n == n && item.k == k) return item.variant == variant;
  }
  return false;
}

TEST(ModelSweep, Llama1bShapesUnderTensorParallelism) {
  const layouts::ModelSpec model = layouts::model_preset("llama3-1b");
  SweepCandidates candidates;
  candidates.tensor_parallel = {1, 2};
  candidates.context_parallel = {1};
  candidates.micro_batch = {1};
  ModelSweepReport report;
  const Sweep sweep = model_sweep(model, candidates, &report);
  EXPECT_EQ(report.layouts_expanded, 3);  // tp1, tp2, tp2+SP
  EXPECT_EQ(report.layouts_invalid, 0);
  const std::int64_t tokens = model.seq_length;
  const std::int64_t h = model.hidden_size;
  const std::int64_t qkv = (model.num_attention_heads + 2 * model.query_groups()) * model.head_dim();
  const std::int64_t ffn = model.ffn_size();
  // Forward qkv (column parallel: n split by tp), dgrad and wgrad of fc1 (SwiGLU: 2 * ffn columns).
  EXPECT_TRUE(has_gemm(sweep, tokens, qkv, h, GemmVariant::kForward));
  EXPECT_TRUE(has_gemm(sweep, tokens, qkv / 2, h, GemmVariant::kForward));
  EXPECT_TRUE(has_gemm(sweep, tokens, 2 * ffn, h, GemmVariant::kForward));
  EXPECT_TRUE(has_gemm(sweep, tokens, h, qkv, GemmVariant::kBackwardData));
  EXPECT_TRUE(has_gemm(sweep, 2 * ffn, h, tokens, GemmVariant::kBackwardWeight));
  // Attention: all heads at tp 1, half of them at tp 2.
  std::set<std::tuple<bool, std::int64_t, std::int64_t>> attention;
  for (const AttentionItem& item : sweep.attention) {
    EXPECT_EQ(item.shape.seq_q, tokens);
    EXPECT_EQ(item.shape.head_dim, model.head_dim());
    EXPECT_TRUE(item.shape.causal);
    attention.insert({item.backward, item.shape.heads, item.shape.kv_heads});
  }
  const std::int64_t heads = model.num_attention_heads, groups = model.query_groups();
  EXPECT_EQ(attention,
            (std::set<std::tuple<bool, std::int64_t, std::int64_t>>{{false, heads, groups},
                                                                    {true, heads, groups},
                                                                    {false, heads / 2, groups / 2},
                                                                    {true, heads / 2, groups / 2}}));
  // Memory-bound kinds of a Llama layer, with rows of the right width.
  std::set<layouts::OpKind> kinds;
  for (const MemoryBoundItem& item : sweep.memory_bound) {
    kinds.insert(item.kind);
    EXPECT_GT(item.bytes, 0);
    if (item.kind == layouts::OpKind::kNorm) {
      EXPECT_EQ(item.columns, h);
    }
    if (item.kind == layouts::OpKind::kActivation) {
      EXPECT_TRUE(item.swiglu);
    }
  }
  for (const layouts::OpKind kind :
       {layouts::OpKind::kNorm, layouts::OpKind::kNormBackward, layouts::OpKind::kRope,
        layouts::OpKind::kActivation, layouts::OpKind::kCrossEntropy, layouts::OpKind::kOptimizer}) {
    EXPECT_TRUE(kinds.count(kind)) << layouts::op_kind_name(kind);
  }
  // Deduplicated by database key.
  std::set<std::tuple<std::int64_t, std::int64_t, std::int64_t>> gemm_keys;
  for (const GemmItem& item : sweep.gemms) EXPECT_TRUE(gemm_keys.insert({item.m, item.n, item.k}).second);
  std::set<std::pair<layouts::OpKind, std::int64_t>> memory_keys;
  for (const MemoryBoundItem& item : sweep.memory_bound)
    EXPECT_TRUE(memory_keys.insert({item.kind, item.bytes}).second);
}

TEST(ModelSweep, MicroBatchScalesTokensAndInvalidLayoutsAreCounted) {
  const layouts::ModelSpec model = layouts::model_preset("llama3-1b");
  SweepCandidates candidates;
  candidates.tensor_parallel = {1, 3};  // 3 divides neither the heads nor the groups
  candidates.context_parallel = {1, 2};
  candidates.micro_batch = {1, 2};
  ModelSweepReport report;
  const Sweep sweep = model_sweep(model, candidates, &report);
  EXPECT_EQ(report.layouts_invalid, 8);  // every tp 3 combination, with and without SP
  EXPECT_EQ(report.layouts_expanded, 4);
  EXPECT_GT(report.cross_attention_skipped, 0);  // cp 2: queries of half the sequence over all keys
  const std::int64_t tokens = model.seq_length;
  const std::int64_t qkv = (model.num_attention_heads + 2 * model.query_groups()) * model.head_dim();
  EXPECT_TRUE(has_gemm(sweep, 2 * tokens, qkv, model.hidden_size, GemmVariant::kForward));  // mbs 2
  EXPECT_TRUE(has_gemm(sweep, tokens / 2, qkv, model.hidden_size, GemmVariant::kForward));  // cp 2
}

TEST(ModelSweep, GptUsesFusedEpilogues) {
  const layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  SweepCandidates candidates;
  candidates.tensor_parallel = {1};
  candidates.context_parallel = {1};
  candidates.micro_batch = {1};
  const Sweep sweep = model_sweep(model, candidates);
  const std::int64_t tokens = model.seq_length, h = model.hidden_size, ffn = model.ffn_size();
  bool fc1_seen = false, fc2_dgrad_seen = false;
  for (const GemmItem& item : sweep.gemms) {
    if (item.m == tokens && item.n == ffn && item.k == h && item.variant == GemmVariant::kForward) {
      EXPECT_EQ(item.fusion, GemmFusion::kGeluAuxBias);
      fc1_seen = true;
    }
    if (item.m == tokens && item.n == ffn && item.k == h && item.variant == GemmVariant::kBackwardData) {
      fc2_dgrad_seen = true;  // same (m, n, k) as fc1 forward: the first one wins the database key
    }
  }
  EXPECT_TRUE(fc1_seen);
  EXPECT_FALSE(fc2_dgrad_seen);
}

TEST(GenericGrid, QuickGridHasEnoughPointsForEveryFit) {
  const Sweep quick = generic_kernel_grid(true);
  const Sweep full = generic_kernel_grid(false);
  EXPECT_EQ(quick.gemms.size(), 27u);
  EXPECT_EQ(full.gemms.size(), 343u);
  int forward = 0, backward = 0;
  for (const AttentionItem& item : quick.attention) (item.backward ? backward : forward)++;
  EXPECT_GE(forward, 20);  // fit_attention_efficiency's minimum
  EXPECT_GE(backward, 20);
  std::map<layouts::OpKind, int> sizes;
  for (const MemoryBoundItem& item : quick.memory_bound) sizes[item.kind]++;
  EXPECT_EQ(sizes.size(), 10u);
  for (const auto& [kind, count] : sizes) EXPECT_GE(count, 3) << layouts::op_kind_name(kind);
  Sweep merged = quick;
  merge_sweep(merged, full);
  EXPECT_EQ(merged.gemms.size(), 343u);  // the quick grid is a subset of the full one
}

TEST(CollectiveSweep, SizesAndGroupSizes) {
  EXPECT_TRUE(collective_sweep(1, false).empty());
  const auto two = collective_sweep(2, false);
  EXPECT_EQ(two.size(), 6u * 21u);  // 6 ops x 1 KiB..1 GiB in powers of two
  EXPECT_EQ(two.front().bytes, 1024);
  EXPECT_EQ(two.back().bytes, std::int64_t(1) << 30);
  EXPECT_EQ(collective_sweep(2, true).size(), 6u * 11u);
  std::set<int> groups;
  for (const CollectiveItem& item : collective_sweep(4, true)) groups.insert(item.group_size);
  EXPECT_EQ(groups, (std::set<int>{2, 3, 4}));
}

}  // namespace
}  // namespace megatune::profiler
