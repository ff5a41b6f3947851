// GPTModel on the CPU backend (float): every parameter tensor's gradient against central finite differences,
// for GPT (LayerNorm, GELU, learned positions, tied head, biases) and Llama (RMSNorm, SwiGLU, RoPE, GQA,
// untied head, no biases) and DeepSeek-V3 (multi-latent attention, multi-token prediction) shapes, with
// --qk-layernorm's head norms, with and without recomputation.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>

#include "executor/cpu/cpu_backend.h"
#include "executor/model/gpt_model.h"
#include "executor/parallel/communicator.h"
#include "tests/executor/small_models.h"

namespace megatune::executor {
namespace {

TransformerConfig gpt_like() { return test::gradient_check_model(false); }
TransformerConfig llama_like() { return test::gradient_check_model(true); }

// Multi-latent attention: q/k heads of 6 + 4 (decoupled RoPE), v heads of 4; q_lora_rank 0 is one query
// projection.
TransformerConfig mla_like(std::int64_t q_lora_rank) {
  TransformerConfig c = llama_like();
  c.heads = 2;
  c.kv_heads = 2;
  c.mla = true;
  c.q_lora_rank = q_lora_rank;
  c.kv_lora_rank = 8;
  c.qk_head_dim = 6;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 4;
  c.head_dim = 10;
  return c;
}

MicroBatch random_batch(const BatchShape& shape, std::int64_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  MicroBatch mb;
  mb.micro_batch_size = shape.micro_batch;
  mb.sequence_length = shape.seq;
  for (std::int64_t t = 0; t < shape.micro_batch * shape.seq; ++t) {
    mb.tokens.push_back(static_cast<std::int32_t>(rng() % vocab));
    mb.labels.push_back(static_cast<std::int32_t>(rng() % vocab));
    mb.loss_mask.push_back(t % 5 == 3 ? 0.0f : 1.0f);
  }
  return mb;
}

struct Harness {
  CpuBackend backend;
  SingleRankCommunicator communicator{backend};
  std::unique_ptr<GPTModel> model;
  Harness(const TransformerConfig& config, const BatchShape& batch,
          const layouts::RecomputeSettings& recompute) {
    backend.begin_sizing();
    { GPTModel sizing(config, batch, recompute, DType::kFP32, backend, communicator); }
    backend.reserve_arena(backend.end_sizing());
    model = std::make_unique<GPTModel>(config, batch, recompute, DType::kFP32, backend, communicator);
    model->initialize_parameters(7);
  }
};

// Loss of the whole iteration: mean over micro-batches of each micro-batch's mean token loss, plus with MTP
// Megatron's mtp_loss_scaling_factor / mtp_num_layers times each MTP layer's loss so averaged.
double iteration_loss(GPTModel& model, const std::vector<MicroBatch>& batches) {
  double total = 0;
  if (model.config().mtp_num_layers == 0) {
    for (const MicroBatch& mb : batches) total += model.evaluate(mb);
    return total / static_cast<double>(batches.size());
  }
  for (int i = 0; i < static_cast<int>(batches.size()); ++i) model.forward_only(batches[i], i);
  for (double loss : model.microbatch_losses()) total += loss / static_cast<double>(batches.size());
  const TransformerConfig& c = model.config();
  for (double loss : model.mtp_losses()) total += c.mtp_loss_scaling_factor / c.mtp_num_layers * loss;
  return total;
}

void check_gradients(const TransformerConfig& config, RecomputeGranularity recompute,
                     std::int64_t loss_chunk_logits_bytes = layouts::kLossChunkLogitsBytes) {
  BatchShape shape;
  shape.micro_batch = 2;
  shape.seq = 6;
  shape.num_microbatches = 2;
  shape.loss_chunk_logits_bytes = loss_chunk_logits_bytes;
  Harness h(config, shape, recompute);
  GPTModel& model = *h.model;
  std::vector<MicroBatch> batches = {random_batch(shape, config.vocab_size, 1),
                                     random_batch(shape, config.vocab_size, 2)};
  model.zero_gradients();
  for (int i = 0; i < shape.num_microbatches; ++i) {
    model.forward(batches[i], i);
    model.backward(i);
  }
  const std::vector<float> analytic = model.gradients();
  std::vector<float> params = model.main_parameters();
  const float step = 1e-2f;
  std::mt19937 rng(11);
  for (const ParameterEntry& entry : model.layout().entries()) {
    double max_abs = 0;
    for (std::int64_t j = 0; j < entry.numel(); ++j)
      max_abs = std::max(max_abs, std::fabs(double(analytic[entry.offset + j])));
    ASSERT_GT(max_abs, 0.0) << entry.name << " received no gradient";
    for (int probe = 0; probe < 3; ++probe) {
      const std::int64_t index = entry.offset + static_cast<std::int64_t>(rng() % entry.numel());
      const float saved = params[index];
      params[index] = saved + step;
      model.set_main_parameters(params);
      const double plus = iteration_loss(model, batches);
      params[index] = saved - step;
      model.set_main_parameters(params);
      const double minus = iteration_loss(model, batches);
      params[index] = saved;
      const double numeric = (plus - minus) / (2.0 * step);
      EXPECT_NEAR(numeric, analytic[index], 2e-4 + 0.01 * max_abs)
          << entry.name << " element " << index - entry.offset;
    }
  }
  model.set_main_parameters(params);
}

TEST(ModelGradient, GptShapeMatchesFiniteDifferences) {
  check_gradients(gpt_like(), RecomputeGranularity::kNone);
}

TEST(ModelGradient, LlamaShapeMatchesFiniteDifferences) {
  check_gradients(llama_like(), RecomputeGranularity::kNone);
}

TEST(ModelGradient, MultiLatentAttentionMatchesFiniteDifferences) {
  check_gradients(mla_like(6), RecomputeGranularity::kNone);
  check_gradients(mla_like(0), RecomputeGranularity::kSelective);
  TransformerConfig layernorm = mla_like(6);
  layernorm.norm = NormKind::kLayerNorm;  // latent norms with their bias
  check_gradients(layernorm, RecomputeGranularity::kFull);
}

// --qk-layernorm's head norms after the QKV projection: RMSNorm on the Llama shape (GQA, RoPE after the
// norms), LayerNorm with its biases on the GPT shape, with full and selective recomputation.
TEST(ModelGradient, QkLayernormMatchesFiniteDifferences) {
  TransformerConfig llama = llama_like(), gpt = gpt_like();
  llama.qk_layernorm = gpt.qk_layernorm = true;
  check_gradients(llama, RecomputeGranularity::kNone);
  check_gradients(gpt, RecomputeGranularity::kFull);
  check_gradients(llama, RecomputeGranularity::kSelective);
}

// YaRN on the rotary parts (--rotary-scaling-factor 40; mscale_all_dim 0.5 so that both the cos/sin factor
// and the softmax scale differ from 1): the ramp blends the rotary dimension's second pair.
TEST(ModelGradient, MultiLatentAttentionWithYarnMatchesFiniteDifferences) {
  TransformerConfig yarn = mla_like(6);
  yarn.yarn.factor = 40.0;
  yarn.yarn.mscale = 1.0;
  yarn.yarn.mscale_all_dim = 0.5;
  check_gradients(yarn, RecomputeGranularity::kNone);
}

// Multi-token prediction (two MTP layers, so the second feeds on the first's output) on the MLA body and on
// a GPT body (learned positions rolled with the tokens, tied head); a large scaling factor makes the MTP
// gradients count against the tolerance.
TEST(ModelGradient, MultiTokenPredictionMatchesFiniteDifferences) {
  TransformerConfig mla = mla_like(6);
  mla.mtp_num_layers = 2;
  mla.mtp_loss_scaling_factor = 0.8f;
  check_gradients(mla, RecomputeGranularity::kNone);
  TransformerConfig gpt = gpt_like();
  gpt.mtp_num_layers = 1;
  gpt.mtp_loss_scaling_factor = 1.0f;
  check_gradients(gpt, RecomputeGranularity::kFull, 200);
}

// 12 tokens x 32 vocab x 2 bytes = 768 bytes of logits: a 200-byte budget runs the LM head and the loss in 4
// chunks of 3 tokens (its backward GEMMs accumulate per chunk).
TEST(ModelGradient, ChunkedLossMatchesFiniteDifferences) {
  check_gradients(gpt_like(), RecomputeGranularity::kNone, 200);
  TransformerConfig untied = llama_like();
  check_gradients(untied, RecomputeGranularity::kSelective, 200);
}

TEST(ModelGradient, ChunkedLossGivesTheSameLossAndGradients) {
  BatchShape shape;
  shape.micro_batch = 2;
  shape.seq = 6;
  std::vector<float> reference;
  double reference_loss = 0;
  for (std::int64_t chunk_bytes : {layouts::kLossChunkLogitsBytes, std::int64_t(200), std::int64_t(64)}) {
    shape.loss_chunk_logits_bytes = chunk_bytes;
    Harness h(gpt_like(), shape, RecomputeGranularity::kNone);
    const MicroBatch mb = random_batch(shape, 32, 9);
    h.model->zero_gradients();
    h.model->forward(mb, 0);
    h.model->backward(0);
    const double loss = h.model->microbatch_losses()[0];
    const std::vector<float> grads = h.model->gradients();
    if (reference.empty()) {
      reference = grads;
      reference_loss = loss;
      continue;
    }
    EXPECT_NEAR(loss, reference_loss, 1e-6 * reference_loss) << chunk_bytes;  // GEMM kernels vary with m
    ASSERT_EQ(grads.size(), reference.size());
    for (std::size_t i = 0; i < grads.size(); ++i)  // only the head's wgrad summation order differs
      ASSERT_NEAR(grads[i], reference[i], 1e-6f + 1e-5f * std::fabs(reference[i])) << "element " << i;
  }
}

TEST(ModelGradient, RecomputationGivesTheSameGradients) {
  BatchShape shape;
  shape.micro_batch = 2;
  shape.seq = 6;
  std::vector<float> reference;
  for (RecomputeGranularity recompute :
       {RecomputeGranularity::kNone, RecomputeGranularity::kSelective, RecomputeGranularity::kFull}) {
    Harness h(llama_like(), shape, recompute);
    MicroBatch mb = random_batch(shape, 32, 5);
    h.model->zero_gradients();
    h.model->forward(mb, 0);
    h.model->backward(0);
    std::vector<float> grads = h.model->gradients();
    if (reference.empty()) {
      reference = grads;
      continue;
    }
    ASSERT_EQ(grads.size(), reference.size());
    for (std::size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], reference[i]) << "element " << i;
  }
}

// Partial full recomputation (uniform groups, block's first layers) re-runs only the plan's layers, unit by
// unit, through shared sets and inner-layer inputs: with two micro-batches in flight the gradients are still
// bit-equal to those without recomputation.
TEST(ModelGradient, PartialFullRecomputationGivesTheSameGradients) {
  TransformerConfig config = llama_like();
  config.num_layers = 4;
  BatchShape shape;
  shape.micro_batch = 2;
  shape.seq = 6;
  shape.num_microbatches = 2;
  shape.activation_slots = 2;
  using layouts::RecomputeMethod;
  const RecomputeGranularity kFull = RecomputeGranularity::kFull;
  std::vector<float> reference;
  for (const layouts::RecomputeSettings& recompute :
       {layouts::RecomputeSettings{}, layouts::RecomputeSettings{kFull, RecomputeMethod::kUniform, 2},
        layouts::RecomputeSettings{kFull, RecomputeMethod::kUniform, 3},
        layouts::RecomputeSettings{kFull, RecomputeMethod::kBlock, 1},
        layouts::RecomputeSettings{kFull, RecomputeMethod::kBlock, 3}}) {
    SCOPED_TRACE(std::string(layouts::to_string(recompute.method)) + " " +
                 std::to_string(recompute.num_layers));
    Harness h(config, shape, recompute);
    const MicroBatch first = random_batch(shape, 32, 5), second = random_batch(shape, 32, 6);
    h.model->zero_gradients();
    h.model->forward(first, 0);
    h.model->forward(second, 1);
    h.model->backward(0);
    h.model->backward(1);
    const std::vector<float> grads = h.model->gradients();
    if (reference.empty()) {
      reference = grads;
      continue;
    }
    ASSERT_EQ(grads.size(), reference.size());
    for (std::size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], reference[i]) << "element " << i;
  }
}

// zero_gradients clears only the non-GEMM ranges; every GEMM weight's first gradient GEMM of the iteration
// overwrites instead of accumulating. A second iteration on the same micro-batches must therefore give
// bit-identical gradients, not the first iteration's plus the second's (tied and untied heads, chunked loss).
TEST(ModelGradient, IterationsDoNotCarryGradientsOver) {
  BatchShape shape;
  shape.micro_batch = 2;
  shape.seq = 6;
  shape.num_microbatches = 2;
  shape.loss_chunk_logits_bytes = 200;
  for (const TransformerConfig& config : {gpt_like(), llama_like()}) {
    Harness h(config, shape, RecomputeGranularity::kNone);
    const std::vector<MicroBatch> batches = {random_batch(shape, config.vocab_size, 21),
                                             random_batch(shape, config.vocab_size, 22)};
    std::vector<float> first;
    for (int iteration = 0; iteration < 2; ++iteration) {
      h.model->zero_gradients();
      for (int i = 0; i < shape.num_microbatches; ++i) {
        h.model->forward(batches[i], i);
        h.model->backward(i);
      }
      const std::vector<float> grads = h.model->gradients();
      if (iteration == 0) {
        first = grads;
        continue;
      }
      ASSERT_EQ(grads.size(), first.size());
      for (std::size_t i = 0; i < grads.size(); ++i) ASSERT_EQ(grads[i], first[i]) << "element " << i;
    }
    // And the first micro-batch alone gives a different (its own) gradient: the second one was added.
    h.model->zero_gradients();
    h.model->forward(batches[0], 0);
    h.model->backward(0);
    const std::vector<float> alone = h.model->gradients();
    const ParameterEntry& fc1 = h.model->layout().find(layer_parameter(0, "mlp.linear_fc1.weight"));
    double diff = 0;
    for (std::int64_t j = 0; j < fc1.numel(); ++j)
      diff = std::max(diff, std::fabs(double(alone[fc1.offset + j]) - double(first[fc1.offset + j])));
    EXPECT_GT(diff, 0.0);
  }
}

TEST(ModelGradient, ForwardBeforeBackwardIsEnforced) {
  BatchShape shape;
  shape.micro_batch = 1;
  shape.seq = 4;
  shape.num_microbatches = 2;
  Harness h(gpt_like(), shape, RecomputeGranularity::kNone);
  MicroBatch mb = random_batch(shape, 32, 3);
  EXPECT_THROW(h.model->backward(0), std::logic_error);
  h.model->forward(mb, 0);
  EXPECT_THROW(h.model->forward(mb, 1), std::logic_error);
}

}  // namespace
}  // namespace megatune::executor
