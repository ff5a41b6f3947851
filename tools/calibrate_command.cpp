// run_calibrate: traced runs -> per-op samples against the database's own prices -> a Calibration row.
#include "tools/calibrate_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/user_error.h"
#include "calibration/calibration_fit.h"
#include "cost_models/calibration_store.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "tools/traced_run_target.h"

namespace megatune::tools {
namespace {

// The cluster a run's prices are corrected on; every run must name the same GPU.
cost_models::ClusterSpec cluster_of(const calibration::MeasuredRun& run, const CalibrateOptions& o) {
  if (run.device == "cpu" && (o.cluster.empty() || !o.database_given))
    throw UserError("--run " + run.dir +
                    " is a CPU run (its times are the CPU backend's): name the GPU whose prices it corrects "
                    "with --cluster (e.g. --cluster 1x1xH200) and keep the result in a database of its own "
                    "with --db FILE");
  return cost_models::parse_cluster_spec(o.cluster.empty() ? run.cluster : o.cluster);
}

void print_classes(const cost_models::Calibration& calibration, std::ostream& out) {
  char line[256];
  std::snprintf(line, sizeof line, "  %-16s %8s %12s %12s %9s  %s\n", "op class", "ops", "measured",
                "uncalibrated", "factor", "slopes (per e-fold of the features, clamped to the fitted range)");
  out << line;
  for (const cost_models::CorrectionClass& c : calibration.classes()) {
    std::string slopes;
    for (double s : c.slopes) slopes += (slopes.empty() ? "" : " ") + std::to_string(s).substr(0, 7);
    std::snprintf(line, sizeof line, "  %-16s %8d %10.4f s %10.4f s %8.3fx  %s\n", c.name.c_str(), c.ops,
                  c.measured_s, c.predicted_s, std::exp(c.log_intercept), slopes.c_str());
    out << line;
  }
}

}  // namespace

void run_calibrate(const CalibrateOptions& o, const std::function<cost_models::Database()>& open_database,
                   std::ostream& out) {
  if (o.runs.empty()) throw UserError("--run DIR is required: the --trace-dir of a megatune train run");
  require_distinct_runs(o.runs);
  std::vector<TracedRunTarget> runs;
  std::vector<cost_models::ClusterSpec> clusters;
  for (const std::string& dir : o.runs) {
    runs.push_back(read_traced_run(dir));
    clusters.push_back(cluster_of(runs.back().run, o));
    if (clusters.back().gpu.name != clusters.front().gpu.name)
      throw UserError("--run " + dir + " ran on " + clusters.back().gpu.name + ", --run " + o.runs.front() +
                      " on " + clusters.front().gpu.name +
                      ": calibrate one GPU at a time (or name it with --cluster)");
  }
  cost_models::Database database = open_database();
  if (database.read_only())
    throw UserError("cost database " + database.path() + " is not writable; pass a writable one with --db");
  std::vector<calibration::RunCalibrationData> data;
  double idle_s = 0, step_s = 0;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const cost_models::CostModel base(database, clusters[i]);
    data.push_back(calibration::calibration_data(runs[i].run, runs[i].target.model, runs[i].target.config,
                                                 base, runs[i].target.step));
    idle_s += data.back().idle_s;
    for (const calibration::TracedRank& rank : runs[i].run.ranks)
      for (const calibration::TracedIteration& it : rank.iterations)
        step_s += it.step_s / double(rank.iterations.size());
  }
  const std::string gpu = clusters.front().gpu.name;
  calibration::FittedCalibration fitted = calibration::fit_calibration(data, gpu);
  if (fitted.calibration.classes().empty())
    throw UserError(
        "--run: the traced runs hold no compute op with a measured time; trace a training run "
        "with megatune train --trace-dir");
  std::int64_t id = 0;
  {
    cost_models::Transaction transaction(database);
    id = cost_models::insert_calibration(database, fitted.record);
    transaction.commit();
  }
  out << "calibrated " << gpu << " from " << runs.size() << " traced run" << (runs.size() == 1 ? "" : "s")
      << " (" << fitted.record.n_ops << " compute ops): calibrations row " << id << " in " << database.path()
      << "\n";
  print_classes(fitted.calibration, out);
  char line[320];
  std::snprintf(
      line, sizeof line,
      "  gap per compute op %.2f us: no op running %.1f%% of the measured steps (host work, "
      "launch gaps, work the step program does not list)\n"
      "  fitted ops' time error (sum |pred - meas| / sum meas): %.1f%% uncalibrated, %.1f%% calibrated "
      "(in-sample; held out: megatune compare --leave-one-out)\n",
      fitted.calibration.gap_per_compute_op_s() * 1e6, step_s > 0 ? 100 * idle_s / step_s : 0.0,
      100 * fitted.record.op_error_before, 100 * fitted.record.op_error_after);
  out << line;
  if (!fitted.calibration.shape_residuals().empty()) {
    double low = 1e300, high = 0;
    for (const auto& [key, residual] : fitted.calibration.shape_residuals())
      low = std::min(low, residual), high = std::max(high, residual);
    std::snprintf(line, sizeof line,
                  "  %zu traced shapes keep their own residual on top of their class (%.2fx to %.2fx)\n",
                  fitted.calibration.shape_residuals().size(), low, high);
    out << line;
  }
  out << "simulate, plan and compare on " << gpu
      << " now price with it from this database (--no-calibration leaves it out)\n";
}

}  // namespace megatune::tools
