// Where the engine's device memory goes: the arena a Trainer reserves, per allocation, computed with the
// SizingBackend (the CUDA backend's dtype sizes, no GPU) for the benchmark shapes of bench/RESULTS.md, held
// against compiled PyTorch's peak on the same runs; what the shared / recomputed buffers save; and the bytes
// per parameter of each training state under DDP and the distributed optimizer against Megatron's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "executor/backend/sizing_backend.h"
#include "executor/training/arena_sizing.h"
#include "executor/training/trainer.h"
#include "layouts/model_spec.h"
#include "layouts/recompute_plan.h"

namespace megatune::executor {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TrainerConfig perf_config(const std::string& model, int micro_batch, int seq,
                          RecomputeGranularity recompute) {
  layouts::ModelSpec spec = layouts::torch_anchor_model(model);
  spec.seq_length = seq;
  TrainerConfig config;
  config.model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  config.batch.micro_batch = micro_batch;
  config.batch.seq = seq;
  config.batch.num_microbatches = 1;
  config.recompute = recompute;
  config.compute_dtype = DType::kBF16;
  return config;
}

std::int64_t bytes_of(const std::vector<ArenaUse>& breakdown, const std::string& what) {
  for (const ArenaUse& u : breakdown)
    if (u.what == what) return u.bytes;
  return 0;
}

// Rank 0's arena for a bf16 run of `config`.
RankArena bf16_rank_arena(const layouts::ModelSpec& model, const layouts::ParallelConfig& config) {
  TrainOptions options;
  options.bf16 = true;
  SizingBackend backend;
  return size_rank_arena(model, config, options, 0, backend);
}

std::int64_t total_of(const std::vector<ArenaUse>& breakdown) {
  std::int64_t total = 0;
  for (const ArenaUse& u : breakdown) total += u.bytes;
  return total;
}

// The CUDA backend's memory beyond the arena: the GEMM workspace (32 MiB) and the grad-norm workspace (under
// 1 MiB here), plus the kernel scratch it asks the model to allocate (the largest user is the attention
// backward's fp32 dQ accumulator, T * heads * head_dim * 4 bytes = 64 MiB on both shapes; the norm backward's
// partials take 8 MiB, the column sums 4 MiB): about 97 MiB. H200, fourth session: `device_bytes()` exceeded
// the sized arena by 0.09 (gpt-1.3b) and 0.10 GiB (llama-1b) (bench/RESULTS.md "executor").
constexpr double kOutsideArenaGiB = 0.125;

struct PerfShape {
  const char* model;
  int micro_batch, seq;
  double torch_compiled_peak_gib;  // bench/RESULTS.md, section "executor" (torch.cuda.max_memory_allocated)
  double budget_gib;               // what the arena + workspaces must stay under
};

class PerfShapeMemory : public ::testing::TestWithParam<PerfShape> {};

TEST_P(PerfShapeMemory, ArenaStaysBelowCompiledPyTorch) {
  const PerfShape shape = GetParam();
  const TrainerConfig config =
      perf_config(shape.model, shape.micro_batch, shape.seq, RecomputeGranularity::kNone);
  SizingBackend sizing;
  const std::vector<ArenaUse> breakdown = size_training_arena(config, sizing);
  std::printf("%s seq %d mbs %d:\n%s", shape.model, shape.seq, shape.micro_batch,
              format_arena_breakdown(breakdown).c_str());
  const double total_gib = double(total_of(breakdown)) / kGiB;
  EXPECT_LT(total_gib + kOutsideArenaGiB, shape.budget_gib);

  // Per-parameter state: bf16 weights (2 bytes), fp32 main weights and gradients (4 + 4), Adam m and v (8).
  const layouts::ModelSpec spec = layouts::torch_anchor_model(shape.model);
  const ParameterLayout layout(config.model);
  const std::int64_t params = layout.total_elements();
  EXPECT_NEAR(double(params), double(spec.total_parameters()), 0.01 * double(params));
  // The bf16 copy leaves out the untied embedding tables (the lookup reads the fp32 main parameters).
  std::int64_t tables = layout.find("embedding.word_embeddings.weight").numel();
  if (config.model.position == PositionEmbedding::kLearned)
    tables += layout.find("embedding.position_embeddings.weight").numel();
  EXPECT_GE(bytes_of(breakdown, "model parameters (compute dtype)"), 2 * (params - tables));
  EXPECT_LT(bytes_of(breakdown, "model parameters (compute dtype)"), 2 * (params - tables) + (1 << 20));
  EXPECT_GE(bytes_of(breakdown, "fp32 main gradients"), 4 * params);
  EXPECT_GE(bytes_of(breakdown, "AdamW exp_avg, exp_avg_sq (fp32)"), 8 * params);

  // Nothing of the norm or activation outputs is kept per layer: two (T, h) norm buffers and one scratch.
  const layouts::RankShape rank = rank_shape(config.model, config.batch.micro_batch, config.batch.seq);
  const std::int64_t T = rank.tokens, h = config.model.hidden;
  EXPECT_EQ(bytes_of(breakdown, "norm outputs (shared, recomputed)"), 2 * T * h * 2);
  EXPECT_EQ(bytes_of(breakdown, "activation output / gradient scratch (shared)"),
            T * std::max(rank.ffn_per_rank(), rank.attention_width() + rank.qkv_width()) * 2);
  // Per layer: the qkv, the attention output and its LSE, the mid residual, the fc1 output, the stats.
  const std::int64_t L = config.model.num_layers;
  EXPECT_EQ(bytes_of(breakdown, "saved: fc1 output (pre-activation)"), L * T * rank.fc1_width() * 2);
  EXPECT_EQ(bytes_of(breakdown, "saved: qkv"), L * T * rank.qkv_width() * 2);
}

INSTANTIATE_TEST_SUITE_P(BenchShapes, PerfShapeMemory,
                         ::testing::Values(PerfShape{"gpt-1.3b", 4, 2048, 32.95, 32.95},
                                           PerfShape{"llama-1b", 2, 4096, 31.89, 31.89}),
                         [](const ::testing::TestParamInfo<PerfShape>& info) {
                           return std::string(info.param.model[0] == 'g' ? "Gpt1p3b" : "Llama1b");
                         });

TEST(ArenaBreakdown, SizingCountsEveryAllocationOncePerLabel) {
  SizingBackend sizing;
  sizing.begin_sizing();
  sizing.allocate(DType::kBF16, 3, 5, "a");      // 30 bytes -> 256
  sizing.allocate(DType::kFP32, 100, 100, "b");  // 40000 -> 40192
  sizing.allocate(DType::kBF16, 1, 128, "a");    // 256
  EXPECT_EQ(sizing.end_sizing(), 256 + 40192 + 256);
  ASSERT_EQ(sizing.arena_breakdown().size(), 2u);
  EXPECT_EQ(sizing.arena_breakdown()[0].what, "a");
  EXPECT_EQ(sizing.arena_breakdown()[0].bytes, 512);
  EXPECT_EQ(sizing.arena_breakdown()[0].allocations, 2);
  EXPECT_EQ(sizing.arena_breakdown()[1].bytes, 40192);
  EXPECT_THROW(sizing.reserve_arena(1024), std::logic_error);
  const std::string text = format_arena_breakdown(sizing.arena_breakdown());
  EXPECT_NE(text.find("total"), std::string::npos);
}

TEST(ArenaBreakdown, FullRecomputeKeepsOneLayerSet) {
  const TrainerConfig none = perf_config("gpt-1.3b", 4, 2048, RecomputeGranularity::kNone);
  TrainerConfig full = none;
  full.recompute = RecomputeGranularity::kFull;
  SizingBackend a, b;
  const auto with_none = size_training_arena(none, a), with_full = size_training_arena(full, b);
  EXPECT_EQ(bytes_of(with_full, "saved: qkv") * none.model.num_layers, bytes_of(with_none, "saved: qkv"));
  EXPECT_LT(total_of(with_full), total_of(with_none));
}

// A pipeline stage's last output lives until it is sent (Megatron's deallocate_output_tensor): one buffer per
// model chunk that sends, not one per micro-batch in flight. gpt-125m (12 layers) on pp2 with two virtual
// stages of 3 layers: rank 0's chunks 0 and 2 send, rank 1's chunk 1 sends and chunk 3 holds the loss.
TEST(ArenaBreakdown, PipelineOutputIsOneBufferPerSendingChunk) {
  layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  model.seq_length = 256;
  layouts::ParallelConfig config;
  config.world_size = 2;
  config.pipeline_model_parallel_size = 2;
  config.num_virtual_stages_per_pipeline_rank = 2;
  config.overlap_p2p_comm = true;  // Megatron takes vpp at pp 2 only so
  config.micro_batch_size = 1;
  config.global_batch_size = 8;
  config.validate(model);
  TrainOptions options;
  options.bf16 = true;
  const std::int64_t one = 256 * 768 * 2;  // (seq, h) in bf16
  const std::string label = "pipeline stage output (one, freed after send)";
  for (const auto& [rank, sending_chunks] : {std::pair{0, 2}, std::pair{1, 1}}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    SizingBackend backend;
    const RankArena arena = size_rank_arena(model, config, options, rank, backend);
    EXPECT_EQ(bytes_of(arena.breakdown, label), sending_chunks * one);
    // Every layer input is still kept per micro-batch in flight: on rank 0 (both chunks send) exactly the
    // 3 inputs of each chunk per slot, and more than one slot.
    const std::int64_t inputs = bytes_of(arena.breakdown, "residual stream (layer inputs)");
    if (rank == 0) {
      EXPECT_EQ(inputs % (3 * one), 0) << inputs;
      EXPECT_GT(inputs / (3 * one), 2) << inputs;
    }
  }
}

// Partial full recomputation: a kept layer keeps its own set per slot, recomputed layers share one set per
// position in a unit, and a unit's inner layer inputs are shared too (gpt-1.3b: 24 layers, one slot).
TEST(ArenaBreakdown, PartialRecomputeSharesUnitSetsAndInnerInputs) {
  const TrainerConfig none = perf_config("gpt-1.3b", 4, 2048, RecomputeGranularity::kNone);
  const auto sized = [&](layouts::RecomputeMethod method, int layers) {
    TrainerConfig c = none;
    c.recompute = {RecomputeGranularity::kFull, method, layers};
    SizingBackend backend;
    return size_training_arena(c, backend);
  };
  SizingBackend a;
  const auto with_none = size_training_arena(none, a);
  const auto u1 = sized(layouts::RecomputeMethod::kUniform, 1),
             u2 = sized(layouts::RecomputeMethod::kUniform, 2),
             b8 = sized(layouts::RecomputeMethod::kBlock, 8);
  const std::int64_t qkv_set = bytes_of(with_none, "saved: qkv") / 24;
  EXPECT_EQ(bytes_of(u1, "saved: qkv"), qkv_set);
  EXPECT_EQ(bytes_of(u2, "saved: qkv"), 2 * qkv_set);         // the two positions of a unit
  EXPECT_EQ(bytes_of(b8, "saved: qkv"), (16 + 1) * qkv_set);  // 16 kept layers, one recomputed set
  const std::int64_t residual = bytes_of(with_none, "residual stream (layer inputs)") / 25;
  EXPECT_EQ(bytes_of(u2, "residual stream (layer inputs)"), (12 + 1) * residual);
  EXPECT_EQ(bytes_of(u2, "recomputed unit's inner layer inputs (shared)"), residual);
  EXPECT_EQ(bytes_of(u1, "recomputed unit's inner layer inputs (shared)"), 0);
  EXPECT_LT(total_of(u1), total_of(b8));
  EXPECT_LT(total_of(b8), total_of(with_none));
}

// One data-parallel rank of gpt-125m (tied: the bf16 copy covers every parameter) at dp x cp = d: DDP holds
// 2 + 4 + 4 + 8 = 18 bytes per parameter in bf16; the distributed optimizer keeps the fp32 main parameters
// and moments of its shard only, Megatron's 6 + 12/d (any d: the buckets pad to lcm(d, 128)); an fp32
// model's parameters are its main parameters: 8 + 8/d. Tolerance 0.5%: the bucket padding and the arena's
// 256-byte alignment.
TEST(ParameterStateBytes, FollowMegatronsFormulaUnderDdpAndTheDistributedOptimizer) {
  layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  model.seq_length = 256;
  struct Case {
    int dp, cp;
    bool dist_opt, bf16;
  };
  for (const Case c : {Case{2, 1, false, true}, Case{3, 1, true, true}, Case{6, 1, true, true},
                       Case{2, 2, true, true}, Case{3, 1, true, false}}) {
    const int d = c.dp * c.cp;
    SCOPED_TRACE("dp" + std::to_string(c.dp) + " cp" + std::to_string(c.cp) +
                 (c.dist_opt ? " dist-opt" : "") + (c.bf16 ? " bf16" : " fp32"));
    layouts::ParallelConfig config;
    config.world_size = d;
    config.context_parallel_size = c.cp;
    config.use_distributed_optimizer = c.dist_opt;
    config.micro_batch_size = 1;
    config.global_batch_size = c.dp;
    config.validate(model);
    TrainOptions options;
    options.bf16 = c.bf16;
    SizingBackend backend;
    const RankArena arena = size_rank_arena(model, config, options, 0, backend);
    ASSERT_EQ(arena.state_bytes.size(), 4u);
    const double shard = c.dist_opt ? 1.0 / d : 1.0;
    const double expected[4] = {c.bf16 ? 2.0 : 0.0, 4.0, c.bf16 ? 4.0 * shard : 4.0, 8.0 * shard};
    double total = 0.0;
    for (int i = 0; i < 4; ++i) {
      EXPECT_NEAR(arena.state_bytes[i].bytes_per_parameter, expected[i], 0.005 * expected[i] + 1e-9)
          << arena.state_bytes[i].state;
      total += arena.state_bytes[i].bytes_per_parameter;
    }
    const double megatron = c.dist_opt ? (c.bf16 ? 6.0 + 12.0 / d : 8.0 + 8.0 / d) : 18.0;
    EXPECT_DOUBLE_EQ(arena.megatron_bytes_per_parameter, megatron);
    EXPECT_NEAR(total, megatron, 0.005 * megatron);
    EXPECT_NE(format_parameter_state_bytes(arena).find("fp32 main parameters"), std::string::npos);
  }
}

// Megatron FSDP on one rank of gpt-125m at dp = d (bf16). Megatron's bytes per parameter: optim 2 + 4 + 12/d,
// optim_grads 2 + (4 + 12)/d, optim_grads_params (2 + 4 + 12)/d. The executor shards the fp32 main parameters
// and moments the same way (4/d + 8/d) under every strategy; its fp32 gradients stay whole (4) under optim
// and its bf16 parameters (2) under optim and optim_grads (FsdpWeightBytes holds optim_grads_params' shard
// and slots, FsdpGradBytes the sharded gradients' shard and slots): what the sizing pass reports, beside
// Megatron's figure.
TEST(ParameterStateBytes, MegatronFsdpShardsTheOptimizerStateAndStatesMegatronsFigure) {
  layouts::ModelSpec model = layouts::model_preset("gpt-125m");
  model.seq_length = 256;
  const int d = 4;
  using S = layouts::DataParallelSharding;
  for (const S s : {S::kOptim, S::kOptimGrads, S::kOptimGradsParams}) {
    SCOPED_TRACE(std::string(layouts::to_string(s)));
    layouts::ParallelConfig config;
    config.world_size = d;
    config.use_megatron_fsdp = true;
    config.data_parallel_sharding_strategy = s;
    config.micro_batch_size = 1;
    config.global_batch_size = d;
    config.validate(model);
    const RankArena arena = bf16_rank_arena(model, config);
    ASSERT_EQ(arena.state_bytes.size(), 4u);
    const double expected[4] = {2.0, 4.0, 4.0 / d, 8.0 / d};
    for (int i = s == S::kOptimGradsParams ? 2 : 0; i < 4; ++i)
      if (i != 1 || s == S::kOptim)
        EXPECT_NEAR(arena.state_bytes[i].bytes_per_parameter, expected[i], 0.005 * expected[i])
            << arena.state_bytes[i].state;
    const double megatron = s == S::kOptim ? 6.0 + 12.0 / d : s == S::kOptimGrads ? 2.0 + 16.0 / d : 18.0 / d;
    EXPECT_DOUBLE_EQ(arena.megatron_bytes_per_parameter, megatron);
  }
}

// FSDP optim_grads_params' bf16 weights on one rank at dp = d, from the shapes: this rank's shard of every
// bucket (a bucket per parameter entry, padded to lcm(d, 128)) plus the gathered-entry slots, each the
// largest entry's buckets: 2 (the entry in use and the next; a tied head's embedding is one of them), 3 when
// a tied head keeps the embedding beside a full-recompute unit of 2 layers.
std::int64_t fsdp_weight_bytes(const layouts::ModelSpec& spec, int d, int largest_unit) {
  const TransformerConfig model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  BufferBucketing bucketing;
  bucketing.dense.data_parallel_size = d;
  bucketing.dense.overlap_grad_reduce = true;
  bucketing.dense.bucket_size_elements = 1;
  bucketing.dense.distributed_optimizer = true;
  const ParameterLayout layout(model, StageSpan{}, bucketing);
  const GradBufferLayout& buffer = layout.dense_buffer();
  std::int64_t shard = 0, largest = 0;
  std::map<int, std::int64_t> entry_elements;
  for (int b = 0; b < static_cast<int>(buffer.buckets().size()); ++b) {
    const GradBucketRange& bucket = buffer.buckets()[b];
    shard += buffer.shard_elements(b);
    largest = std::max(largest, entry_elements[buffer.entries()[bucket.first_entry].group] += bucket.numel());
  }
  const int slots = layouts::fsdp_gathered_entries(largest_unit, !spec.untie_embeddings_and_output_weights);
  const auto aligned = [](std::int64_t bytes) {
    return (bytes + Backend::kArenaAlignBytes - 1) / Backend::kArenaAlignBytes * Backend::kArenaAlignBytes;
  };
  return aligned(2 * shard) + slots * aligned(2 * largest);
}

// A preset at sequence 256 on d data-parallel ranks, one micro-batch each.
std::pair<layouts::ModelSpec, layouts::ParallelConfig> data_parallel_grid(const char* preset, int d) {
  std::pair<layouts::ModelSpec, layouts::ParallelConfig> grid{layouts::model_preset(preset), {}};
  grid.first.seq_length = 256;
  grid.second.world_size = d;
  grid.second.micro_batch_size = 1;
  grid.second.global_batch_size = d;
  return grid;
}

// What train --dry-run reports for the bf16 weights under optim_grads_params, exactly: 1/d of them plus the
// slots, for a tied (gpt-125m: its embedding, 31% of the parameters, is the largest entry) and an untied
// model (llama3-8b) at dp 2 and 4, and with full recomputation in 2-layer units. The distributed optimizer on
// the same grid holds them all: more, unless two embedding-sized slots outweigh what the shard saves.
TEST(FsdpWeightBytes, DryRunHoldsTheShardAndTheGatheredEntrySlots) {
  struct Case {
    const char* model;
    int d;
    int recompute_layers;  // 0: no recomputation, else full recomputation in uniform units of this many
    bool below_distributed_optimizer;  // 1/d + slots < 1
  };
  for (const Case c :
       {Case{"gpt-125m", 2, 0, false}, Case{"gpt-125m", 4, 0, true}, Case{"llama3-8b", 2, 0, true},
        Case{"llama3-8b", 4, 0, true}, Case{"gpt-125m", 4, 2, false}}) {
    SCOPED_TRACE(std::string(c.model) + " dp " + std::to_string(c.d) + " recompute " +
                 std::to_string(c.recompute_layers));
    auto [model, config] = data_parallel_grid(c.model, c.d);
    if (c.recompute_layers > 0) {
      config.recompute_granularity = layouts::RecomputeGranularity::kFull;
      config.recompute_method = layouts::RecomputeMethod::kUniform;
      config.recompute_num_layers = c.recompute_layers;
    }
    config.use_distributed_optimizer = true;
    config.validate(model);
    const RankArena distributed = bf16_rank_arena(model, config);
    config.use_distributed_optimizer = false;
    config.use_megatron_fsdp = true;
    config.data_parallel_sharding_strategy = layouts::DataParallelSharding::kOptimGradsParams;
    config.validate(model);
    const RankArena arena = bf16_rank_arena(model, config);
    const std::int64_t weights = bytes_of(arena.breakdown, state_label::kModelParams);
    EXPECT_EQ(weights, fsdp_weight_bytes(model, c.d, c.recompute_layers));
    EXPECT_EQ(weights < bytes_of(distributed.breakdown, state_label::kModelParams),
              c.below_distributed_optimizer);
  }
}

// FSDP's sharded fp32 gradients on one rank at dp = d, from the shapes: this rank's shard of every bucket
// (optim_grads_params: a bucket per parameter entry; optim_grads: Megatron's max(40M, 1M x d)-element
// buckets, as overlap_grad_reduce buckets them), each padded to lcm(d, 128), plus
// layouts::kFsdpGradientBucketsInFlight whole-bucket slots of the largest bucket.
std::int64_t fsdp_grad_bytes(const layouts::ModelSpec& spec, int d, layouts::DataParallelSharding sharding) {
  const TransformerConfig model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  BufferBucketing bucketing;
  bucketing.dense.data_parallel_size = d;
  bucketing.dense.overlap_grad_reduce = true;
  if (sharding == layouts::DataParallelSharding::kOptimGradsParams) bucketing.dense.bucket_size_elements = 1;
  bucketing.dense.distributed_optimizer = true;
  const ParameterLayout layout(model, StageSpan{}, bucketing);
  const GradBufferLayout& buffer = layout.dense_buffer();
  std::int64_t shard = 0, largest = 0;
  for (int b = 0; b < static_cast<int>(buffer.buckets().size()); ++b) {
    shard += buffer.shard_elements(b);
    largest = std::max(largest, buffer.buckets()[b].numel());
  }
  const auto aligned = [](std::int64_t bytes) {
    return (bytes + Backend::kArenaAlignBytes - 1) / Backend::kArenaAlignBytes * Backend::kArenaAlignBytes;
  };
  return aligned(4 * shard) + layouts::kFsdpGradientBucketsInFlight * aligned(4 * largest);
}

// What train --dry-run reports for the fp32 gradients under optim_grads and optim_grads_params, exactly: the
// shard and the slots, no whole gradient buffer (the distributed optimizer on the same grid holds 4 bytes
// per parameter): tied gpt-125m and untied llama3-8b at dp 2 and 4.
TEST(FsdpGradBytes, DryRunHoldsTheShardAndTheBucketSlotsNotTheWholeBuffer) {
  struct Case {
    const char* model;
    int d;
  };
  using S = layouts::DataParallelSharding;
  for (const S sharding : {S::kOptimGrads, S::kOptimGradsParams})
    for (const Case c : {Case{"gpt-125m", 2}, Case{"gpt-125m", 4}, Case{"llama3-8b", 4}}) {
      SCOPED_TRACE(std::string(c.model) + " dp " + std::to_string(c.d) + " " +
                   std::string(layouts::to_string(sharding)));
      auto [model, config] = data_parallel_grid(c.model, c.d);
      config.use_distributed_optimizer = true;
      config.validate(model);
      const std::int64_t whole = bytes_of(bf16_rank_arena(model, config).breakdown, state_label::kMainGrads);
      config.use_distributed_optimizer = false;
      config.use_megatron_fsdp = true;
      config.data_parallel_sharding_strategy = sharding;
      config.validate(model);
      const RankArena arena = bf16_rank_arena(model, config);
      const std::int64_t grads = bytes_of(arena.breakdown, state_label::kMainGrads);
      EXPECT_EQ(grads, fsdp_grad_bytes(model, c.d, sharding));
      // Less than the whole buffer, except where a small model's slots outweigh its shard's saving
      // (gpt-125m's two slots of its embedding, 31% of it, at dp2; optim_grads' 40M-element buckets).
      if (std::string(c.model) == "llama3-8b" || (sharding == S::kOptimGradsParams && c.d == 4))
        EXPECT_LT(grads, whole);
    }
}

}  // namespace
}  // namespace megatune::executor
