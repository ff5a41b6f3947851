// The calibration shipped with the H200 profile, as the planner prices with it: the stored calibration
// applied to the embedded database's cost model (or left out), and the simulated step it gives.
#include <gtest/gtest.h>

#include "cost_models/cluster_spec.h"
#include "cost_models/embedded_data.h"
#include "planner/pricing_source.h"
#include "planner/simulator.h"

namespace megatune::planner {
namespace {

// The calibration shipped with the H200 profile (fitted on one H200's traced runs of gpt-1.3b, llama3-1b and
// llama3-3b): gpt-1.3b seq 2048, micro-batch 4 of 32 measured 1.020-1.025 s per iteration there; the
// profile alone predicts 0.891 s.
TEST(ShippedCalibration, PricesTheMeasuredH200StepAndCanBeLeftOut) {
  cost_models::Database database = cost_models::open_embedded_cost_database();
  cost_models::CostModel model(database, cost_models::parse_cluster_spec("1x1xH200"));
  const std::string clause = apply_stored_calibration(database, model, true);
  EXPECT_NE(clause.find("calibrated from"), std::string::npos) << clause;
  layouts::ModelSpec spec = layouts::model_preset("gpt-1.3b");
  layouts::ParallelConfig config;
  config.micro_batch_size = 4;
  config.global_batch_size = 32;
  config.validate(spec);
  const double measured_s = 1.0225;
  const double calibrated_s = simulate(spec, config, CostModelPricer(model)).step_time_s;
  EXPECT_NEAR(calibrated_s, measured_s, 0.03 * measured_s);
  model.set_calibration(std::nullopt);
  EXPECT_LT(simulate(spec, config, CostModelPricer(model)).step_time_s, 0.9 * measured_s);
  cost_models::CostModel off(database, cost_models::parse_cluster_spec("1x1xH200"));
  EXPECT_NE(apply_stored_calibration(database, off, false).find("calibration off"), std::string::npos);
  EXPECT_FALSE(off.calibration());
}

}  // namespace
}  // namespace megatune::planner
