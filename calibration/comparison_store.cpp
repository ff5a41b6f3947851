// save_runs: a run comparison's ranks and ops into the cost database's runs and run_ops tables.
#include "calibration/comparison_store.h"

#include <algorithm>
#include <filesystem>

#include "cost_models/cost_database.h"
#include "cost_models/record_store.h"

namespace megatune::calibration {

void save_runs(const RunComparison& comparison, const MeasuredRun& run, const std::string& db,
               std::ostream& out) {
  const std::string path = db.empty() ? cost_models::default_cost_database_path() : db;
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  cost_models::Database database = cost_models::open_cost_database(path);
  cost_models::Transaction transaction(database);
  std::vector<std::int64_t> ids;
  std::size_t ops = 0;
  for (const RankComparison& r : comparison.ranks) {
    cost_models::RunRecord record;
    record.predicted_step_time_s = r.predicted_step_s;
    record.measured_step_time_s = r.measured_step_s;
    record.predicted_mfu = comparison.predicted_mfu;
    record.measured_mfu = std::max(0.0, comparison.measured_mfu);
    record.gpu = run.gpu.empty() ? run.backend : run.gpu;
    record.started_at = run.created_utc;
    ids.push_back(cost_models::insert_run(database, record));
    for (const ComparedOp& o : r.ops)
      cost_models::upsert_run_op(
          database, {ids.back(), o.id, layouts::to_string(o.op), std::max(0.0, o.predicted_s), o.measured_s});
    ops += r.ops.size();
  }
  transaction.commit();
  out << "saved " << ids.size() << " run" << (ids.size() == 1 ? "" : "s") << " (ids " << ids.front() << "-"
      << ids.back() << ", one per rank) with " << ops << " ops into " << path << "\n";
}

}  // namespace megatune::calibration
