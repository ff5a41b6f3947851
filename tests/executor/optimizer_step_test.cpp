// One Trainer iteration on the CPU backend (fp32) against AdamW computed by hand from the gradients:
// decoupled weight decay only on 2-D weights, bias correction, global-norm clipping, the word embedding and
// output layer at --decoupled-lr when given; and a non-finite
// gradient skips the update without --check-for-nan-in-loss-and-grad and stops the run with it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "base/user_error.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/trainer.h"

namespace megatune::executor {
namespace {

TrainerConfig small_config(double clip) {
  TrainerConfig c;
  c.model.num_layers = 1;
  c.model.hidden = 16;
  c.model.heads = 2;
  c.model.kv_heads = 1;
  c.model.head_dim = 8;
  c.model.ffn_hidden = 32;
  c.model.vocab_size = 64;
  c.model.max_seq = 8;
  c.batch.micro_batch = 2;
  c.batch.seq = 8;
  c.batch.num_microbatches = 2;
  c.compute_dtype = DType::kFP32;
  c.lr.max_lr = 1e-2;
  c.lr.style = LrDecayStyle::kConstant;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.clip_grad = clip;
  return c;
}

std::vector<MicroBatch> batches(const TrainerConfig& c) {
  std::mt19937 rng(3);
  std::vector<MicroBatch> out(c.batch.num_microbatches);
  for (MicroBatch& mb : out)
    for (std::int64_t t = 0; t < c.batch.micro_batch * c.batch.seq; ++t) {
      mb.tokens.push_back(static_cast<std::int32_t>(rng() % 64));
      mb.labels.push_back(static_cast<std::int32_t>(rng() % 64));
      mb.loss_mask.push_back(1.0f);
    }
  return out;
}

// decoupled_lr: the embedding's and the output layer's rate (Megatron's --decoupled-lr); tied: one table.
void check_step(double clip, std::optional<double> decoupled_lr = {}, bool tied = true) {
  TrainerConfig config = small_config(clip);
  config.lr.decoupled_max_lr = decoupled_lr;
  config.model.tied_embeddings = tied;
  CpuBackend backend;
  SingleRankCommunicator communicator(backend);
  Trainer trainer(config, single_stage_schedule(1, 2), backend, communicator);
  const std::vector<MicroBatch> data = batches(config);
  // Gradients of this iteration, computed by the model alone.
  GPTModel& model = trainer.model();
  const std::vector<float> before = model.main_parameters();
  model.zero_gradients();
  for (int i = 0; i < 2; ++i) {
    model.forward(data[i], i);
    model.backward(i);
  }
  const std::vector<float> grads = model.gradients();
  double sum_squares = 0;
  for (const ParameterEntry& e : model.layout().entries())
    for (std::int64_t j = 0; j < e.numel(); ++j)
      sum_squares += double(grads[e.offset + j]) * grads[e.offset + j];
  const double norm = std::sqrt(sum_squares);
  const double coeff = clip > 0 ? std::min(1.0, clip / (norm + 1e-6)) : 1.0;

  const StepResult result = trainer.train_step(data);
  EXPECT_FALSE(result.skipped);
  EXPECT_NEAR(result.grad_norm, norm, 1e-5 * norm);
  EXPECT_DOUBLE_EQ(result.learning_rate, 1e-2);  // Megatron logs the default group's rate
  const std::vector<float> after = model.main_parameters();
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int checked_decay = 0, checked_no_decay = 0, checked_decoupled = 0;
  for (const ParameterEntry& e : model.layout().entries()) {
    const bool decoupled =
        decoupled_lr && (e.name == "embedding.word_embeddings.weight" || e.name == "output_layer.weight");
    checked_decoupled += decoupled;
    const double lr = decoupled ? *decoupled_lr : 1e-2;
    const double wd = e.weight_decay ? 0.1 : 0.0;
    (e.weight_decay ? checked_decay : checked_no_decay)++;
    for (std::int64_t j = 0; j < e.numel(); j += 7) {
      const std::int64_t i = e.offset + j;
      const double g = grads[i] * coeff;
      const double m = (1 - b1) * g, v = (1 - b2) * g * g;
      double p = before[i] * (1 - lr * wd);
      p -= lr * (m / (1 - b1)) / (std::sqrt(v / (1 - b2)) + eps);
      EXPECT_NEAR(after[i], p, 2e-6 + 1e-5 * std::fabs(p)) << e.name << "[" << j << "]";
    }
  }
  EXPECT_GT(checked_decay, 0);
  EXPECT_GT(checked_no_decay, 0);  // norms have no decay
  EXPECT_EQ(checked_decoupled, decoupled_lr ? (tied ? 1 : 2) : 0);
}

TEST(OptimizerStep, MatchesHandComputedAdamW) { check_step(0.0); }

TEST(OptimizerStep, ClipsByTheGlobalNorm) { check_step(0.05); }

TEST(OptimizerStep, DecoupledLrUpdatesTheEmbeddingAndOutputLayerAtTheirOwnRate) {
  check_step(0.05, 3e-2, /*tied=*/true);
  check_step(0.0, 1e-3, /*tied=*/false);
}

TEST(OptimizerStep, NonFiniteGradientsSkipTheIterationWithoutTheCheck) {
  TrainerConfig config = small_config(1.0);
  config.check_for_nan_in_loss_and_grad = false;  // --no-check-for-nan-in-loss-and-grad
  CpuBackend backend;
  SingleRankCommunicator communicator(backend);
  Trainer trainer(config, single_stage_schedule(1, 2), backend, communicator);
  std::vector<float> params = trainer.model().main_parameters();
  const ParameterEntry& fc2 = trainer.model().layout().find("decoder.layers.0.mlp.linear_fc2.weight");
  params[fc2.offset] = std::numeric_limits<float>::infinity();
  trainer.model().set_main_parameters(params);
  const StepResult result = trainer.train_step(batches(config));
  EXPECT_TRUE(result.skipped);
  EXPECT_EQ(trainer.skipped_iterations(), 1);
  EXPECT_EQ(trainer.iteration(), 1);
  const std::vector<float> after = trainer.model().main_parameters();
  const ParameterEntry& qkv =
      trainer.model().layout().find("decoder.layers.0.self_attention.linear_qkv.weight");
  for (std::int64_t j = 0; j < qkv.numel(); ++j) ASSERT_EQ(after[qkv.offset + j], params[qkv.offset + j]);
}

// --check-for-nan-in-loss-and-grad, Megatron's default: the same step stops the run, naming iteration and
// rank, before any update.
TEST(OptimizerStep, NonFiniteGradientsStopTheRunByDefault) {
  const TrainerConfig config = small_config(1.0);
  CpuBackend backend;
  SingleRankCommunicator communicator(backend);
  Trainer trainer(config, single_stage_schedule(1, 2), backend, communicator);
  std::vector<float> params = trainer.model().main_parameters();
  params[trainer.model().layout().find("decoder.layers.0.mlp.linear_fc2.weight").offset] =
      std::numeric_limits<float>::infinity();
  trainer.model().set_main_parameters(params);
  std::string message;
  try {
    trainer.train_step(batches(config));
  } catch (const UserError& e) {
    message = e.what();
  }
  EXPECT_EQ(message.find("iteration 1: the gradient norm is "), 0u) << message;
  EXPECT_NE(message.find("(first non-finite on rank 0 of 1)"), std::string::npos) << message;
  EXPECT_NE(message.find("--no-check-for-nan-in-loss-and-grad"), std::string::npos) << message;
  EXPECT_EQ(trainer.model().main_parameters(), params);  // no update
}

}  // namespace
}  // namespace megatune::executor
