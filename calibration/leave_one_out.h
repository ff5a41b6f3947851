// Leave-one-out evaluation of calibration: for each traced run, calibrate on all the others and predict it;
// its step time predicted without and with that calibration beside the measured one.
#pragma once
#include <string>
#include <vector>

#include "calibration/calibration_fit.h"
#include "calibration/measured_run.h"
#include "cost_models/cost_model.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::calibration {

struct CalibrationCase {
  MeasuredRun run;  // check_join(run, model, config) passed
  layouts::ModelSpec model;
  layouts::ParallelConfig config;
  layouts::StepProgramOptions step;  // the run's step-program options (its FP8 settings)
};

struct LeaveOneOutRow {
  std::string run, model, layout, group;  // group: the hold-out group's key
  double measured_step_s = 0;             // slowest traced rank's mean step
  double uncalibrated_step_s = 0, calibrated_step_s = 0;
  double uncalibrated_error() const { return (uncalibrated_step_s - measured_step_s) / measured_step_s; }
  double calibrated_error() const { return (calibrated_step_s - measured_step_s) / measured_step_s; }
};

// What is held out together: one run; every run of one (model, seq length, micro-batch) (runs that differ
// only in recomputation share their GEMM and attention shapes); every run of one model.
enum class HoldOut { kRun, kShape, kModel };
// "run" | "shape" | "model"; UserError naming them otherwise.
HoldOut parse_hold_out(const std::string& name);
const char* hold_out_name(HoldOut hold_out);

// `cost_model` is the base (its calibration is replaced while evaluating and removed at the end). Each case
// is predicted from a calibration fitted on the cases outside its hold-out group; UserError when a group
// holds every case. Kernel-level simulation, one rank per pipeline stage.
std::vector<LeaveOneOutRow> leave_one_out(const std::vector<CalibrationCase>& cases,
                                          cost_models::CostModel& cost_model,
                                          HoldOut hold_out = HoldOut::kRun,
                                          const cost_models::CalibrationFitOptions& options = {});

// One line per run (measured, predicted and error before and after), then mean and max |error|.
std::string leave_one_out_table(const std::vector<LeaveOneOutRow>& rows, HoldOut hold_out = HoldOut::kRun);

}  // namespace megatune::calibration
