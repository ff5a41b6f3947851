// PricingSource: the cost model the CLI prices with: a cost database (--db, or the default database when
// it exists) or the data compiled into the binary, with a one-line description of where prices come from.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "cost_models/sqlite_database.h"

namespace megatune::planner {

struct PricingSource {
  std::optional<cost_models::Database> database;
  std::unique_ptr<cost_models::CostModel> cost_model;
  std::string
      description;  // "embedded catalog (datasheet figures, analytic prices)" or "<path>: 412 GEMM ..."
};

// `database_path` empty: the default database (cost_models::default_cost_database_path) when that file
// exists, else the embedded data. A given path must exist (UserError naming it otherwise). With
// `use_calibration`, the newest calibration of the cluster's GPU (megatune db calibrate) corrects the prices
// and the description says so; without it, the description says that a stored calibration was left out.
PricingSource open_pricing_source(const std::string& database_path, const cost_models::ClusterSpec& cluster,
                                  bool use_calibration = true);
// How FP8 work is priced, for the "priced from" line of an FP8 run: GEMMs from the GPU's fp8 records, or
// transferred from its bf16 prices (cost_models/gemm_cost_model.h) and said to be of low confidence; casts
// by their bytes, from measured FP8 casts or the element-wise kernels' model.
std::string fp8_pricing_description(const cost_models::CostModel& model);
// The description's calibration clause ("; calibrated from 12 traced runs (row 3, 2026-12-01T12:00:00Z):
// gemm 1.12x, ...") for the newest calibration of the model's GPU in `database`, applying it to the model
// when `use` holds; "" when the database holds none.
std::string apply_stored_calibration(cost_models::Database& database, cost_models::CostModel& model,
                                     bool use);

}  // namespace megatune::planner
