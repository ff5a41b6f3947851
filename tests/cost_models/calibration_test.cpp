// Calibration: the per-class fits recover a known shape dependence, stay within the fitted range, conserve
// each class's measured total, leave communication alone, round-trip through JSON and the calibrations
// table (schema version 3, migrated from version 2).
#include "cost_models/calibration.h"

#include <gtest/gtest.h>

#include <cmath>

#include "cost_models/calibration_store.h"
#include "cost_models/cost_database.h"

namespace megatune::cost_models {
namespace {

using layouts::Op;
using layouts::OpKind;

Op gemm(std::int64_t m, std::int64_t n, std::int64_t k) {
  Op op;
  op.kind = OpKind::kGemm;
  op.m = m, op.n = n, op.k = k;
  return op;
}

Op memory_bound(OpKind kind, std::int64_t bytes) {
  Op op;
  op.kind = kind;
  op.bytes = bytes;
  return op;
}

// measured = predicted * 1.25 * (flops / 1e12)^0.08: a correction that grows with the GEMM's size.
double true_factor(const Op& op) { return 1.25 * std::pow(op.gemm_flops() / 1e12, 0.08); }

std::vector<CalibrationSample> gemm_samples(const std::vector<std::int64_t>& sizes) {
  std::vector<CalibrationSample> samples;
  for (std::int64_t m : sizes)
    for (std::int64_t n : {2048, 4096, 8192}) {
      const Op op = gemm(m, n, 2048);
      const double predicted = op.gemm_flops() / 700e12;
      samples.push_back({op, predicted, predicted * true_factor(op)});
    }
  return samples;
}

TEST(Calibration, RecoversAShapeDependentGemmCorrectionAtAnUnseenShape) {
  const Calibration c = Calibration::fit(gemm_samples({1024, 2048, 8192, 16384}), 0.0);
  ASSERT_EQ(c.classes().size(), 1u);
  const Op unseen = gemm(4096, 6144, 2048);  // inside the fitted range, not fitted
  EXPECT_NEAR(c.factor(unseen), true_factor(unseen), 0.02 * true_factor(unseen));
  // Small and large GEMMs get different corrections: not one factor per run.
  EXPECT_GT(c.factor(gemm(16384, 8192, 2048)), c.factor(gemm(1024, 2048, 2048)) * 1.1);
}

TEST(Calibration, ClampsToTheFittedRangeAndConservesTheClassTotal) {
  const std::vector<CalibrationSample> samples = gemm_samples({1024, 2048, 4096});
  CalibrationFitOptions class_only;
  class_only.per_shape_residuals = false;
  const Calibration c = Calibration::fit(samples, 0.0, class_only);
  // Far outside the range: the factor of the largest fitted shape, not an extrapolation.
  EXPECT_DOUBLE_EQ(c.factor(gemm(1 << 20, 8192, 2048)), c.factor(gemm(4096, 8192, 2048)));
  double corrected = 0, measured = 0;
  for (const CalibrationSample& s : samples) {
    corrected += s.predicted_s * c.factor(s.op);
    measured += s.measured_s;
  }
  EXPECT_NEAR(corrected, measured, 1e-9 * measured);
}

TEST(Calibration, TracedShapesKeepTheirOwnResidualAndUnseenShapesTheClassCorrection) {
  // The middle shape ran 1.5x slower than the class trend (a shape the profile measured too fast).
  std::vector<CalibrationSample> samples;
  for (std::int64_t m : {1024, 2048, 4096})
    for (int repeat = 0; repeat < 8; ++repeat) {
      const Op op = gemm(m, 4096, 4096);
      samples.push_back({op, 1e-3, (m == 2048 ? 1.5e-3 : 1e-3)});
    }
  const Calibration c = Calibration::fit(samples, 0.0);
  const double shrink = 8.0 / (8.0 + CalibrationFitOptions{}.shape_shrinkage);
  const Op middle = gemm(2048, 4096, 4096);
  const Op unseen = gemm(3072, 4096, 4096);
  ASSERT_EQ(c.shape_residuals().size(), 3u);
  EXPECT_TRUE(c.shape_residuals().count(training_shape_key(middle)));
  EXPECT_GT(c.factor(middle), 1.3);
  EXPECT_LT(c.factor(middle) / c.factor(gemm(4096, 4096, 4096)), std::pow(1.5, shrink) * 1.3);
  EXPECT_LT(c.factor(unseen), c.factor(middle));
  EXPECT_EQ(training_shape_key(middle), "gemm 2048x4096x4096 bf16");
  EXPECT_NE(c.summary().find("3 shapes as traced"), std::string::npos);
  // The residuals survive the JSON.
  EXPECT_DOUBLE_EQ(Calibration::from_json(c.to_json()).factor(middle), c.factor(middle));
}

TEST(Calibration, OneShapeGivesAPlainFactorAndUnseenKindsUseThePooledMemoryBoundClass) {
  std::vector<CalibrationSample> samples;
  for (double measured : {2e-3, 3e-3, 4e-3})
    samples.push_back({memory_bound(OpKind::kNorm, 1 << 20), 1e-3, measured});
  const Calibration c = Calibration::fit(samples, 0.0);
  EXPECT_NEAR(c.factor(memory_bound(OpKind::kNorm, 1 << 20)), 3.0, 1e-9);
  EXPECT_NEAR(c.factor(memory_bound(OpKind::kNorm, 1 << 24)), 3.0, 1e-9);
  // No rope samples: the pooled memory-bound class answers.
  EXPECT_NEAR(c.factor(memory_bound(OpKind::kRope, 1 << 20)), 3.0, 1e-9);
  // No GEMM samples: no correction.
  EXPECT_DOUBLE_EQ(c.factor(gemm(1024, 1024, 1024)), 1.0);
}

TEST(Calibration, AppliesTheGapToComputeOpsOnlyAndLeavesCommunicationAlone) {
  std::vector<CalibrationSample> samples = gemm_samples({1024, 2048});
  Op all_reduce = memory_bound(OpKind::kAllReduce, 1 << 20);
  samples.push_back({all_reduce, 1e-3, 5e-3});  // ignored: communication
  const Calibration c = Calibration::fit(samples, 2e-6);
  EXPECT_DOUBLE_EQ(c.apply(all_reduce, {1e-3, Provenance::kMeasured}).time_s, 1e-3);
  const Op op = gemm(1024, 2048, 2048);
  EXPECT_NEAR(c.apply(op, {1e-3, Provenance::kMeasured}).time_s, 1e-3 * c.factor(op) + 2e-6, 1e-15);
  EXPECT_NE(c.summary().find("gemm"), std::string::npos);
  EXPECT_NE(c.summary().find("2.00 us per compute op"), std::string::npos);
}

TEST(Calibration, RoundTripsThroughJsonAndRejectsAMalformedText) {
  const Calibration c = Calibration::fit(gemm_samples({1024, 4096}), 1e-6);
  const Calibration back = Calibration::from_json(c.to_json());
  const Op op = gemm(2048, 4096, 2048);
  EXPECT_DOUBLE_EQ(back.factor(op), c.factor(op));
  EXPECT_DOUBLE_EQ(back.gap_per_compute_op_s(), 1e-6);
  EXPECT_THROW(Calibration::from_json("{\"classes\": 3}"), std::runtime_error);
  EXPECT_THROW(Calibration::from_json("not json"), std::runtime_error);
}

TEST(CalibrationStore, NewestRowOfAGpuWinsAndAVersion2DatabaseMigrates) {
  Database database = open_in_memory_cost_database();
  EXPECT_FALSE(load_latest_calibration(database, {"H200 SXM"}));
  CalibrationRecord a;
  a.gpu = "H200 SXM";
  a.params_json = Calibration::fit(gemm_samples({1024, 2048}), 0).to_json();
  a.n_runs = 2;
  CalibrationRecord b = a;
  b.n_runs = 3;
  CalibrationRecord other = a;
  other.gpu = "A100 SXM 80GB";
  insert_calibration(database, a);
  const std::int64_t id = insert_calibration(database, b);
  insert_calibration(database, other);
  const std::optional<CalibrationRecord> newest = load_latest_calibration(database, {"H200", "H200 SXM"});
  ASSERT_TRUE(newest);
  EXPECT_EQ(newest->id, id);
  EXPECT_EQ(newest->n_runs, 3);
  EXPECT_FALSE(newest->calibrated_at.empty());
  EXPECT_EQ(load_calibrations(database).size(), 3u);

  const std::string path = ::testing::TempDir() + "calibration_store_v2.db";
  std::remove(path.c_str());
  {
    CostDatabaseOpenOptions old;
    old.target_schema_version = 2;
    Database v2 = open_cost_database(path, old);
    EXPECT_FALSE(load_latest_calibration(v2, {"H200 SXM"}));  // no table yet: none, not an error
  }
  Database migrated = open_cost_database(path);
  EXPECT_EQ(schema_version(migrated), 3);
  insert_calibration(migrated, a);
  EXPECT_TRUE(load_latest_calibration(migrated, {"H200 SXM"}));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace megatune::cost_models
