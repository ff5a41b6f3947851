// leave_one_out: calibrate on n-1 traced runs, simulate the n-th, for every n.
#include "calibration/leave_one_out.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/user_error.h"
#include "planner/simulator.h"

namespace megatune::calibration {
namespace {

double measured_step(const MeasuredRun& run) {
  double slowest = 0;
  for (const TracedRank& rank : run.ranks) {
    double mean = 0;
    for (const TracedIteration& it : rank.iterations) mean += it.step_s / double(rank.iterations.size());
    slowest = std::max(slowest, mean);
  }
  return slowest;
}

double simulated_step(const CalibrationCase& c, const cost_models::CostModel& cost_model) {
  const planner::CostModelPricer pricer(cost_model);
  planner::SimulationOptions options;
  options.granularity = planner::SimulationGranularity::kKernel;
  options.step = c.step;
  return planner::simulate(c.model, c.config, pricer, options).step_time_s;
}

std::string group_key(const CalibrationCase& c, HoldOut hold_out) {
  switch (hold_out) {
    case HoldOut::kRun:
      return c.run.dir;
    case HoldOut::kShape:
      return c.model.name + " seq " + std::to_string(c.model.seq_length) + " mbs " +
             std::to_string(c.config.micro_batch_size);
    case HoldOut::kModel:
      break;
  }
  return c.model.name;
}

}  // namespace

HoldOut parse_hold_out(const std::string& name) {
  for (HoldOut h : {HoldOut::kRun, HoldOut::kShape, HoldOut::kModel})
    if (name == hold_out_name(h)) return h;
  throw UserError("--hold-out " + name + ": use run, shape (model, seq length and micro-batch) or model");
}

const char* hold_out_name(HoldOut hold_out) {
  switch (hold_out) {
    case HoldOut::kRun:
      return "run";
    case HoldOut::kShape:
      return "shape";
    case HoldOut::kModel:
      break;
  }
  return "model";
}

std::vector<LeaveOneOutRow> leave_one_out(const std::vector<CalibrationCase>& cases,
                                          cost_models::CostModel& cost_model, HoldOut hold_out,
                                          const cost_models::CalibrationFitOptions& options) {
  cost_model.set_calibration(std::nullopt);
  std::vector<RunCalibrationData> data;
  for (const CalibrationCase& c : cases)
    data.push_back(calibration_data(c.run, c.model, c.config, cost_model, c.step));
  std::vector<LeaveOneOutRow> rows;
  for (std::size_t held_out = 0; held_out < cases.size(); ++held_out) {
    const CalibrationCase& c = cases[held_out];
    const std::string group = group_key(c, hold_out);
    LeaveOneOutRow row{c.run.dir, c.run.model, c.run.layout, group, measured_step(c.run), 0, 0};
    cost_model.set_calibration(std::nullopt);
    row.uncalibrated_step_s = simulated_step(c, cost_model);
    std::vector<RunCalibrationData> others;
    for (std::size_t j = 0; j < cases.size(); ++j)
      if (group_key(cases[j], hold_out) != group) others.push_back(data[j]);
    if (others.empty())
      throw UserError("--hold-out " + std::string(hold_out_name(hold_out)) + ": every run is in the group '" +
                      group + "', so none is left to calibrate on; add runs of other " +
                      (hold_out == HoldOut::kModel ? "models" : "shapes") + " or hold out by run");
    cost_model.set_calibration(fit_calibration(others, cost_model.gpu().name, options).calibration);
    row.calibrated_step_s = simulated_step(c, cost_model);
    rows.push_back(std::move(row));
  }
  cost_model.set_calibration(std::nullopt);
  return rows;
}

std::string leave_one_out_table(const std::vector<LeaveOneOutRow>& rows, HoldOut hold_out) {
  std::string out = std::string("leave-one-out (held out by ") + hold_out_name(hold_out) +
                    "): each run predicted from a calibration fitted on the runs outside its group\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-28s %-34s %11s %11s %8s %11s %8s\n", "run", "layout", "measured",
                "uncalib.", "error", "calibrated", "error");
  out += line;
  double sum_before = 0, sum_after = 0, max_before = 0, max_after = 0;
  for (const LeaveOneOutRow& r : rows) {
    std::string name = r.run.size() > 28 ? "..." + r.run.substr(r.run.size() - 25) : r.run;
    std::string layout = r.layout.size() > 34 ? r.layout.substr(0, 31) + "..." : r.layout;
    std::snprintf(line, sizeof line, "  %-28s %-34s %9.4f s %9.4f s %+7.1f%% %9.4f s %+7.1f%%\n",
                  name.c_str(), layout.c_str(), r.measured_step_s, r.uncalibrated_step_s,
                  100 * r.uncalibrated_error(), r.calibrated_step_s, 100 * r.calibrated_error());
    out += line;
    sum_before += std::fabs(r.uncalibrated_error());
    sum_after += std::fabs(r.calibrated_error());
    max_before = std::max(max_before, std::fabs(r.uncalibrated_error()));
    max_after = std::max(max_after, std::fabs(r.calibrated_error()));
  }
  const double n = static_cast<double>(std::max<std::size_t>(rows.size(), 1));
  std::snprintf(line, sizeof line,
                "  |error| uncalibrated: mean %.1f%%, max %.1f%%; calibrated (leave-one-out): mean %.1f%%, "
                "max %.1f%%\n",
                100 * sum_before / n, 100 * max_before, 100 * sum_after / n, 100 * max_after);
  return out + line;
}

}  // namespace megatune::calibration
