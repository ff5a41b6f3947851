// measure_top_candidates: each candidate trained as a traced `megatune train` child; the
// predicted-vs-measured table, the calibration fitted from the traces, the re-simulation with it and the
// re-ranking are calibration/measured_candidates.h's.
#include "tools/measure_top.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "base/user_error.h"
#include "calibration/measured_candidates.h"
#include "cost_models/calibration_store.h"
#include "cost_models/cost_database.h"
#include "planner/plan_report.h"
#include "tools/fp8_flags.h"
#include "tools/timed_child.h"
#include "tools/traced_run_target.h"

namespace megatune::tools {
namespace {

using calibration::CandidateMeasurement;

// The folder the traced runs go to: --measure-keep's, or a temporary removed at destruction.
class MeasureFolder {
 public:
  explicit MeasureFolder(const std::string& keep_dir) : keep_(!keep_dir.empty()) {
    if (keep_) {
      path_ = keep_dir;
      std::error_code ec;
      std::filesystem::create_directories(path_, ec);
      if (ec || !std::filesystem::is_directory(path_))
        throw UserError("--measure-keep " + keep_dir + ": cannot create that folder (" + ec.message() +
                        "); name a writable folder");
      return;
    }
    std::string pattern = (std::filesystem::temp_directory_path() / "megatune-measure-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw UserError("--measure-top: cannot create a temporary folder in " +
                      std::filesystem::temp_directory_path().string() +
                      "; set TMPDIR or pass --measure-keep DIR");
    path_ = pattern;
  }
  ~MeasureFolder() {
    std::error_code ec;
    if (!keep_) std::filesystem::remove_all(path_, ec);
  }
  MeasureFolder(const MeasureFolder&) = delete;
  MeasureFolder& operator=(const MeasureFolder&) = delete;
  const std::string& path() const { return path_; }
  bool kept() const { return keep_; }

 private:
  bool keep_;
  std::string path_;
};

std::vector<std::string> train_command(const MeasureTopOptions& o, const layouts::ModelSpec& model,
                                       const planner::PlanCandidate& candidate,
                                       const std::string& trace_dir) {
  std::vector<std::string> args = {"train"};
  for (std::string& a : planner::megatune_train_arguments(model, candidate)) args.push_back(std::move(a));
  for (const std::string& a :
       {std::string("--mock-data"), std::string("--bf16"), std::string("--device"), o.device,
        std::string("--train-iters"), std::to_string(o.iterations), std::string("--trace-dir"), trace_dir,
        std::string("--trace-iterations"), measure_trace_window(o.iterations), std::string("--nproc"),
        std::to_string(candidate.config.world_size)})
    args.push_back(a);
  for (std::string& a : fp8_flag_arguments(o.fp8)) args.push_back(std::move(a));
  return args;
}

std::string failure_line(const ChildOutcome& c, const MeasureTopOptions& o) {
  char head[160];
  if (c.timed_out)
    std::snprintf(head, sizeof head, "killed after %.0f s (raise --measure-timeout, now %g s)", c.seconds,
                  o.timeout_s);
  else if (c.signal)
    std::snprintf(head, sizeof head, "ended by signal %d", c.signal);
  else
    std::snprintf(head, sizeof head, "exit %d", c.exit_code);
  return std::string(head) + (c.last_line.empty() || c.timed_out ? "" : ": " + c.last_line);
}

// Runs one candidate; on failure prints one line and leaves m.measured false.
void measure_one(const MeasureTopOptions& o, const layouts::ModelSpec& model,
                 const planner::PlanCandidate& candidate, CandidateMeasurement& m, std::ostream& out) {
  const std::string log = m.trace_dir + ".log";
  const ChildOutcome child =
      run_self_with_timeout(train_command(o, model, candidate, m.trace_dir), log, o.timeout_s);
  const std::string name = "  #" + std::to_string(m.plan_index + 1) + " " + planner::describe(candidate);
  if (child.exit_code != 0) {
    m.failure = failure_line(child, o);
    out << name << ": failed, dropped (" << m.failure << ")\n";
    return;
  }
  try {
    TracedRunTarget t = read_traced_run(m.trace_dir);
    m.run = calibration::CalibrationCase{std::move(t.run), std::move(t.target.model),
                                         std::move(t.target.config), std::move(t.target.step)};
  } catch (const UserError& e) {
    m.failure = std::string("trace unreadable: ") + e.what();
    out << name << ": its trace is unreadable, dropped (" << e.what() << ")\n";
    return;
  }
  m.measured_step_s = calibration::measured_step_s(m.run->run);
  m.measured = m.measured_step_s > 0;
  if (!m.measured) {
    m.failure = "no timed iteration in the trace";
    out << name << ": its trace holds no timed iteration, dropped\n";
    return;
  }
  // Same FLOPs and peak as the prediction's MFU: the cluster's GPU peak.
  m.measured_mfu = candidate.simulation.mfu * candidate.simulation.step_time_s / m.measured_step_s;
  char line[160];
  std::snprintf(line, sizeof line, ": %.4f s per step measured (run took %.1f s)\n", m.measured_step_s,
                child.seconds);
  out << name << line;
}

// Where the calibration is stored: --db when named; the default database with --save, from a GPU run only.
std::string calibration_store_path(const MeasureTopOptions& o, std::ostream& out) {
  if (!o.db.empty()) return o.db;
  if (!o.save) {
    out << "  not stored (--save stores it in the default database, --db FILE in that one)\n";
    return "";
  }
  if (o.device == "cpu") {
    out << "  not stored: a CPU run's times are the CPU backend's; keep them in a database of their own "
           "with --db FILE\n";
    return "";
  }
  return cost_models::default_cost_database_path();
}

void store_calibration(const calibration::FittedCalibration& fitted, const MeasureTopOptions& o,
                       std::ostream& out) {
  const std::string path = calibration_store_path(o, out);
  if (path.empty()) return;
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  cost_models::Database database = cost_models::open_cost_database(path);
  if (database.read_only())
    throw UserError("cost database " + database.path() + " is not writable; pass a writable one with --db");
  cost_models::Transaction transaction(database);
  const std::int64_t id = cost_models::insert_calibration(database, fitted.record);
  transaction.commit();
  out << "  stored as calibrations row " << id << " in " << path << "\n";
}

}  // namespace

std::string measure_trace_window(int iterations) {
  const int count = std::clamp(iterations - 1, 1, 3);
  return std::to_string(iterations - count + 1) + ":" + std::to_string(count);
}

MeasureTopResult measure_top_candidates(const MeasureTopOptions& o, const layouts::ModelSpec& model,
                                        const cost_models::ClusterSpec& cluster,
                                        const planner::PlanResult& result,
                                        const layouts::StepProgramOptions& step,
                                        cost_models::CostModel& pricing, std::ostream& out) {
  const std::size_t k = std::min<std::size_t>(std::size_t(o.candidates), result.ranked.size());
  MeasureFolder folder(o.keep_dir);
  out << "\nmeasuring the top " << k << " candidates on " << cluster.short_name() << " with --device "
      << o.device << ": megatune train --mock-data, " << o.iterations << " iterations, traced "
      << measure_trace_window(o.iterations) << " (START:COUNT), each within " << o.timeout_s << " s\n";
  out.flush();
  std::vector<CandidateMeasurement> ms(k);
  for (std::size_t i = 0; i < k; ++i) {
    ms[i].plan_index = i;
    ms[i].trace_dir = folder.path() + "/rank" + std::to_string(i + 1);
    measure_one(o, model, result.ranked[i], ms[i], out);
    out.flush();
  }
  std::vector<CandidateMeasurement*> order;
  for (CandidateMeasurement& m : ms)
    if (m.measured) order.push_back(&m);
  if (order.empty())
    throw UserError("--measure-top " + std::to_string(o.candidates) + ": none of the " + std::to_string(k) +
                    " candidates ran (see the lines above); fix their cause or raise --measure-timeout");
  calibration::print_measured_table(ms, result, out);
  const calibration::FittedCalibration fitted =
      calibration::calibrate_and_resimulate(ms, result, step, pricing, out);
  if (!fitted.calibration.classes().empty()) store_calibration(fitted, o, out);
  std::stable_sort(order.begin(), order.end(),
                   [](const CandidateMeasurement* a, const CandidateMeasurement* b) {
                     return a->measured_step_s < b->measured_step_s;
                   });
  calibration::print_reranked(order, result, out);
  if (folder.kept()) out << "\ntraced runs kept in " << folder.path() << " (megatune compare --run DIR)\n";
  return {order.front()->plan_index, calibration::measurements_json(ms, result)};
}

}  // namespace megatune::tools
