// The measured half of `megatune plan --measure-top K`: the plan's candidates that were trained with a trace
// set beside their predictions, a calibration fitted from those traces, the candidates re-simulated with it
// and re-ranked by measured step time. Training them is the CLI's (tools/measure_top.h).
#pragma once
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "calibration/calibration_fit.h"
#include "calibration/leave_one_out.h"
#include "calibration/measured_run.h"
#include "cost_models/cost_model.h"
#include "layouts/step_program.h"
#include "planner/search.h"

namespace megatune::calibration {

struct CandidateMeasurement {
  std::size_t plan_index = 0;  // in result.ranked
  std::string trace_dir;
  bool measured = false;
  std::string failure;  // why it was dropped
  double measured_step_s = 0, measured_mfu = 0, calibrated_step_s = 0;
  std::optional<CalibrationCase> run;  // the traced run and the (model, layout) its flags build
};

// The job's step time: the slowest rank's mean over its traced iterations.
double measured_step_s(const MeasuredRun& run);

// Rank, candidate, layout, predicted and measured step time, error and both MFUs of the measured candidates.
void print_measured_table(const std::vector<CandidateMeasurement>& ms, const planner::PlanResult& result,
                          std::ostream& out);

// Fits a calibration from the measured traces, sets it on `pricing` and re-simulates every measured
// candidate (its calibrated_step_s); returns the fit.
FittedCalibration calibrate_and_resimulate(std::vector<CandidateMeasurement>& ms,
                                           const planner::PlanResult& result,
                                           const layouts::StepProgramOptions& step,
                                           cost_models::CostModel& pricing, std::ostream& out);

// The measured candidates in `order` (fastest measured first) with their plan rank and calibrated prediction.
void print_reranked(std::vector<CandidateMeasurement*>& order, const planner::PlanResult& result,
                    std::ostream& out);

// One line of JSON: per candidate tried, in predicted order, its predicted rank, knobs and layout, and either
// its predicted, measured and calibrated step times and MFUs or why it failed.
std::string measurements_json(const std::vector<CandidateMeasurement>& ms, const planner::PlanResult& result);

}  // namespace megatune::calibration
