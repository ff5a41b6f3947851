// Calibration from traced runs: what a run contributes (each compute op's uncalibrated price beside its
// measured time, the compute stream's idle time, the run's provenance) and the fit of a Calibration with its
// database row (cost_models/calibration.h, records.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "calibration/measured_run.h"
#include "cost_models/calibration.h"
#include "cost_models/cost_model.h"
#include "cost_models/records.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"

namespace megatune::calibration {

struct RunCalibrationData {
  std::string name;  // the run's folder
  std::vector<cost_models::CalibrationSample> samples;
  // Summed over the traced ranks (each a mean over its traced iterations): step time minus the time some op
  // of either stream was running (the union of their intervals), and the compute ops of the step programs.
  double idle_s = 0;
  std::int64_t compute_ops = 0;
  std::string provenance_json;  // one object: folder, created_utc, model, layout, device, gpu, clocks, ...
};

// `model` prices the ops without calibration (CostModel::uncalibrated_price). check_join(run, spec, config,
// ..., step) must have passed.
RunCalibrationData calibration_data(const MeasuredRun& run, const layouts::ModelSpec& spec,
                                    const layouts::ParallelConfig& config,
                                    const cost_models::CostModel& model,
                                    const layouts::StepProgramOptions& step = {});

struct FittedCalibration {
  cost_models::Calibration calibration;
  cost_models::CalibrationRecord record;  // for `gpu`, with provenance and the fitted ops' errors
};

// Fits over every run's samples; the gap per compute op is the runs' total idle time over their compute ops.
FittedCalibration fit_calibration(const std::vector<RunCalibrationData>& runs, const std::string& gpu,
                                  const cost_models::CalibrationFitOptions& options = {});

}  // namespace megatune::calibration
