// `megatune db calibrate --run DIR...`: fit corrections from traced runs (calibration/calibration_fit.h) and
// append them, with their provenance, to the cost database's calibrations table; simulate, plan and
// compare price with the newest one of a GPU unless given --no-calibration.
#pragma once
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "cost_models/sqlite_database.h"

namespace megatune::tools {

struct CalibrateOptions {
  std::vector<std::string> runs;  // --run DIR [DIR...]
  // --cluster: the GPU whose prices are corrected (default: each run's own cluster). Required for a CPU run,
  // whose times are the CPU backend's, together with an explicit --db.
  std::string cluster;
  bool database_given = false;  // --db was passed
};

// Reads and checks every run first, then opens the database (`open_database`) and appends the calibration.
// UserError on bad input.
void run_calibrate(const CalibrateOptions& options,
                   const std::function<cost_models::Database()>& open_database, std::ostream& out);

}  // namespace megatune::tools
