// calibration_data and fit_calibration: traced runs into a Calibration and its provenance row.
#include "calibration/calibration_fit.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "layouts/step_program.h"

namespace megatune::calibration {
namespace {

double mean_or_missing(const std::vector<double>& values) {
  if (values.empty()) return -1;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

// The time some op of either stream was running: the union of the ops' intervals.
double busy_s(const std::vector<TracedOp>& ops) {
  std::vector<std::pair<double, double>> intervals;
  for (const TracedOp& op : ops) intervals.emplace_back(op.start_s, op.end_s);
  std::sort(intervals.begin(), intervals.end());
  double busy = 0, start = 0, end = -1;
  for (const auto& [s, e] : intervals) {
    if (s > end) {
      busy += std::max(0.0, end - start);
      start = s, end = e;
    } else {
      end = std::max(end, e);
    }
  }
  return busy + std::max(0.0, end - start);
}

// The command line with --trace-dir's value replaced by the run's folder as it was read (where the trace
// was first written says nothing once the folder has moved).
std::vector<std::string> command_of(const MeasuredRun& run) {
  std::vector<std::string> command = run.command;
  for (std::size_t i = 0; i + 1 < command.size(); ++i)
    if (command[i] == "--trace-dir") command[i + 1] = run.dir;
  return command;
}

std::string provenance_of(const MeasuredRun& run) {
  std::vector<double> clocks, powers;
  for (const TracedRank& rank : run.ranks)
    for (const TracedIteration& it : rank.iterations) {
      if (it.sm_clock_mhz >= 0) clocks.push_back(it.sm_clock_mhz);
      if (it.power_w >= 0) powers.push_back(it.power_w);
    }
  const nlohmann::json j = {{"run", run.dir},
                            {"created_utc", run.created_utc},
                            {"megatune_commit", run.megatune_commit},
                            {"model", run.model},
                            {"layout", run.layout},
                            {"micro_batch_size", run.micro_batch_size},
                            {"global_batch_size", run.global_batch_size},
                            {"device", run.device},
                            {"gpu", run.gpu},
                            {"backend", run.backend},
                            {"timing", run.timing},
                            {"sm_clock_mhz", mean_or_missing(clocks)},
                            {"power_w", mean_or_missing(powers)},
                            {"command", command_of(run)}};
  return j.dump();
}

// sum |predicted - measured| / sum measured over the samples, with or without the calibration's factors
// (the gap is idle time between ops, not part of an op's measured time).
double op_error(const std::vector<RunCalibrationData>& runs, const cost_models::Calibration* calibration) {
  double error = 0, measured = 0;
  for (const RunCalibrationData& run : runs)
    for (const cost_models::CalibrationSample& s : run.samples) {
      const double predicted = s.predicted_s * (calibration ? calibration->factor(s.op) : 1.0);
      error += std::fabs(predicted - s.measured_s);
      measured += s.measured_s;
    }
  return measured > 0 ? error / measured : 0.0;
}

}  // namespace

RunCalibrationData calibration_data(const MeasuredRun& run, const layouts::ModelSpec& spec,
                                    const layouts::ParallelConfig& config,
                                    const cost_models::CostModel& model,
                                    const layouts::StepProgramOptions& step) {
  RunCalibrationData data;
  data.name = run.dir;
  data.provenance_json = provenance_of(run);
  for (const TracedRank& rank : run.ranks) {
    const layouts::StepProgram program = layouts::build_step_program(spec, config, rank.rank, step);
    const double iterations = static_cast<double>(rank.iterations.size());
    std::vector<double> measured(program.ops.size(), 0.0);
    for (const TracedIteration& it : rank.iterations) {
      data.idle_s += std::max(0.0, it.step_s - busy_s(it.ops)) / iterations;
      for (std::size_t i = 0; i < program.ops.size(); ++i) measured[i] += it.ops[i].duration_s() / iterations;
    }
    for (std::size_t i = 0; i < program.ops.size(); ++i) {
      const layouts::Op& op = program.ops[i];
      if (op.is_communication()) continue;
      ++data.compute_ops;
      data.samples.push_back({op, model.uncalibrated_price(op).time_s, measured[i]});
    }
  }
  return data;
}

FittedCalibration fit_calibration(const std::vector<RunCalibrationData>& runs, const std::string& gpu,
                                  const cost_models::CalibrationFitOptions& options) {
  std::vector<cost_models::CalibrationSample> samples;
  double idle_s = 0;
  std::int64_t compute_ops = 0;
  nlohmann::json provenance = nlohmann::json::array();
  for (const RunCalibrationData& run : runs) {
    samples.insert(samples.end(), run.samples.begin(), run.samples.end());
    idle_s += run.idle_s;
    compute_ops += run.compute_ops;
    provenance.push_back(nlohmann::json::parse(run.provenance_json));
  }
  FittedCalibration fitted;
  fitted.calibration = cost_models::Calibration::fit(
      samples, compute_ops > 0 ? idle_s / static_cast<double>(compute_ops) : 0.0, options);
  cost_models::CalibrationRecord& r = fitted.record;
  r.gpu = gpu;
  r.params_json = fitted.calibration.to_json();
  r.runs_json = provenance.dump();
  r.n_runs = static_cast<int>(runs.size());
  r.n_ops = static_cast<int>(samples.size());
  r.op_error_before = op_error(runs, nullptr);
  r.op_error_after = op_error(runs, &fitted.calibration);
  r.calibrated_at = cost_models::utc_now_iso8601();
  return fitted;
}

}  // namespace megatune::calibration
