// The ops the executor issues for one iteration (recorded by the backend) against the planner's step
// program (layouts::build_step_program) for the same model and layout, and their expected counts.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/trainer.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"

namespace megatune::executor {
namespace {

struct Recorded {
  std::vector<layouts::Op> executor;
  std::vector<layouts::Op> planner;
};

Recorded record(const layouts::ModelSpec& spec, int micro_batch, int num_microbatches,
                RecomputeGranularity recompute,
                std::int64_t loss_chunk_logits_bytes = layouts::kLossChunkLogitsBytes,
                const layouts::Fp8Settings& fp8 = {}) {
  layouts::ParallelConfig parallel;
  parallel.micro_batch_size = micro_batch;
  parallel.global_batch_size = micro_batch * num_microbatches;
  parallel.recompute_granularity = recompute;
  if (recompute == RecomputeGranularity::kFull) {
    parallel.recompute_method = layouts::RecomputeMethod::kUniform;
    parallel.recompute_num_layers = 1;
  }
  parallel.validate(spec);
  TrainerConfig config;
  config.model = transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  config.model.fp8 = fp8;
  config.batch.micro_batch = micro_batch;
  config.batch.seq = spec.seq_length;
  config.batch.num_microbatches = num_microbatches;
  config.batch.loss_chunk_logits_bytes = loss_chunk_logits_bytes;
  config.recompute = recompute;
  config.compute_dtype = DType::kBF16;
  CpuBackend backend(true);
  SingleRankCommunicator communicator(backend);
  Trainer trainer(config, layouts::build_schedule(spec, parallel, 0), backend, communicator);
  std::vector<MicroBatch> batches(num_microbatches);
  std::mt19937 rng(1);
  for (MicroBatch& mb : batches)
    for (std::int64_t t = 0; t < config.batch.micro_batch * config.batch.seq; ++t) {
      mb.tokens.push_back(static_cast<std::int32_t>(rng() % spec.vocab_size));
      mb.labels.push_back(static_cast<std::int32_t>(rng() % spec.vocab_size));
      mb.loss_mask.push_back(1.0f);
    }
  backend.recorder().set_enabled(true);
  trainer.train_step(batches);
  Recorded r;
  r.executor = backend.recorder().ops();
  layouts::StepProgramOptions options;
  options.loss_chunk_logits_bytes = loss_chunk_logits_bytes;
  options.fp8 = fp8;
  r.planner = layouts::build_step_program(spec, parallel, 0, options).ops;
  return r;
}

void expect_same_program(const Recorded& r) {
  ASSERT_EQ(r.executor.size(), r.planner.size());
  for (std::size_t i = 0; i < r.executor.size(); ++i) {
    const layouts::Op& e = r.executor[i];
    const layouts::Op& p = r.planner[i];
    EXPECT_TRUE(e.same_work(p) && e.microbatch == p.microbatch)
        << "op " << i << "\n  executor: " << layouts::to_string(e)
        << "\n  planner:  " << layouts::to_string(p);
  }
}

TEST(EngineOpRecording, TinyMatchesTheStepProgram) {
  const Recorded r = record(layouts::model_preset("tiny"), 2, 2, RecomputeGranularity::kNone);
  // Per micro-batch: 4 + 10 per layer forward (the attention block's residual add is part of the pre-MLP
  // norm), 4 + 15 per layer backward (no biases, RoPE, SwiGLU; the backward recomputes both norm outputs);
  // then 2.
  EXPECT_EQ(r.executor.size(), static_cast<std::size_t>(2 * (4 + 2 * 10 + 4 + 2 * 15) + 2));
  expect_same_program(r);
}

TEST(EngineOpRecording, RecomputationMatchesTheStepProgram) {
  for (RecomputeGranularity recompute : {RecomputeGranularity::kSelective, RecomputeGranularity::kFull}) {
    const Recorded r = record(layouts::model_preset("tiny"), 1, 2, recompute);
    std::map<layouts::OpPhase, int> phases;
    for (const layouts::Op& op : r.executor) phases[op.phase]++;
    // Selective: one attention forward re-run per layer and micro-batch, plus the two norm outputs every
    // backward recomputes; full: the whole layer (10 ops), which also produces those.
    EXPECT_EQ(phases[layouts::OpPhase::kRecompute],
              recompute == RecomputeGranularity::kSelective ? 2 * 2 * (1 + 2) : 2 * 2 * 10);
    expect_same_program(r);
  }
}

layouts::ModelSpec small_gpt() {
  layouts::ModelSpec spec = layouts::model_preset("gpt-125m");
  spec.num_layers = 2;
  spec.hidden_size = 64;
  spec.num_attention_heads = 4;
  spec.ffn_hidden_size = 128;
  spec.seq_length = 16;
  spec.max_position_embeddings = 16;
  spec.vocab_size = 128;
  return spec;
}

TEST(EngineOpRecording, GptFusesGeluAndBiasGradientsIntoGemms) {
  for (RecomputeGranularity recompute :
       {RecomputeGranularity::kNone, RecomputeGranularity::kSelective, RecomputeGranularity::kFull}) {
    const Recorded r = record(small_gpt(), 1, 2, recompute);
    int bias_grads = 0, activations = 0, recomputed = 0;
    for (const layouts::Op& op : r.executor) {
      if (op.label.size() > 6 && op.label.substr(op.label.size() - 6) == "_bgrad") ++bias_grads;
      if (op.kind == layouts::OpKind::kActivation || op.kind == layouts::OpKind::kActivationBackward) {
        ++activations;
        EXPECT_EQ(op.kind, layouts::OpKind::kActivationBackward) << layouts::to_string(op);
      }
      if (op.phase == layouts::OpPhase::kRecompute) ++recomputed;
    }
    EXPECT_EQ(bias_grads, 0);  // part of the weight-gradient GEMM ops
    // GELU runs in fc1's epilogue: the only activation kernel is the backward pass that also recomputes the
    // activation output (2 layers x 2 micro-batches).
    EXPECT_EQ(activations, 2 * 2);
    // Norm outputs (2 per layer) recomputed; selective adds the attention; full re-runs the layer (8 ops: no
    // RoPE, GELU fused, the first residual add in the pre-MLP norm) instead.
    EXPECT_EQ(recomputed, recompute == RecomputeGranularity::kFull        ? 2 * 2 * 8
                          : recompute == RecomputeGranularity::kSelective ? 2 * 2 * 3
                                                                          : 2 * 2 * 2);
    expect_same_program(r);
  }
}

TEST(EngineOpRecording, ChunkedLossMatchesTheStepProgram) {
  // tiny: 64 tokens x 256 vocab x 2 bytes = 32 KiB of logits; an 8 KiB budget gives 4 chunks of 16 tokens,
  // each with its logits GEMM, cross entropy, dgrad and wgrad in the forward pass.
  const Recorded r = record(layouts::model_preset("tiny"), 2, 2, RecomputeGranularity::kNone, 8 << 10);
  int heads = 0, head_backward_in_forward = 0;
  for (std::size_t i = 0; i < r.executor.size(); ++i) {
    const layouts::Op& op = r.executor[i];
    if (op.label == "logits") {
      ++heads;
      EXPECT_EQ(op.m, 16);
    }
    if (op.label == "logits_wgrad" && i + 1 < r.executor.size() && r.executor[i + 1].label == "logits") {
      ++head_backward_in_forward;
    }
  }
  EXPECT_EQ(heads, 2 * 4);
  EXPECT_EQ(head_backward_in_forward, 2 * 3);  // per micro-batch, chunks 1..3 follow a wgrad
  expect_same_program(r);
}

// FP8 linears (layouts/fp8.h): every dense linear's GEMMs in FP8 with their casts, the weights cast once per
// iteration (micro-batch 0's forward, not the re-run of full recomputation), under both recipes.
TEST(EngineOpRecording, Fp8LinearsMatchTheStepProgram) {
  for (layouts::Fp8Recipe recipe : {layouts::Fp8Recipe::kDelayed, layouts::Fp8Recipe::kTensorwise}) {
    for (RecomputeGranularity recompute : {RecomputeGranularity::kNone, RecomputeGranularity::kFull}) {
      layouts::Fp8Settings fp8;
      fp8.format = layouts::Fp8Format::kHybrid;
      fp8.recipe = recipe;
      const Recorded r =
          record(layouts::model_preset("tiny"), 2, 2, recompute, layouts::kLossChunkLogitsBytes, fp8);
      int fp8_gemms = 0, weight_casts = 0, casts = 0;
      for (const layouts::Op& op : r.executor) {
        if (op.kind == layouts::OpKind::kGemm && op.dtype == layouts::DType::kFP8) ++fp8_gemms;
        const std::string& l = op.label;
        if (l.find("_fp8") != std::string::npos) ++casts;
        if (l.size() > 11 && l.substr(l.size() - 11) == "_weight_fp8") {
          ++weight_casts;
          EXPECT_EQ(op.microbatch, 0) << layouts::to_string(op);
          EXPECT_EQ(op.phase, layouts::OpPhase::kForward) << layouts::to_string(op);
        }
      }
      const int reruns = recompute == RecomputeGranularity::kFull ? 1 : 0;
      // 2 layers x 4 linears x 2 micro-batches: forward GEMM (again in a full re-run), dgrad, wgrad.
      EXPECT_EQ(fp8_gemms, 2 * 4 * 2 * (3 + reruns));
      EXPECT_EQ(weight_casts, 2 * 4);
      // Per linear and micro-batch: the input (again in a re-run), the output gradient, the transposed input.
      EXPECT_EQ(casts, 2 * 4 + 2 * 4 * 2 * (3 + reruns));
      expect_same_program(r);
    }
  }
}

TEST(EngineOpRecording, Fp8GptLinearsWithBiasesAndGeluMatchTheStepProgram) {
  layouts::Fp8Settings fp8;
  fp8.format = layouts::Fp8Format::kE4M3;
  fp8.recipe = layouts::Fp8Recipe::kTensorwise;
  const Recorded r =
      record(small_gpt(), 1, 2, RecomputeGranularity::kSelective, layouts::kLossChunkLogitsBytes, fp8);
  expect_same_program(r);
}

}  // namespace
}  // namespace megatune::executor
