// The measured half of plan --measure-top on hand-made measurements: the job's step time is its slowest
// rank's mean, and the JSON holds every candidate tried, measured ones with their times, dropped ones with
// why.
#include "calibration/measured_candidates.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace megatune::calibration {
namespace {

TracedRank rank_with_steps(int rank, const std::vector<double>& steps_s) {
  TracedRank r;
  r.rank = rank;
  for (double s : steps_s) {
    TracedIteration it;
    it.step_s = s;
    r.iterations.push_back(it);
  }
  return r;
}

TEST(MeasuredCandidates, StepTimeIsTheSlowestRanksMean) {
  MeasuredRun run;
  run.ranks.push_back(rank_with_steps(0, {1.0, 3.0}));  // mean 2.0
  run.ranks.push_back(rank_with_steps(1, {2.0, 2.5}));  // mean 2.25
  run.ranks.push_back(rank_with_steps(2, {}));          // no timed iteration: not counted
  EXPECT_DOUBLE_EQ(measured_step_s(run), 2.25);
  EXPECT_DOUBLE_EQ(measured_step_s(MeasuredRun{}), 0.0);
}

TEST(MeasuredCandidates, JsonHoldsMeasuredTimesOrTheFailure) {
  planner::PlanResult result;
  result.ranked.resize(2);
  result.ranked[0].simulation.step_time_s = 1.5;
  result.ranked[0].simulation.mfu = 0.4;
  result.ranked[1].simulation.step_time_s = 1.75;
  std::vector<CandidateMeasurement> ms(2);
  ms[0].plan_index = 0;
  ms[0].measured = true;
  ms[0].measured_step_s = 2.0;
  ms[0].measured_mfu = 0.3;
  ms[0].calibrated_step_s = 1.9;
  ms[1].plan_index = 1;
  ms[1].failure = "exit 1: out of memory";
  const nlohmann::json rows = nlohmann::json::parse(measurements_json(ms, result));
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0]["predicted_rank"], 1);
  EXPECT_DOUBLE_EQ(rows[0]["predicted_step_time_s"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(rows[0]["measured_step_time_s"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(rows[0]["calibrated_step_time_s"].get<double>(), 1.9);
  EXPECT_FALSE(rows[0].contains("failure"));
  EXPECT_EQ(rows[1]["predicted_rank"], 2);
  EXPECT_EQ(rows[1]["failure"], "exit 1: out of memory");
  EXPECT_FALSE(rows[1].contains("measured_step_time_s"));
}

}  // namespace
}  // namespace megatune::calibration
