// PricingSource: opens the cost database the user named (or the default one) or falls back to the
// embedded catalog.
#include "planner/pricing_source.h"

#include <cstdio>
#include <filesystem>

#include "base/input_file.h"
#include "base/user_error.h"
#include "cost_models/calibration_store.h"
#include "cost_models/cost_database.h"
#include "cost_models/embedded_data.h"

namespace megatune::planner {

namespace {

// "H200 SXM: 412 GEMM, 30 attention, 120 memory-bound, 126 collective measurements; 20 fits", or, with no
// measurements for the cluster's GPU, "H100 SXM datasheet figures; analytic prices", or, when another
// GPU's kernel measurements were transferred, "A100 SXM 80GB: GEMM, attention, memory-bound transferred
// from H200 SXM measurements scaled by peak FLOP/s and bandwidth; collectives analytic".
std::string describe_sources(const cost_models::CostModel& model) {
  const cost_models::CostModelSources& s = model.sources();
  const std::string& gpu = model.gpu().name;
  if (!s.kernels_transferred_from.empty()) {
    return gpu + " (" + model.gpu().source + " figures): GEMM, attention, memory-bound transferred from " +
           s.kernels_transferred_from + " measurements scaled by peak FLOP/s and bandwidth; collectives " +
           (s.collective_measurements > 0
                ? "from " + std::to_string(s.collective_measurements) + " measurements"
                : std::string("analytic (") + model.cluster().intra_node.name + ", " +
                      model.cluster().inter_node.name + " datasheet figures)");
  }
  const int measurements = s.gemm_measurements + s.attention_measurements + s.memory_bound_measurements +
                           s.collective_measurements;
  if (measurements == 0 && s.stored_fits == 0) {
    return gpu + " " + model.gpu().source + " figures; analytic prices (no measurements for this GPU)";
  }
  return gpu + ": " + std::to_string(s.gemm_measurements) + " GEMM, " +
         std::to_string(s.attention_measurements) + " attention, " +
         std::to_string(s.memory_bound_measurements) + " memory-bound, " +
         std::to_string(s.collective_measurements) + " collective measurements; " +
         std::to_string(s.stored_fits + s.in_memory_fits) + " fits";
}

bool holds_no_measurement(cost_models::Database& database) {
  return database.query_int64("SELECT count(*) FROM kernel_timings") == 0 &&
         database.query_int64("SELECT count(*) FROM collective_timings") == 0 &&
         database.query_int64("SELECT count(*) FROM fitted_models") == 0 &&
         database.query_int64("SELECT count(*) FROM calibrations") == 0;
}

}  // namespace

std::string apply_stored_calibration(cost_models::Database& database, cost_models::CostModel& model,
                                     bool use) {
  const std::optional<cost_models::CalibrationRecord> row =
      cost_models::load_latest_calibration(database, model.gpu_names());
  if (!row) return "";
  const std::string where = "row " + std::to_string(row->id) + ", " + row->calibrated_at;
  if (!use) return "; calibration off (--no-calibration; " + where + " not applied)";
  try {
    model.set_calibration(cost_models::Calibration::from_json(row->params_json));
  } catch (const std::exception& error) {
    throw UserError("cost database " + database.path() + ": calibration " + where + " is unreadable (" +
                    error.what() + "); run `megatune db calibrate` again, or pass --no-calibration");
  }
  return "; calibrated from " + std::to_string(row->n_runs) + " traced run" + (row->n_runs == 1 ? "" : "s") +
         " (" + where + "): " + model.calibration()->summary();
}

PricingSource open_pricing_source(const std::string& database_path, const cost_models::ClusterSpec& cluster,
                                  bool use_calibration) {
  PricingSource source;
  std::string path = database_path;
  std::string skipped_default;  // the default database, left out because it holds no measurement
  if (path.empty()) {
    const std::string fallback = cost_models::default_cost_database_path();
    std::error_code ec;
    if (std::filesystem::is_regular_file(fallback, ec)) path = fallback;
  } else {
    const std::string reason = non_regular_file_reason(path);
    if (reason == "does not exist") {
      throw UserError("--db " + path +
                      ": no such file; create it with `megatune db import` or `megatune profile`, "
                      "or leave --db out to price from the embedded catalog");
    }
    if (!reason.empty()) throw UserError("--db " + path + " " + reason + "; give a cost database file");
  }
  cost_models::CostDatabaseOpenOptions options;
  options.create_if_missing = false;
  options.read_only = true;
  if (!path.empty()) source.database.emplace(cost_models::open_cost_database(path, options));
  // The default database (not one named with --db) that holds no measurement at all, e.g. created by an
  // interrupted profile, would price everything from the catalog's peaks: the embedded profile is better.
  if (database_path.empty() && source.database && holds_no_measurement(*source.database)) {
    skipped_default = path + " holds no measurement, so ";
    source.database.reset();
    path.clear();
  }
  if (path.empty()) {
    cost_models::Database embedded = cost_models::open_embedded_cost_database();
    source.cost_model = std::make_unique<cost_models::CostModel>(embedded, cluster);
    source.description = skipped_default + "embedded data: " + describe_sources(*source.cost_model) +
                         apply_stored_calibration(embedded, *source.cost_model, use_calibration);
    return source;
  }
  source.cost_model = std::make_unique<cost_models::CostModel>(*source.database, cluster);
  source.description = path + ": " + describe_sources(*source.cost_model) +
                       apply_stored_calibration(*source.database, *source.cost_model, use_calibration);
  return source;
}

std::string fp8_pricing_description(const cost_models::CostModel& model) {
  // Kernels transferred from a profiled GPU: its FP8 prices (measured or from its bf16 ones), then scaled.
  if (const cost_models::CostModel* profiled = model.profiled_model()) {
    return fp8_pricing_description(*profiled) + "; scaled to " + model.gpu().name +
           " by peak FLOP/s and bandwidth";
  }
  const cost_models::GemmCostModel& gemm = model.gemm_model();
  const std::string& gpu = model.gpu().name;
  std::string text;
  if (gemm.prices_fp8_from_records()) {
    text = "FP8 GEMMs from " + std::to_string(gemm.samples(layouts::DType::kFP8).size()) +
           " fp8 measurements" + (gemm.has_fitted_surface(layouts::DType::kFP8) ? " and a fit" : "") +
           " of " + gpu;
  } else {
    char speedup[16];
    std::snprintf(speedup, sizeof speedup, "%.2f", gemm.fp8_speedup_over_bf16());
    text = "FP8 GEMMs transferred from the bf16 prices (" + std::string(speedup) +
           "x faster above the launch latency, at most to the FP8 roofline), low confidence: no fp8 GEMM "
           "measured on " +
           gpu + " (megatune profile --fp8-format measures them)";
  }
  const std::string casts = cost_models::memory_bound_series("elementwise", layouts::DType::kFP8);
  const cost_models::MemoryBoundCostModel& memory = model.memory_bound_model();
  const bool measured_casts = memory.measured().count(casts) > 0 || memory.has_fit(casts);
  return text + "; FP8 casts by their bytes, " +
         (measured_casts ? "from measured FP8 casts" : "from the element-wise kernels' model");
}

}  // namespace megatune::planner
