// Calibration from traced runs, on synthetic traces of the tiny model whose op times are known multiples
// of the cost model's prices with a fixed gap between ops: the samples, the idle time (overlaps counted
// once), the fitted factors and gap, and leave-one-out recovering the held-out run's step time.
#include "calibration/calibration_fit.h"

#include <gtest/gtest.h>

#include "calibration/leave_one_out.h"
#include "cost_models/cluster_spec.h"
#include "layouts/step_program.h"

namespace megatune::calibration {
namespace {

constexpr double kGapS = 1e-6;

double true_factor(const layouts::Op& op) {
  if (op.kind == layouts::OpKind::kGemm) return 1.3;
  if (op.kind == layouts::OpKind::kAttentionBackward) return 2.0;
  return 1.1;
}

CalibrationCase synthetic_run(int micro_batch_size, const cost_models::CostModel& model) {
  CalibrationCase c;
  c.model = layouts::model_preset("tiny");
  c.config.micro_batch_size = micro_batch_size;
  c.config.global_batch_size = 4;
  c.config.validate(c.model);
  c.run.dir = "mbs" + std::to_string(micro_batch_size);
  c.run.layout = "tiny mbs " + std::to_string(micro_batch_size);
  TracedRank rank;
  const layouts::StepProgram program = layouts::build_step_program(c.model, c.config, 0);
  for (int iteration = 0; iteration < 2; ++iteration) {
    TracedIteration it;
    double t = 0;
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const double d = model.uncalibrated_price(program.ops[i]).time_s * true_factor(program.ops[i]);
      TracedOp op;
      op.id = static_cast<int>(i);
      op.start_s = t;
      op.end_s = t + d;
      it.ops.push_back(op);
      t += d + kGapS;
    }
    it.step_s = t;
    rank.iterations.push_back(std::move(it));
  }
  c.run.ranks.push_back(std::move(rank));
  return c;
}

class CalibrationFitTest : public ::testing::Test {
 protected:
  std::unique_ptr<cost_models::CostModel> model_ =
      cost_models::CostModel::from_embedded(cost_models::parse_cluster_spec("1x1xH200"));
};

TEST_F(CalibrationFitTest, SamplesEveryComputeOpAndFitsTheFactorsAndTheGap) {
  const CalibrationCase c = synthetic_run(2, *model_);
  const RunCalibrationData data = calibration_data(c.run, c.model, c.config, *model_);
  const std::size_t ops = layouts::build_step_program(c.model, c.config, 0).ops.size();
  EXPECT_EQ(data.samples.size(), ops);  // one rank, no communication
  EXPECT_NEAR(data.idle_s, kGapS * static_cast<double>(ops), 1e-12);
  const FittedCalibration fitted = fit_calibration({data}, "H200 SXM");
  layouts::Op gemm;
  gemm.kind = layouts::OpKind::kGemm;
  gemm.m = gemm.n = gemm.k = 64;
  EXPECT_NEAR(fitted.calibration.factor(gemm), 1.3, 1e-9);
  EXPECT_NEAR(fitted.calibration.gap_per_compute_op_s(), kGapS, 1e-12);
  EXPECT_GT(fitted.record.op_error_before, 0.05);
  EXPECT_LT(fitted.record.op_error_after, 1e-9);
  EXPECT_EQ(fitted.record.n_runs, 1);
  EXPECT_EQ(fitted.record.gpu, "H200 SXM");
}

TEST_F(CalibrationFitTest, OverlappingOpsCountOnceInTheBusyTime) {
  CalibrationCase c = synthetic_run(4, *model_);
  for (TracedIteration& it : c.run.ranks[0].iterations) {
    // The second op starts halfway through the first (as a collective on its own stream would).
    TracedOp& second = it.ops[1];
    const double shift = second.start_s - 0.5 * it.ops[0].end_s;
    for (std::size_t i = 1; i < it.ops.size(); ++i) it.ops[i].start_s -= shift, it.ops[i].end_s -= shift;
    it.step_s -= shift;
  }
  const RunCalibrationData data = calibration_data(c.run, c.model, c.config, *model_);
  const double ops = static_cast<double>(c.run.ranks[0].iterations[0].ops.size());
  EXPECT_NEAR(data.idle_s, kGapS * (ops - 1), 1e-12);
}

TEST_F(CalibrationFitTest, LeaveOneOutPredictsTheHeldOutRunFromTheOthers) {
  std::vector<CalibrationCase> cases;
  for (int mbs : {1, 2, 4}) cases.push_back(synthetic_run(mbs, *model_));
  const std::vector<LeaveOneOutRow> rows = leave_one_out(cases, *model_);
  ASSERT_EQ(rows.size(), 3u);
  for (const LeaveOneOutRow& r : rows) {
    EXPECT_LT(r.uncalibrated_error(), -0.05) << r.run;  // the prices miss the factors and the gaps
    EXPECT_NEAR(r.calibrated_error(), 0.0, 0.01) << r.run;
  }
  EXPECT_FALSE(model_->calibration());  // the base model is left as it was
  const std::string table = leave_one_out_table(rows);
  EXPECT_NE(table.find("mbs4"), std::string::npos);
  EXPECT_NE(table.find("calibrated (leave-one-out): mean"), std::string::npos);
}

}  // namespace
}  // namespace megatune::calibration
