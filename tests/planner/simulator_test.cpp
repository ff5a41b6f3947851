// Simulator against closed forms: pipeline bubbles of 1F1B and interleaved 1F1B with equal stages and free
// communication, ring all-reduce time and its gradient dtype, overlap of gradient reduction, and the trace
// format.
#include "planner/simulator.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <vector>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "cost_models/json_value.h"

namespace megatune::planner {
namespace {

using layouts::Op;
using layouts::OpKind;

// Test double: every op inside a decoder layer costs `per_op_s` (so every layer costs the same);
// embedding, loss, optimizer and communication are free unless `ring_bandwidth` prices collectives.
class StubPricer : public OpPricer {
 public:
  double per_op_s = 1e-3;
  double ring_bandwidth_bytes_per_s = 0;  // > 0: all-reduce costs 2(n-1)/n * S / B
  cost_models::OpCost price(const Op& op, const cost_models::CollectiveGroup& group) const override {
    cost_models::OpCost c;
    if (op.is_communication()) {
      if (ring_bandwidth_bytes_per_s > 0 && op.kind == OpKind::kAllReduce && group.size > 1)
        c.time_s = 2.0 * (group.size - 1) / group.size * op.bytes / ring_bandwidth_bytes_per_s;
      return c;
    }
    c.time_s = op.layer >= 0 ? per_op_s : 0.0;
    return c;
  }
  int gpus_per_node() const override { return 8; }
  double peak_bf16_tflops() const override { return 989.4; }
  std::int64_t memory_capacity_bytes() const override { return 80LL << 30; }
};

layouts::ModelSpec model_with_layers(int layers) {
  layouts::ModelSpec m = layouts::model_preset("tiny");
  m.num_layers = layers;
  return m;
}

layouts::ParallelConfig pipeline(int pp, int m, int layers_per_virtual_stage = 0) {
  layouts::ParallelConfig c;
  c.world_size = pp;
  c.pipeline_model_parallel_size = pp;
  c.global_batch_size = m;
  c.micro_batch_size = 1;
  c.num_layers_per_virtual_pipeline_stage = layers_per_virtual_stage;
  return c;
}

class Bubble : public ::testing::TestWithParam<SimulationGranularity> {};

TEST_P(Bubble, OneForwardOneBackwardMatchesClosedForm) {
  StubPricer pricer;
  for (auto [p, m] : {std::pair{4, 8}, std::pair{2, 6}, std::pair{8, 16}}) {
    layouts::ModelSpec model = model_with_layers(2 * p);
    layouts::ParallelConfig config = pipeline(p, m);
    config.validate(model);
    SimulationOptions options;
    options.granularity = GetParam();
    SimulationResult r = simulate(model, config, pricer, options);
    EXPECT_NEAR(r.bubble_fraction, (p - 1.0) / m, 1e-9) << "p=" << p << " m=" << m;
    // Step = (m + p - 1) * (forward + backward of one stage).
    const double stage_s = r.stages[0].compute_s / m;
    EXPECT_NEAR(r.step_time_s, (m + p - 1) * stage_s, 1e-9);
  }
}

TEST_P(Bubble, InterleavedMatchesClosedForm) {
  StubPricer pricer;
  for (auto [p, v, m] : {std::tuple{4, 2, 8}, std::tuple{4, 4, 8}, std::tuple{3, 2, 6}}) {
    layouts::ModelSpec model = model_with_layers(p * v);
    layouts::ParallelConfig config = pipeline(p, m, 1);
    config.validate(model);
    SimulationOptions options;
    options.granularity = GetParam();
    SimulationResult r = simulate(model, config, pricer, options);
    EXPECT_NEAR(r.bubble_fraction, (p - 1.0) / (v * m), 1e-9) << "p=" << p << " v=" << v << " m=" << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Granularity, Bubble,
                         ::testing::Values(SimulationGranularity::kPass, SimulationGranularity::kKernel));

TEST(Simulator, RingAllReduceOfGradientsCosts2NMinus1OverNSOverB) {
  StubPricer pricer;
  pricer.per_op_s = 0.0;
  pricer.ring_bandwidth_bytes_per_s = 100e9;
  layouts::ModelSpec model = layouts::model_preset("llama3-1b");
  for (int n : {2, 4, 8}) {
    layouts::ParallelConfig config;
    config.world_size = n;
    config.global_batch_size = n;
    config.validate(model);
    SimulationResult r = simulate(model, config, pricer);
    const double bytes = 4.0 * model.parameter_counts(1).total;  // fp32 grads, one bucket
    EXPECT_NEAR(r.step_time_s, 2.0 * (n - 1) / n * bytes / 100e9, 1e-9) << n;
    EXPECT_NEAR(r.exposed_comm_s, r.step_time_s, 1e-12);
  }
}

TEST(Simulator, GradReduceInBf16HalvesTheReducedBytes) {
  StubPricer pricer;
  pricer.per_op_s = 0.0;
  pricer.ring_bandwidth_bytes_per_s = 100e9;
  const layouts::ModelSpec model = layouts::model_preset("llama3-1b");
  layouts::ParallelConfig config;
  config.world_size = 4;
  config.global_batch_size = 4;
  config.validate(model);
  const double ring_s = 2.0 * 3 / 4 * model.parameter_counts(1).total / 100e9;  // per byte of gradient
  SimulationOptions fp32_grads;  // Megatron's default for bf16 training: fp32 main-grad buffers
  EXPECT_NEAR(simulate(model, config, pricer, fp32_grads).exposed_comm_s, 4 * ring_s, 1e-9);
  SimulationOptions bf16_grads;
  bf16_grads.step.grad_reduce_in_bf16 = true;  // --grad-reduce-in-bf16
  EXPECT_NEAR(simulate(model, config, pricer, bf16_grads).exposed_comm_s, 2 * ring_s, 1e-9);
}

TEST(Simulator, CostModelPricesIntraNodeAllReduceAsRing) {
  cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("1x8xH100");
  auto cost_model = cost_models::CostModel::from_embedded(cluster);
  CostModelPricer pricer(*cost_model);
  Op op;
  op.kind = OpKind::kAllReduce;
  op.bytes = 1LL << 30;
  op.group = layouts::CommGroup::kData;
  op.group_size = 8;
  const double bus = cost_model->collective_model().intra_node_bus_bandwidth_bytes_per_s();
  const double latency = cost_model->collective_model().intra_node_latency_s();
  EXPECT_NEAR(pricer.price(op, {8, 1}).time_s, latency + 2.0 * 7 / 8 * op.bytes / bus, 1e-9);
}

TEST(Simulator, OverlappedGradientReductionHidesBehindBackward) {
  StubPricer pricer;
  pricer.ring_bandwidth_bytes_per_s = 2e9;
  layouts::ModelSpec model = model_with_layers(8);
  model.hidden_size = 512;
  model.ffn_hidden_size = 1024;
  layouts::ParallelConfig config;
  config.world_size = 4;
  config.global_batch_size = 8;
  config.validate(model);
  SimulationResult plain = simulate(model, config, pricer);
  config.overlap_grad_reduce = true;
  layouts::StepProgramOptions step;
  step.bucket_size_elements = 1;  // one bucket per layer
  SimulationOptions options;
  options.step = step;
  SimulationResult overlapped = simulate(model, config, pricer, options);
  EXPECT_GT(plain.exposed_comm_s, 0.0);
  EXPECT_LT(overlapped.exposed_comm_s, plain.exposed_comm_s);
  EXPECT_LT(overlapped.step_time_s, plain.step_time_s);
  // Kernel level agrees with the pass level.
  options.granularity = SimulationGranularity::kKernel;
  SimulationResult kernel = simulate(model, config, pricer, options);
  EXPECT_NEAR(kernel.step_time_s, overlapped.step_time_s, 1e-9);
}

TEST(Simulator, AllRanksReplayMatchesRepresentatives) {
  StubPricer pricer;
  pricer.ring_bandwidth_bytes_per_s = 50e9;
  layouts::ModelSpec model = model_with_layers(4);
  layouts::ParallelConfig config = pipeline(2, 4);
  config.world_size = 8;
  config.tensor_model_parallel_size = 2;
  config.global_batch_size = 8;
  config.validate(model);
  SimulationOptions reps;
  reps.granularity = SimulationGranularity::kKernel;
  SimulationOptions all = reps;
  all.all_ranks = true;
  SimulationResult a = simulate(model, config, pricer, reps);
  SimulationResult b = simulate(model, config, pricer, all);
  EXPECT_EQ(a.simulated_ranks, 2);
  EXPECT_EQ(b.simulated_ranks, 8);
  EXPECT_NEAR(a.step_time_s, b.step_time_s, 1e-12);
}

TEST(Simulator, TraceIsValidJsonWithOnePidPerRank) {
  StubPricer pricer;
  layouts::ModelSpec model = model_with_layers(4);
  layouts::ParallelConfig config = pipeline(2, 4);
  config.world_size = 4;
  config.global_batch_size = 8;
  config.validate(model);
  SimulationOptions options;
  options.all_ranks = true;
  options.record_trace = true;
  SimulationResult r = simulate(model, config, pricer, options);
  std::ostringstream out;
  write_chrome_trace(out, r.trace_processes, r.trace_events);
  cost_models::JsonValue json = cost_models::JsonValue::parse(out.str());
  std::set<std::int64_t> pids;
  int complete = 0;
  for (const auto& event : json.at("traceEvents").as_array()) {
    if (event.at("ph").as_string() != "X") continue;
    ++complete;
    pids.insert(event.at("pid").as_int64());
    EXPECT_GE(event.at("dur").as_number(), 0.0);
    EXPECT_TRUE(event.at("args").at("op").is_string());
  }
  EXPECT_GT(complete, 100);
  EXPECT_EQ(pids, (std::set<std::int64_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace megatune::planner

namespace megatune::planner {
namespace {

// The exposed communication of the critical stage splits by what it moved and adds up to the whole: TP
// collectives under tensor parallelism, the ring under context parallelism, expert dispatch under expert
// parallelism, and the gradient reduction of an unoverlapped data-parallel run, each only where it exists.
TEST(Simulator, ExposedCommunicationSplitsByWhatItMovesAndAddsUp) {
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("2x8xH100");
  auto cost_model = cost_models::CostModel::from_embedded(cluster);
  const CostModelPricer pricer(*cost_model);
  struct Case {
    const char* model;
    int tp, cp, ep, pp;
    CommCategory present;
    std::vector<CommCategory> absent;
  };
  const std::vector<Case> cases = {
      {"llama3-1b", 8, 1, 1, 1, CommCategory::kTensor, {CommCategory::kContext, CommCategory::kExpert}},
      {"llama3-1b", 1, 8, 1, 1, CommCategory::kContext, {CommCategory::kTensor, CommCategory::kExpert}},
      {"mixtral-small", 1, 1, 8, 1, CommCategory::kExpert, {CommCategory::kTensor, CommCategory::kContext}},
      {"llama3-1b", 1, 1, 1, 2, CommCategory::kData, {CommCategory::kTensor, CommCategory::kExpert}},
  };
  for (const Case& c : cases) {
    layouts::ModelSpec model = layouts::model_preset(c.model);
    model.seq_length = 4096;
    layouts::ParallelConfig config;
    config.world_size = 16;
    config.tensor_model_parallel_size = c.tp;
    config.context_parallel_size = c.cp;
    config.expert_model_parallel_size = c.ep;
    config.pipeline_model_parallel_size = c.pp;
    config.sequence_parallel = c.tp > 1;
    config.global_batch_size = 2 * config.dp();
    config.validate(model);
    const SimulationResult r = simulate(model, config, pricer);
    double sum = 0.0;
    for (double s : r.exposed_comm_by_category) sum += s;
    EXPECT_NEAR(sum, r.exposed_comm_s, 1e-12 * r.exposed_comm_s) << c.model;
    EXPECT_GT(r.exposed_comm_by_category[static_cast<int>(c.present)], 0.0)
        << c.model << " " << comm_category_name(c.present);
    for (CommCategory absent : c.absent)
      EXPECT_EQ(r.exposed_comm_by_category[static_cast<int>(absent)], 0.0)
          << c.model << " " << comm_category_name(absent);
  }
}

}  // namespace
}  // namespace megatune::planner
