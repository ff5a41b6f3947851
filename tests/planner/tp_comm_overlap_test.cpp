// --tp-comm-overlap: the exposed part of a chunked TP collective, its pairing with neighbouring GEMMs, and
// the simulator's exposed communication with and without it.
#include "planner/tp_comm_overlap.h"

#include <gtest/gtest.h>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "planner/op_pricer.h"
#include "planner/simulator.h"

namespace megatune::planner {
namespace {

using layouts::Op;
using layouts::OpKind;

Op op_of(OpKind kind) {
  Op op;
  op.kind = kind;
  if (kind == OpKind::kAllGather || kind == OpKind::kReduceScatter) {
    op.role = layouts::OpRole::kTensorParallel;
    op.group = layouts::CommGroup::kTensor;
  }
  return op;
}

TEST(TpCommOverlap, OnlyWhatTheGemmCannotHideIsExposed) {
  // Shorter than its GEMM: one chunk of tp is exposed.
  EXPECT_DOUBLE_EQ(tp_overlap_exposed_s(1e-3, 4e-3, 4), 1e-3 / 4);
  // Longer than its GEMM: the excess plus one chunk of the GEMM.
  EXPECT_DOUBLE_EQ(tp_overlap_exposed_s(4e-3, 1e-3, 4), 3e-3 + 1e-3 / 4);
  EXPECT_DOUBLE_EQ(tp_overlap_exposed_s(2e-3, 1e-3, 1), 2e-3);
}

TEST(TpCommOverlap, AllGatherFeedsTheNextGemmReduceScatterDrainsThePrevious) {
  const std::vector<Op> ops{op_of(OpKind::kAllGather),     op_of(OpKind::kNorm),
                            op_of(OpKind::kGemm),          op_of(OpKind::kGemm),
                            op_of(OpKind::kReduceScatter), op_of(OpKind::kAllReduce),
                            op_of(OpKind::kReduceScatter)};
  const std::vector<double> times_s{1e-3, 1e-4, 2e-3, 3e-3, 1e-3, 5e-4, 1e-3};
  const std::vector<double> kept = tp_overlapped_times_s(ops, times_s, 2);
  EXPECT_DOUBLE_EQ(kept[0], 1e-3 / 2);  // behind the GEMM after the norm
  EXPECT_DOUBLE_EQ(kept[4], 1e-3 / 2);  // behind the GEMM right before it
  EXPECT_DOUBLE_EQ(kept[5], 5e-4);      // not a TP all-gather / reduce-scatter
  EXPECT_DOUBLE_EQ(kept[6], 1e-3);      // a collective before it: no GEMM to hide behind
  for (const int i : {1, 2, 3}) EXPECT_DOUBLE_EQ(kept[i], times_s[i]);
  EXPECT_EQ(tp_overlapped_times_s(ops, times_s, 1), times_s);
}

TEST(TpCommOverlap, LowersTheSimulatedExposedCommunication) {
  const auto cost_model = cost_models::CostModel::from_embedded(cost_models::parse_cluster_spec("1x8xH200"));
  const CostModelPricer pricer(*cost_model);
  const layouts::ModelSpec model = layouts::model_preset("llama3-8b");
  layouts::ParallelConfig config;
  config.world_size = 8;
  config.tensor_model_parallel_size = 8;
  config.sequence_parallel = true;
  config.global_batch_size = 2;
  config.validate(model);
  for (const SimulationGranularity granularity :
       {SimulationGranularity::kPass, SimulationGranularity::kKernel}) {
    SimulationOptions options;
    options.granularity = granularity;
    const SimulationResult blocking = simulate(model, config, pricer, options);
    options.tp_comm_overlap = true;
    const SimulationResult overlapped = simulate(model, config, pricer, options);
    EXPECT_GT(blocking.exposed_comm_s, 0);
    EXPECT_LT(overlapped.exposed_comm_s, 0.7 * blocking.exposed_comm_s);
    EXPECT_LT(overlapped.step_time_s, blocking.step_time_s);
    // The GEMMs themselves take as long as before.
    const int gemm = static_cast<int>(OpKind::kGemm);
    EXPECT_DOUBLE_EQ(overlapped.kind_times[gemm].total_s, blocking.kind_times[gemm].total_s);
  }
}

}  // namespace
}  // namespace megatune::planner
