// The measured candidates of plan --measure-top: the predicted-vs-measured table, the calibration fitted from
// their traces and the re-simulation with it, the re-ranked table and the JSON of every candidate tried.
#include "calibration/measured_candidates.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "planner/op_pricer.h"
#include "planner/simulator.h"

namespace megatune::calibration {

double measured_step_s(const MeasuredRun& run) {
  double slowest = 0;
  for (const TracedRank& rank : run.ranks) {
    double sum = 0;
    for (const TracedIteration& it : rank.iterations) sum += it.step_s;
    if (!rank.iterations.empty()) slowest = std::max(slowest, sum / double(rank.iterations.size()));
  }
  return slowest;
}

void print_measured_table(const std::vector<CandidateMeasurement>& ms, const planner::PlanResult& result,
                          std::ostream& out) {
  char line[320];
  std::snprintf(line, sizeof line, "\n%-5s %-44s %-14s %12s %12s %8s %9s %9s\n", "rank", "candidate",
                "layout", "predicted", "measured", "error", "pred MFU", "meas MFU");
  out << "predicted vs measured (MFU on the cluster's GPU peak):" << line;
  for (const CandidateMeasurement& m : ms) {
    if (!m.measured) continue;
    const planner::PlanCandidate& c = result.ranked[m.plan_index];
    const double predicted = c.simulation.step_time_s;
    std::snprintf(line, sizeof line, "%-5zu %-44s %-14s %10.4f s %10.4f s %+7.1f%% %8.2f%% %8.2f%%\n",
                  m.plan_index + 1, planner::describe(c).c_str(), c.layout.c_str(), predicted,
                  m.measured_step_s, 100 * (predicted - m.measured_step_s) / m.measured_step_s,
                  100 * c.simulation.mfu, 100 * m.measured_mfu);
    out << line;
  }
}

FittedCalibration calibrate_and_resimulate(std::vector<CandidateMeasurement>& ms,
                                           const planner::PlanResult& result,
                                           const layouts::StepProgramOptions& step,
                                           cost_models::CostModel& pricing, std::ostream& out) {
  std::vector<RunCalibrationData> data;
  for (const CandidateMeasurement& m : ms)
    if (m.measured) data.push_back(calibration_data(m.run->run, m.run->model, m.run->config, pricing, step));
  const FittedCalibration fitted = fit_calibration(data, pricing.gpu().name);
  char line[200];
  std::snprintf(line, sizeof line,
                "\ncalibration from %zu traced runs (%d compute ops): op time error %.1f%% uncalibrated, "
                "%.1f%% calibrated (in-sample)\n",
                data.size(), fitted.record.n_ops, 100 * fitted.record.op_error_before,
                100 * fitted.record.op_error_after);
  out << line;
  pricing.set_calibration(fitted.calibration);
  const planner::CostModelPricer pricer(pricing);
  planner::SimulationOptions options;
  options.step = step;
  for (CandidateMeasurement& m : ms)
    if (m.measured)
      m.calibrated_step_s =
          planner::simulate(m.run->model, result.ranked[m.plan_index].config, pricer, options).step_time_s;
  return fitted;
}

void print_reranked(std::vector<CandidateMeasurement*>& order, const planner::PlanResult& result,
                    std::ostream& out) {
  char line[320];
  std::snprintf(line, sizeof line, "%-5s %-9s %-44s %12s %14s %8s\n", "rank", "plan rank", "candidate",
                "measured", "calibrated", "error");
  out << "\nre-ranked by measured step time (the calibrated prediction beside it):\n" << line;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const CandidateMeasurement& m = *order[i];
    std::snprintf(line, sizeof line, "%-5zu %-9zu %-44s %10.4f s %12.4f s %+7.1f%%\n", i + 1,
                  m.plan_index + 1, planner::describe(result.ranked[m.plan_index]).c_str(), m.measured_step_s,
                  m.calibrated_step_s, 100 * (m.calibrated_step_s - m.measured_step_s) / m.measured_step_s);
    out << line;
  }
}

std::string measurements_json(const std::vector<CandidateMeasurement>& ms,
                              const planner::PlanResult& result) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CandidateMeasurement& m : ms) {
    const planner::PlanCandidate& c = result.ranked[m.plan_index];
    nlohmann::json row = {{"predicted_rank", m.plan_index + 1},
                          {"candidate", planner::describe(c)},
                          {"pipeline_layout", c.layout},
                          {"predicted_step_time_s", c.simulation.step_time_s},
                          {"predicted_mfu", c.simulation.mfu}};
    if (m.measured) {
      row["measured_step_time_s"] = m.measured_step_s;
      row["measured_mfu"] = m.measured_mfu;
      row["calibrated_step_time_s"] = m.calibrated_step_s;
    } else {
      row["failure"] = m.failure;
    }
    rows.push_back(std::move(row));
  }
  return rows.dump();
}

}  // namespace megatune::calibration
