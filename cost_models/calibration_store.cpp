// The calibrations table: append, load all, load the newest of a GPU.
#include "cost_models/calibration_store.h"

namespace megatune::cost_models {
namespace {

constexpr const char* kColumns =
    "id, gpu, params_json, runs_json, n_runs, n_ops, op_error_before, op_error_after, calibrated_at";

CalibrationRecord read_row(Statement& statement) {
  CalibrationRecord row;
  row.id = statement.column_int64(0);
  row.gpu = statement.column_text(1);
  row.params_json = statement.column_text(2);
  row.runs_json = statement.column_text(3);
  row.n_runs = static_cast<int>(statement.column_int64(4));
  row.n_ops = static_cast<int>(statement.column_int64(5));
  row.op_error_before = statement.column_double(6);
  row.op_error_after = statement.column_double(7);
  row.calibrated_at = statement.column_text(8);
  return row;
}

}  // namespace

std::int64_t insert_calibration(Database& database, const CalibrationRecord& record) {
  Statement statement(
      database,
      "INSERT INTO calibrations (gpu, params_json, runs_json, n_runs, n_ops, op_error_before, "
      "op_error_after, calibrated_at) VALUES (:gpu, :params, :runs, :n_runs, :n_ops, :before, "
      ":after, :at)");
  statement.bind(":gpu", record.gpu);
  statement.bind(":params", record.params_json);
  statement.bind(":runs", record.runs_json);
  statement.bind(":n_runs", record.n_runs);
  statement.bind(":n_ops", record.n_ops);
  statement.bind(":before", record.op_error_before);
  statement.bind(":after", record.op_error_after);
  statement.bind(":at", record.calibrated_at.empty() ? utc_now_iso8601() : record.calibrated_at);
  statement.run();
  return database.last_insert_rowid();
}

std::vector<CalibrationRecord> load_calibrations(Database& database) {
  Statement statement(database, std::string("SELECT ") + kColumns + " FROM calibrations ORDER BY id");
  std::vector<CalibrationRecord> rows;
  while (statement.step()) rows.push_back(read_row(statement));
  return rows;
}

std::optional<CalibrationRecord> load_latest_calibration(Database& database,
                                                         const std::vector<std::string>& gpu_names) {
  if (database.query_int64("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='calibrations'") ==
      0)
    return std::nullopt;
  std::optional<CalibrationRecord> newest;
  for (const std::string& gpu : gpu_names) {
    Statement statement(database, std::string("SELECT ") + kColumns +
                                      " FROM calibrations WHERE gpu = ? ORDER BY id DESC LIMIT 1");
    statement.bind(1, gpu);
    if (statement.step() && (!newest || statement.column_int64(0) > newest->id)) newest = read_row(statement);
  }
  return newest;
}

}  // namespace megatune::cost_models
