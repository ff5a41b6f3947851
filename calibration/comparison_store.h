// `megatune compare --save`: a comparison kept in the cost database, one `runs` row per traced rank with its
// per-op predicted and measured times (`run_ops`, by step-program id).
#pragma once
#include <ostream>
#include <string>

#include "calibration/measured_run.h"
#include "calibration/run_comparison.h"

namespace megatune::calibration {

// Stores every rank of `comparison` in the database at `db` (the default cost database when empty; its folder
// is created) in one transaction and says so in one line on `out`.
void save_runs(const RunComparison& comparison, const MeasuredRun& run, const std::string& db,
               std::ostream& out);

}  // namespace megatune::calibration
