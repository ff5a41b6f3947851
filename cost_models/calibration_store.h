// Reads and writes of the calibrations table (records.h): appending a fitted calibration and loading the
// newest one of a GPU.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cost_models/records.h"
#include "cost_models/sqlite_database.h"

namespace megatune::cost_models {

// Appends a row; returns its id.
std::int64_t insert_calibration(Database& database, const CalibrationRecord& record);
// Every row, oldest first.
std::vector<CalibrationRecord> load_calibrations(Database& database);
// The newest row for any of `gpu_names` (a GPU's spellings); none when there is none, or when the database
// predates the calibrations table (schema version < 3, opened read-only).
std::optional<CalibrationRecord> load_latest_calibration(Database& database,
                                                         const std::vector<std::string>& gpu_names);

}  // namespace megatune::cost_models
