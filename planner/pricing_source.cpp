// PricingSource: opens the cost database the user named (or the default one) or falls back to the
// embedded catalog.
#include "planner/pricing_source.h"

#include <filesystem>

#include "cost_models/cost_database.h"
#include "layouts/input_file.h"
#include "layouts/user_error.h"

namespace megatune::planner {

namespace {

// "H200 SXM: 412 GEMM, 30 attention, 120 memory-bound, 126 collective measurements; 20 fits", or, with no
// measurements for the cluster's GPU, "H100 SXM datasheet figures; analytic prices".
std::string describe_sources(const cost_models::CostModel& model) {
  const cost_models::CostModelSources& s = model.sources();
  const std::string& gpu = model.gpu().name;
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

}  // namespace

PricingSource open_pricing_source(const std::string& database_path, const cost_models::ClusterSpec& cluster) {
  PricingSource source;
  std::string path = database_path;
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
  if (path.empty()) {
    source.cost_model = cost_models::CostModel::from_embedded(cluster);
    source.description = "embedded data: " + describe_sources(*source.cost_model);
    return source;
  }
  cost_models::CostDatabaseOpenOptions options;
  options.create_if_missing = false;
  options.read_only = true;
  source.database.emplace(cost_models::open_cost_database(path, options));
  source.cost_model = std::make_unique<cost_models::CostModel>(*source.database, cluster);
  source.description = path + ": " + describe_sources(*source.cost_model);
  return source;
}

}  // namespace megatune::planner
