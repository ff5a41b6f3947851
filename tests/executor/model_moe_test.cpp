// GPTModel with MoE layers on the CPU backend (float): one expert with top-1 routing is the dense MLP (same
// losses and gradients), and every parameter's gradient of MoE models (softmax and sigmoid routing, shared
// expert, capacity drop, a dense layer among MoE ones) against central finite differences.
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

TransformerConfig dense_model() { return test::gradient_check_model(true); }

TransformerConfig moe_model(std::int64_t experts, int topk, std::int64_t moe_ffn) {
  TransformerConfig c = dense_model();
  c.num_experts = experts;
  c.moe_ffn_hidden = moe_ffn;
  c.router.num_experts = experts;
  c.router.topk = topk;
  c.moe_layers.assign(c.num_layers, 1);
  return c;
}

BatchShape batch_shape() {
  BatchShape shape;
  shape.micro_batch = 2;
  shape.seq = 6;
  shape.num_microbatches = 2;
  return shape;
}

std::vector<MicroBatch> random_batches(const BatchShape& shape, std::int64_t vocab) {
  std::mt19937 rng(5);
  std::vector<MicroBatch> out(static_cast<std::size_t>(shape.num_microbatches));
  for (MicroBatch& mb : out) {
    mb.micro_batch_size = shape.micro_batch;
    mb.sequence_length = shape.seq;
    for (std::int64_t t = 0; t < shape.micro_batch * shape.seq; ++t) {
      mb.tokens.push_back(static_cast<std::int32_t>(rng() % vocab));
      mb.labels.push_back(static_cast<std::int32_t>(rng() % vocab));
      mb.loss_mask.push_back(1.0f);
    }
  }
  return out;
}

struct Model {
  CpuBackend backend;
  SingleRankCommunicator communicator{backend};
  std::unique_ptr<GPTModel> model;
  explicit Model(const TransformerConfig& config,
                 RecomputeGranularity recompute = RecomputeGranularity::kNone) {
    backend.begin_sizing();
    { GPTModel sizing(config, batch_shape(), recompute, DType::kFP32, backend, communicator); }
    backend.reserve_arena(backend.end_sizing());
    model = std::make_unique<GPTModel>(config, batch_shape(), recompute, DType::kFP32, backend, communicator);
    model->initialize_parameters(7);
  }
  // One iteration's forwards and backwards; the mean loss.
  double run(const std::vector<MicroBatch>& batches) {
    model->zero_gradients();
    for (int i = 0; i < static_cast<int>(batches.size()); ++i) {
      model->forward(batches[i], i);
      model->backward(i);
    }
    double sum = 0.0;
    for (double l : model->microbatch_losses()) sum += l;
    return sum / static_cast<double>(batches.size());
  }
};

std::vector<float> values_of(const GPTModel& m, const std::vector<float>& buffer, const std::string& name) {
  const ParameterEntry& e = m.layout().find(name);
  return std::vector<float>(buffer.begin() + e.offset, buffer.begin() + e.offset + e.numel());
}

TEST(MoeModel, OneExpertWithTopOneIsTheDenseMlp) {
  Model dense(dense_model());
  Model moe(moe_model(1, 1, dense_model().ffn_hidden));
  // The MoE model gets the dense weights: every shared name, and the dense MLP as its one expert.
  std::vector<float> params = moe.model->main_parameters();
  const std::vector<float> dense_params = dense.model->main_parameters();
  auto expert_name = [](const std::string& dense_name) {
    std::string name = dense_name;
    name.replace(name.find("mlp."), 4, "mlp.experts.local_experts.0.");
    return name;
  };
  for (const ParameterEntry& e : dense.model->layout().entries()) {
    const bool mlp = e.name.find(".mlp.linear_fc") != std::string::npos;
    const ParameterEntry& target = moe.model->layout().find(mlp ? expert_name(e.name) : e.name);
    ASSERT_EQ(target.numel(), e.numel()) << e.name;
    std::copy(dense_params.begin() + e.offset, dense_params.begin() + e.offset + e.numel(),
              params.begin() + target.offset);
  }
  moe.model->set_main_parameters(params);
  const std::vector<MicroBatch> batches = random_batches(batch_shape(), 32);
  const double dense_loss = dense.run(batches), moe_loss = moe.run(batches);
  EXPECT_NEAR(moe_loss, dense_loss, 1e-6 * dense_loss);
  const std::vector<float> dense_grads = dense.model->gradients(), moe_grads = moe.model->gradients();
  for (const ParameterEntry& e : dense.model->layout().entries()) {
    const bool mlp = e.name.find(".mlp.linear_fc") != std::string::npos;
    const std::vector<float> expected = values_of(*dense.model, dense_grads, e.name);
    const std::vector<float> got = values_of(*moe.model, moe_grads, mlp ? expert_name(e.name) : e.name);
    for (std::size_t j = 0; j < expected.size(); ++j)
      ASSERT_NEAR(got[j], expected[j], 1e-6f + 1e-4f * std::fabs(expected[j])) << e.name << "[" << j << "]";
  }
  // One expert: its probability is 1 whatever the logits, so the router learns nothing.
  for (float g : values_of(*moe.model, moe_grads, "decoder.layers.0.mlp.router.weight")) EXPECT_EQ(g, 0.0f);
}

// The routing of every MoE layer's last forward (micro-batch slot 0).
std::vector<std::vector<std::int32_t>> routings(const GPTModel& m) {
  std::vector<std::vector<std::int32_t>> out;
  const MoeLayers* moe = m.moe_layers();
  for (int l = 0; l < m.config().num_layers; ++l)
    if (m.config().is_moe_layer(l)) {
      const MoeRouting& r = moe->routing(0, static_cast<int>(out.size()));
      std::vector<std::int32_t> choice = r.expert;
      for (std::size_t i = 0; i < choice.size(); ++i)
        if (!r.kept[i]) choice[i] = -1 - choice[i];
      out.push_back(choice);
    }
  return out;
}

double evaluated_loss(GPTModel& m, const std::vector<MicroBatch>& batches,
                      std::vector<std::vector<std::vector<std::int32_t>>>* routing) {
  double sum = 0.0;
  for (const MicroBatch& mb : batches) {
    sum += m.evaluate(mb);
    if (routing) routing->push_back(routings(m));
  }
  return sum / static_cast<double>(batches.size());
}

// Central differences on three elements of every parameter tensor, skipping a probe whose perturbation
// changes a routing decision (the loss is only piecewise smooth in the router's weights).
void check_gradients(const TransformerConfig& config, RecomputeGranularity recompute) {
  Model h(config, recompute);
  GPTModel& model = *h.model;
  const std::vector<MicroBatch> batches = random_batches(batch_shape(), config.vocab_size);
  h.run(batches);
  const std::vector<float> analytic = model.gradients();
  std::vector<float> params = model.main_parameters();
  std::vector<std::vector<std::vector<std::int32_t>>> reference;
  evaluated_loss(model, batches, &reference);
  const float step = 1e-2f;
  std::mt19937 rng(11);
  int compared = 0, probes = 0;
  for (const ParameterEntry& entry : model.layout().entries()) {
    double max_abs = 0;
    for (std::int64_t j = 0; j < entry.numel(); ++j)
      max_abs = std::max(max_abs, std::fabs(double(analytic[entry.offset + j])));
    ASSERT_GT(max_abs, 0.0) << entry.name << " received no gradient";
    for (int probe = 0; probe < 3; ++probe, ++probes) {
      const std::int64_t index = entry.offset + static_cast<std::int64_t>(rng() % entry.numel());
      const float saved = params[index];
      std::vector<std::vector<std::vector<std::int32_t>>> plus_routing, minus_routing;
      params[index] = saved + step;
      model.set_main_parameters(params);
      const double plus = evaluated_loss(model, batches, &plus_routing);
      params[index] = saved - step;
      model.set_main_parameters(params);
      const double minus = evaluated_loss(model, batches, &minus_routing);
      params[index] = saved;
      if (plus_routing != reference || minus_routing != reference) continue;
      const double numeric = (plus - minus) / (2.0 * step);
      EXPECT_NEAR(numeric, analytic[index], 2e-4 + 0.01 * max_abs)
          << entry.name << " element " << index - entry.offset;
      ++compared;
    }
  }
  EXPECT_GT(compared, probes * 3 / 4);
  model.set_main_parameters(params);
}

TEST(MoeModel, SoftmaxTopTwoWithSharedExpertMatchesFiniteDifferences) {
  TransformerConfig c = moe_model(4, 2, 8);
  c.shared_expert_ffn = 12;
  check_gradients(c, RecomputeGranularity::kNone);
}

TEST(MoeModel, PreSoftmaxGeluWithADenseLayerMatchesFiniteDifferences) {
  TransformerConfig c = moe_model(4, 2, 8);
  c.activation = ActivationKind::kGelu;
  c.router.pre_softmax = true;
  c.moe_layers = {0, 1};
  check_gradients(c, RecomputeGranularity::kSelective);
}

TEST(MoeModel, SigmoidTopThreeUnderFullRecomputeMatchesFiniteDifferences) {
  TransformerConfig c = moe_model(6, 3, 8);
  c.router.score_function = RouterScoreFunction::kSigmoid;
  c.shared_expert_ffn = 8;
  check_gradients(c, RecomputeGranularity::kFull);
}

TEST(MoeModel, CapacityDropMatchesFiniteDifferences) {
  TransformerConfig c = moe_model(4, 2, 8);
  c.router.capacity_factor = 0.75;  // capacity ceil(12 * 2 / 4 * 0.75) = 5 of 6 expected rows
  Model probe(c);
  probe.run(random_batches(batch_shape(), c.vocab_size));
  std::int64_t dropped = 0;
  for (std::uint8_t kept : probe.model->moe_layers()->routing(0, 0).kept) dropped += kept ? 0 : 1;
  EXPECT_GT(dropped, 0);  // the capacity bites
  check_gradients(c, RecomputeGranularity::kNone);
}

// --moe-pad-expert-input-to-capacity: every expert computes exactly its capacity of rows, and the padding
// carries no weight: the loss and every gradient are the unpadded capacity model's.
TEST(MoeModel, PaddingToTheCapacityChangesNeitherLossNorGradients) {
  TransformerConfig c = moe_model(4, 2, 8);
  c.router.capacity_factor = 1.5;  // capacity ceil(12 * 2 / 4 * 1.5) = 9 rows per expert
  TransformerConfig padded = c;
  padded.router.pad_to_capacity = true;
  Model plain_model(c), padded_model(padded);
  padded_model.model->set_main_parameters(plain_model.model->main_parameters());
  const std::vector<MicroBatch> batches = random_batches(batch_shape(), c.vocab_size);
  const double plain_loss = plain_model.run(batches), padded_loss = padded_model.run(batches);
  EXPECT_NEAR(padded_loss, plain_loss, 1e-6 * plain_loss);
  const std::vector<float> plain_grads = plain_model.model->gradients(),
                           padded_grads = padded_model.model->gradients();
  ASSERT_EQ(plain_grads.size(), padded_grads.size());
  for (std::size_t i = 0; i < plain_grads.size(); ++i)
    ASSERT_NEAR(padded_grads[i], plain_grads[i], 1e-6f + 1e-5f * std::fabs(plain_grads[i])) << i;
  const MoeLayers& moe = *padded_model.model->moe_layers();
  EXPECT_EQ(moe.expert_rows().capacity_rows(), 4 * 9);  // every expert its capacity, from the start
  EXPECT_EQ(moe.expert_rows().growths(), 0);
}

}  // namespace
}  // namespace megatune::executor
