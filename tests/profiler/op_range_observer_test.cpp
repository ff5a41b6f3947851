// OpRangeObserver over the FakeTracer: one range per op, per-op device busy time from the trace records,
// and, end to end, a CPU-backend `tiny` step whose "device" work (fake kernels launched inside each op) is
// attributed to the right ops and joined to every compute op of the step program.
#include "profiler/op_range_observer.h"

#include <gtest/gtest.h>

#include <random>
#include <stdexcept>

#include "cost_models/cluster_spec.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/trainer.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"
#include "profiler/fake_tracer.h"

namespace megatune::profiler {
namespace {

layouts::Op gemm(std::int64_t m) {
  layouts::Op op;
  op.kind = layouts::OpKind::kGemm;
  op.m = m, op.n = 8, op.k = 8;
  return op;
}

TEST(OpRangeObserver, AttributesEachOpsKernelsToItAndSumsUnionBusyTime) {
  FakeTracer tracer(/*launch_gap_ns=*/100);
  OpRangeObserver observer(tracer);
  tracer.launch("before", 700);  // outside every op
  observer.op_begin(0, gemm(1));
  tracer.launch("a1", 1000);
  tracer.launch("a2", 500);  // busy 1500, the 100 ns gap between them excluded
  observer.op_end();
  observer.op_begin(1, gemm(2));  // launches nothing
  observer.op_end();
  observer.op_begin(2, gemm(3));
  tracer.launch("c", 300, 7, ActivityKind::kMemset);
  EXPECT_EQ(tracer.open_ranges(), 1);
  observer.op_end();
  EXPECT_EQ(tracer.open_ranges(), 0);
  const std::vector<TraceRecord> records = tracer.flush();

  const AttributedOps all = attribute_records(observer, records, 0, 3);
  ASSERT_EQ(all.ops.size(), 3u);
  EXPECT_EQ(all.ops[0].op.m, 1);
  EXPECT_DOUBLE_EQ(all.ops[0].measured_s, 1500e-9);
  EXPECT_DOUBLE_EQ(all.ops[1].measured_s, 0.0);
  EXPECT_DOUBLE_EQ(all.ops[2].measured_s, 300e-9);
  EXPECT_EQ(all.ops_without_activity, 1);
  EXPECT_DOUBLE_EQ(all.attributed_s, 1800e-9);
  EXPECT_DOUBLE_EQ(all.unattributed_s, 700e-9);

  const AttributedOps tail = attribute_records(observer, records, 2, 1);
  ASSERT_EQ(tail.ops.size(), 1u);
  EXPECT_EQ(tail.ops[0].op.m, 3);
  EXPECT_DOUBLE_EQ(tail.attributed_s, 300e-9);
  EXPECT_THROW(attribute_records(observer, records, 2, 2), std::out_of_range);
}

TEST(OpRangeObserver, LastIterationEndsAtTheGradNormOrAdamWAfterThePreviousGradNorm) {
  layouts::Op norm;
  norm.kind = layouts::OpKind::kGradNorm;
  layouts::Op adamw;
  adamw.kind = layouts::OpKind::kOptimizer;
  // Iteration 1 (AdamW applied), iteration 2 (skipped: no AdamW), iteration 3.
  const std::vector<layouts::Op> ops = {gemm(1), norm, adamw, gemm(2), norm, gemm(3), gemm(4), norm, adamw};
  const OpSlice last = last_iteration(ops);
  EXPECT_EQ(last.first, 5u);
  EXPECT_EQ(last.count, 4u);
  const OpSlice only = last_iteration({gemm(1), norm, adamw});
  EXPECT_EQ(only.first, 0u);
  EXPECT_EQ(only.count, 3u);
}

TEST(OpRangeObserver, RejectsUnbalancedOrOutOfOrderCalls) {
  FakeTracer tracer;
  OpRangeObserver observer(tracer);
  EXPECT_THROW(observer.op_end(), std::logic_error);
  EXPECT_THROW(observer.op_begin(1, gemm(1)), std::logic_error);  // index must follow the ops seen
  observer.op_begin(0, gemm(1));
  EXPECT_THROW(observer.op_begin(1, gemm(1)), std::logic_error);  // nested
  observer.op_end();
  EXPECT_EQ(observer.ops().size(), 1u);
  EXPECT_EQ(OpRangeObserver::external_id(0), 1u);
}

// Stands in for the device: each op's work becomes fake kernels whose duration encodes the op's index.
class FakeDeviceObserver : public executor::Backend::OpObserver {
 public:
  FakeDeviceObserver(OpRangeObserver& ranges, FakeTracer& tracer) : ranges_(ranges), tracer_(tracer) {}
  void op_begin(std::size_t op_index, const layouts::Op& op) override {
    ranges_.op_begin(op_index, op);
    tracer_.launch("k", 1000 + op_index);
    if (op.kind == layouts::OpKind::kGemm) tracer_.launch("k2", 5);  // a second kernel in a GEMM
  }
  void op_end() override {
    ranges_.op_end();
    tracer_.launch("between", 50);  // work issued between ops: unattributed
  }

 private:
  OpRangeObserver& ranges_;
  FakeTracer& tracer_;
};

TEST(OpRangeObserver, CpuBackendStepIsAttributedOpByOpAndJoinsToTheStepProgram) {
  const layouts::ModelSpec spec = layouts::model_preset("tiny");
  layouts::ParallelConfig parallel;
  parallel.micro_batch_size = 2;
  parallel.global_batch_size = 4;
  parallel.validate(spec);
  executor::TrainerConfig config;
  config.model = executor::transformer_config_from(spec, 1, 10000.0f, 1e-5f, 0.02f);
  config.batch.micro_batch = 2;
  config.batch.seq = spec.seq_length;
  config.batch.num_microbatches = 2;
  config.compute_dtype = executor::DType::kBF16;
  config.lr.decay_samples = 1000;  // a finite schedule: every step applies the optimizer
  executor::CpuBackend backend(true);
  executor::SingleRankCommunicator communicator(backend);
  executor::Trainer trainer(config, layouts::build_schedule(spec, parallel, 0), backend, communicator);
  std::vector<executor::MicroBatch> batches(2);
  std::mt19937 rng(5);
  for (executor::MicroBatch& mb : batches)
    for (std::int64_t t = 0; t < config.batch.micro_batch * config.batch.seq; ++t) {
      mb.tokens.push_back(static_cast<std::int32_t>(rng() % spec.vocab_size));
      mb.labels.push_back(static_cast<std::int32_t>(rng() % spec.vocab_size));
      mb.loss_mask.push_back(1.0f);
    }

  FakeTracer tracer(/*launch_gap_ns=*/10);
  OpRangeObserver ranges(tracer);
  FakeDeviceObserver device(ranges, tracer);
  backend.set_op_observer(&device);
  trainer.train_step(batches);
  trainer.train_step(batches);
  backend.set_op_observer(nullptr);
  const std::vector<TraceRecord> records = tracer.flush();
  ASSERT_EQ(ranges.ops().size() % 2, 0u);
  const std::size_t per_step = ranges.ops().size() / 2;
  const OpSlice last_step = last_iteration(ranges.ops());
  EXPECT_EQ(last_step.first, per_step);
  EXPECT_EQ(last_step.count, per_step);

  const AttributedOps last = attribute_records(ranges, records, per_step, per_step);
  ASSERT_EQ(last.ops.size(), per_step);
  EXPECT_EQ(last.ops_without_activity, 0);
  double expected_sum_s = 0;
  for (std::size_t i = 0; i < per_step; ++i) {
    const std::size_t index = per_step + i;
    const bool is_gemm = last.ops[i].op.kind == layouts::OpKind::kGemm;
    // The second GEMM kernel follows after a 10 ns gap: busy = both durations, gap excluded.
    const double expected_s = (1000.0 + index + (is_gemm ? 5 : 0)) * 1e-9;
    EXPECT_NEAR(last.ops[i].measured_s, expected_s, 1e-15) << i;
    expected_sum_s += expected_s;
  }
  EXPECT_NEAR(last.attributed_s, expected_sum_s, 1e-12);
  EXPECT_NEAR(last.unattributed_s, 2.0 * per_step * 50e-9, 1e-12);

  const layouts::StepProgram program = layouts::build_step_program(spec, parallel, 0);
  const auto prices = cost_models::CostModel::from_embedded(cost_models::parse_cluster_spec("1x1xH200"));
  const JoinedRun joined = join_to_step_program(last.ops, program, *prices);
  EXPECT_EQ(joined.unmatched, 0);
  EXPECT_EQ(joined.matched_loosely, 0);
  EXPECT_EQ(joined.ops.size(), per_step);
  EXPECT_NEAR(joined.measured_total_s, expected_sum_s, 1e-12);
}

}  // namespace
}  // namespace megatune::profiler
