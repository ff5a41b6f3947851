// Tests of the kernel-level step program: op counts and shapes for known configs, p2p pairing, buckets.
#include "layouts/step_program.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "layouts/flops.h"

namespace megatune::layouts {
namespace {

ParallelConfig config_for(int world, int tp, int pp, int gbs, int mbs = 1) {
  ParallelConfig c;
  c.world_size = world;
  c.tensor_model_parallel_size = tp;
  c.pipeline_model_parallel_size = pp;
  c.micro_batch_size = mbs;
  c.global_batch_size = gbs;
  return c;
}

int count(const std::vector<Op>& ops, OpKind kind, OpPhase phase) {
  return static_cast<int>(
      std::count_if(ops.begin(), ops.end(), [&](const Op& o) { return o.kind == kind && o.phase == phase; }));
}

const Op* find(const std::vector<Op>& ops, const std::string& label, int layer = 0) {
  for (const Op& o : ops)
    if (o.label == label && o.layer == layer) return &o;
  return nullptr;
}

TEST(StepProgram, Llama8bTp2GemmShapesAndCounts) {
  ModelSpec model = model_preset("llama3-8b");
  ParallelConfig config = config_for(2, 2, 1, 1);
  config.validate(model);
  StepProgram program = build_step_program(model, config, 1);
  const std::int64_t s = model.seq_length;
  const Op* qkv = find(program.ops, "qkv");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->m, s);
  EXPECT_EQ(qkv->n, (32 + 2 * 8) * 128 / 2);
  EXPECT_EQ(qkv->k, 4096);
  const Op* fc1 = find(program.ops, "fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(fc1->n, 2 * 14336 / 2);  // SwiGLU: gate and up
  const Op* fc2_wgrad = find(program.ops, "fc2_wgrad");
  ASSERT_NE(fc2_wgrad, nullptr);
  EXPECT_EQ(fc2_wgrad->m, 4096);
  EXPECT_EQ(fc2_wgrad->n, 14336 / 2);
  EXPECT_EQ(fc2_wgrad->k, s);
  EXPECT_FALSE(fc2_wgrad->accumulate);  // micro-batch 0 overwrites the gradient
  for (const Op& op : program.ops) {
    if (op.label == "fc2_wgrad") {
      EXPECT_EQ(op.accumulate, op.microbatch > 0);
    }
  }
  const Op* logits = find(program.ops, "logits", -1);
  ASSERT_NE(logits, nullptr);
  EXPECT_EQ(logits->n, model.padded_vocab_size(2) / 2);
  // The LM head runs per token chunk (bf16 logits within 512 MiB: 2 chunks of 4096 tokens here).
  const std::int64_t chunk = loss_chunk_rows(s, model.padded_vocab_size(2) / 2),
                     chunks = (s + chunk - 1) / chunk;
  EXPECT_EQ(chunks, 2);
  EXPECT_EQ(logits->m, chunk);
  // Only the iteration's first LM-head chunk overwrites the head's gradient.
  EXPECT_EQ(std::count_if(program.ops.begin(), program.ops.end(),
                          [](const Op& o) { return o.label == "logits_wgrad" && !o.accumulate; }),
            1);
  // 4 GEMMs per layer forward + logits; dgrad + wgrad of each in backward.
  EXPECT_EQ(count(program.ops, OpKind::kGemm, OpPhase::kForward), 32 * 4 + chunks);
  EXPECT_EQ(count(program.ops, OpKind::kGemm, OpPhase::kBackward), 2 * (32 * 4 + chunks));
  EXPECT_EQ(count(program.ops, OpKind::kAttentionForward, OpPhase::kForward), 32);
  EXPECT_EQ(count(program.ops, OpKind::kAttentionBackward, OpPhase::kBackward), 32);
  // No SP: all-reduce after proj and fc2 (forward) and after the qkv and fc1 dgrads (backward), plus
  // the embedding all-reduce and 3 cross-entropy all-reduces per loss chunk.
  EXPECT_EQ(count(program.ops, OpKind::kAllReduce, OpPhase::kForward), 32 * 2 + 1 + 3 * chunks);
  EXPECT_EQ(count(program.ops, OpKind::kAllReduce, OpPhase::kBackward), 32 * 2 + 1);
  const Op* attn = find(program.ops, "attn");
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->attention.heads, 16);
  EXPECT_EQ(attn->attention.kv_heads, 4);
  // GEMM FLOPs + attention counted as Megatron does (backward = 2x forward) equal this rank's share of
  // Megatron's per-iteration formula: FLOPs / tp.
  double flops = 0;
  for (const Op& o : program.ops)
    flops += o.gemm_flops() + (o.kind == OpKind::kAttentionForward ? 3.0 * o.attention_flops() : 0.0);
  EXPECT_NEAR(flops / (model_flops_per_iteration(model, 1, 2) / 2), 1.0, 1e-6);
}

TEST(StepProgram, LossChunksKeepTheLogitsWithin512MiB) {
  EXPECT_EQ(loss_chunk_rows(8192, 128256), 2048);  // 2.0 GiB of logits: 4 chunks
  EXPECT_EQ(loss_chunk_rows(8192, 50304), 4096);   // 0.77 GiB: 2 chunks
  EXPECT_EQ(loss_chunk_rows(1000, 128256), 1000);  // fits: one chunk of every token
  EXPECT_EQ(loss_chunk_rows(5000, 128256), 1728);  // 3 chunks of 1667, rounded up to a multiple of 64
  EXPECT_EQ(loss_chunk_rows(8192, 128256, std::int64_t(256) << 20), 1024);  // a 256 MiB budget: 8 chunks
  EXPECT_EQ(loss_chunk_rows(12, 32, 200), 3);  // small budgets: 4 chunks of 3 rows
  for (std::int64_t tokens : {64, 777, 4096, 12345})
    for (std::int64_t vocab : {256, 50304, 131072}) {
      const std::int64_t rows = loss_chunk_rows(tokens, vocab);
      EXPECT_LE(rows, tokens);
      EXPECT_TRUE(rows == tokens || rows % 64 == 0 || rows < 64);
      EXPECT_LE(rows * vocab * 2, (std::int64_t(512) << 20) + 64 * vocab * 2);  // 512 MiB + the rounding
    }
}

TEST(StepProgram, SequenceParallelSwapsAllReducesForGatherAndScatter) {
  ModelSpec model = model_preset("llama3-8b");
  ParallelConfig config = config_for(4, 4, 1, 1);
  config.sequence_parallel = true;
  config.validate(model);
  StepProgram program = build_step_program(model, config, 0);
  const std::int64_t x = static_cast<std::int64_t>(model.seq_length) * 4096 * 2;
  const Op* ag = find(program.ops, "qkv_input_ag");
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->bytes, x);
  EXPECT_EQ(ag->group, CommGroup::kTensor);
  EXPECT_EQ(ag->group_size, 4);
  EXPECT_EQ(find(program.ops, "proj_ar"), nullptr);
  EXPECT_NE(find(program.ops, "proj_rs"), nullptr);
  // Backward per layer: grad AG (2), input AG for wgrad (2), dgrad RS (2).
  int layer0_bwd_ag = 0;
  for (const Op& o : program.ops)
    if (o.layer == 0 && o.phase == OpPhase::kBackward && o.kind == OpKind::kAllGather) ++layer0_bwd_ag;
  EXPECT_EQ(layer0_bwd_ag, 4);
}

TEST(StepProgram, PipelineSendsPairWithReceivesAcrossRanks) {
  ModelSpec model = model_preset("tiny");
  model.num_layers = 8;
  ParallelConfig config = config_for(4, 1, 4, 8);
  config.validate(model);
  std::map<std::tuple<int, int, int, int, int>, int> balance;  // (src, dst, mb, label) -> sends - recvs
  for (int rank = 0; rank < 4; ++rank) {
    StepProgram p = build_step_program(model, config, rank);
    for (const Op& o : p.ops) {
      if (o.kind == OpKind::kSend) {
        EXPECT_EQ(o.bytes, static_cast<std::int64_t>(model.seq_length) * model.hidden_size * 2);
        ++balance[{rank, o.peer_rank, o.microbatch, o.label == "p2p_activation", 0}];
      } else if (o.kind == OpKind::kRecv) {
        --balance[{o.peer_rank, rank, o.microbatch, o.label == "p2p_activation", 0}];
      }
    }
  }
  EXPECT_FALSE(balance.empty());
  for (const auto& [key, value] : balance) EXPECT_EQ(value, 0);
  // 8 microbatches x 3 stage boundaries x (activation + gradient).
  EXPECT_EQ(balance.size(), 8u * 3 * 2);
}

TEST(StepProgram, FullRecomputeRepeatsTheForwardAndSelectiveOnlyAttention) {
  ModelSpec model = model_preset("llama3-8b");
  ParallelConfig config = config_for(1, 1, 1, 1);
  config.recompute_granularity = RecomputeGranularity::kFull;
  config.recompute_method = RecomputeMethod::kUniform;
  config.recompute_num_layers = 1;
  config.validate(model);
  StepProgram full = build_step_program(model, config, 0);
  EXPECT_EQ(count(full.ops, OpKind::kGemm, OpPhase::kRecompute), 32 * 4);
  config.recompute_granularity = RecomputeGranularity::kSelective;
  config.recompute_method = RecomputeMethod::kNone;
  config.recompute_num_layers = 0;
  config.validate(model);
  StepProgram selective = build_step_program(model, config, 0);
  EXPECT_EQ(count(selective.ops, OpKind::kGemm, OpPhase::kRecompute), 0);
  EXPECT_EQ(count(selective.ops, OpKind::kAttentionForward, OpPhase::kRecompute), 32);
}

TEST(StepProgram, GradientBucketsCoverEveryParameterOnce) {
  ModelSpec model = model_preset("llama3-8b");
  ParallelConfig config = config_for(8, 1, 1, 8);
  config.overlap_grad_reduce = true;
  config.validate(model);
  StepProgram p = build_step_program(model, config, 0);
  std::int64_t reduced = 0;
  int buckets = 0;
  for (const Op& o : p.ops) {
    if (o.phase == OpPhase::kGradSync) {
      EXPECT_EQ(o.kind, OpKind::kAllReduce);
      EXPECT_EQ(o.group, CommGroup::kDataContext);
      EXPECT_EQ(o.group_size, 8);
      reduced += o.bytes / 4;
      ++buckets;
    }
  }
  // Every parameter (tied embedding counted once; biases and none here) is reduced once.
  EXPECT_EQ(reduced, model.parameter_counts(1).total);
  EXPECT_GE(buckets, 32);  // buckets close at layer boundaries; every layer holds > 40M params
  // The first bucket is issued during the last microbatch's backward, before the optimizer.
  auto first_sync =
      std::find_if(p.ops.begin(), p.ops.end(), [](const Op& o) { return o.phase == OpPhase::kGradSync; });
  auto last_backward =
      std::find_if(p.ops.rbegin(), p.ops.rend(), [](const Op& o) { return o.phase == OpPhase::kBackward; });
  EXPECT_LT(first_sync - p.ops.begin(), p.ops.rend() - last_backward - 1);
}

// One rank holding the whole model (tp = pp = 1) holds every parameter the model counts, each once, for
// every preset (MLA, MoE, MTP, tied and untied heads, biases): the stage parameters and
// ModelSpec::parameter_counts count with the same functions.
TEST(StepProgram, StageParametersAddUpToTheModelsCounts) {
  for (const std::string& name : model_preset_names()) {
    ModelSpec model = model_preset(name);
    ParallelConfig config = config_for(1, 1, 1, 1);
    config.validate(model);
    const RankShape shape = resolve_rank_shape(model, config);
    const PipelineLayout layout = config.resolved_pipeline_layout(model);
    std::int64_t held = 0;
    for (const PipelineStage& stage : layout.stages()) {
      const StageParameters p = stage_parameters(model, shape, stage);
      held += p.dense + p.expert;
    }
    EXPECT_EQ(held, model.parameter_counts(1).total) << name;
  }
}

TEST(StepProgram, DistributedOptimizerReduceScattersAndGathersParams) {
  ModelSpec model = model_preset("llama3-8b");
  ParallelConfig config = config_for(8, 2, 1, 8);
  config.use_distributed_optimizer = true;
  config.validate(model);
  StepProgram p = build_step_program(model, config, 0);
  std::int64_t rs = 0, ag = 0;
  for (const Op& o : p.ops) {
    if (o.phase == OpPhase::kGradSync) rs += o.bytes;
    if (o.label == "param_ag") ag += o.bytes;
  }
  EXPECT_GT(rs, 0);
  EXPECT_EQ(ag * 2, rs);  // bf16 params vs fp32 grads
}

}  // namespace
}  // namespace megatune::layouts

namespace megatune::layouts {
namespace {

TEST(StepProgram, ContextParallelRingSplitsTheCausalWork) {
  ModelSpec model = model_preset("llama3-8b");
  auto attention_flops = [&](int cp) {
    ParallelConfig config = config_for(cp, 1, 1, 1);
    config.context_parallel_size = cp;
    config.validate(model);
    StepProgram p = build_step_program(model, config, 0);
    double flops = 0;
    int kernels = 0, sends = 0;
    for (const Op& o : p.ops) {
      if (o.layer != 0 || o.phase != OpPhase::kForward) continue;
      if (o.kind == OpKind::kAttentionForward) {
        flops += o.attention_flops();
        ++kernels;
      }
      if (o.kind == OpKind::kSend && o.group == CommGroup::kContext) ++sends;
    }
    EXPECT_EQ(kernels, cp);
    EXPECT_EQ(sends, cp - 1);
    return flops;
  };
  const double full = attention_flops(1);
  EXPECT_NEAR(attention_flops(2) / full, 0.5, 1e-12);
  EXPECT_NEAR(attention_flops(4) / full, 0.25, 1e-12);
}

}  // namespace
}  // namespace megatune::layouts

namespace megatune::layouts {
namespace {

// MLA's attention multiplies queries and keys of qk_head_dim + qk_pos_emb_head_dim, and the probabilities by
// values of v_head_dim: the op carries both, and its FLOPs count each GEMM at its own width.
TEST(StepProgram, MlaAttentionCarriesTheValueHeadDim) {
  const ModelSpec model = model_preset("deepseek-v3");
  ParallelConfig config = config_for(1, 1, 1, 1);
  config.validate(model);
  const StepProgram p = build_step_program(model, config, 0);
  const Op* attn = nullptr;
  for (const Op& o : p.ops)
    if (o.kind == OpKind::kAttentionForward && !attn) attn = &o;
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->attention.head_dim, model.qk_head_dim + model.qk_pos_emb_head_dim);
  EXPECT_EQ(attn->attention.value_head_dim(), model.v_head_dim);
  const AttentionShape& a = attn->attention;
  const double causal_pairs = 0.5 * a.batch * a.heads * static_cast<double>(a.seq_q) * a.seq_kv;
  EXPECT_DOUBLE_EQ(attn->attention_flops(), 2.0 * causal_pairs * (192 + 128));
  AttentionShape same_width = a;
  same_width.head_dim_v = 0;
  EXPECT_NE(same_width, a);  // an op of another value width is another op
  same_width.head_dim_v = a.head_dim;
  same_width.head_dim = a.head_dim;
  AttentionShape unset = same_width;
  unset.head_dim_v = 0;
  EXPECT_EQ(unset, same_width);  // 0 means "as the q/k head dim"
}

// Streams (Op::stream): kernels on the compute stream; TP collectives on the tp stream, the gradient buckets
// on the data-parallel one, so that a bucket in flight does not hold the next TP collective.
TEST(StepProgram, EachCollectiveRunsOnItsGroupsStream) {
  const ModelSpec model = model_preset("tiny");
  ParallelConfig config = config_for(4, 2, 1, 4);
  config.overlap_grad_reduce = true;
  config.validate(model);
  const StepProgram program = build_step_program(model, config, 1);
  const RankGrid grid = RankGrid::from_config(config);
  int tensor = 0, buckets = 0;
  for (const Op& op : program.ops) {
    if (!op.is_communication()) {
      EXPECT_EQ(op.stream, CommGroup::kNone) << to_string(op);
      continue;
    }
    EXPECT_EQ(grid.comm_group_members(1, op.stream), grid.comm_group_members(1, op.group)) << to_string(op);
    if (op.role == OpRole::kTensorParallel) {
      EXPECT_EQ(op.stream, CommGroup::kTensor);
      ++tensor;
    }
    if (op.role == OpRole::kGradReduce) {
      EXPECT_EQ(op.stream, CommGroup::kData);  // dp-cp is dp without context parallelism
      ++buckets;
    }
  }
  EXPECT_GT(tensor, 0);
  EXPECT_GT(buckets, 0);
}

}  // namespace
}  // namespace megatune::layouts
