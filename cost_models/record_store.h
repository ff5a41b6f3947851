// Typed reads and writes of cost-database rows (records.h). Writes are upserts keyed by each table's
// natural key, so a re-measure replaces the old row. Each call is one statement; wrap many in a
// Transaction for speed and atomicity.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cost_models/records.h"
#include "cost_models/sqlite_database.h"

namespace megatune::cost_models {

void upsert_gpu_model(Database& database, const GpuModel& gpu);
std::vector<GpuModel> load_gpu_models(Database& database);

void upsert_interconnect(Database& database, const Interconnect& interconnect);
std::vector<Interconnect> load_interconnects(Database& database);

void upsert_kernel_timing(Database& database, const KernelTiming& timing);
// All rows for `gpu` (every GPU when empty), ordered by op_kind and shape.
std::vector<KernelTiming> load_kernel_timings(Database& database, const std::string& gpu = "");

void upsert_collective_timing(Database& database, const CollectiveTiming& timing);
std::vector<CollectiveTiming> load_collective_timings(Database& database, const std::string& gpu = "");

void upsert_fitted_model(Database& database, const FittedModel& model);
std::vector<FittedModel> load_fitted_models(Database& database, const std::string& gpu = "");

// Returns the plan's id (the existing id when the natural key matched).
std::int64_t upsert_plan(Database& database, const PlanRecord& plan);
std::vector<PlanRecord> load_plans(Database& database);

// Appends a run; returns its id.
std::int64_t insert_run(Database& database, const RunRecord& run);
std::vector<RunRecord> load_runs(Database& database);
void upsert_run_op(Database& database, const RunOp& op);
std::vector<RunOp> load_run_ops(Database& database, std::int64_t run_id);

// Rows per table, in cost_database_tables() order.
std::vector<std::pair<std::string, std::int64_t>> table_row_counts(Database& database);

}  // namespace megatune::cost_models
