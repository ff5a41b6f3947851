// Measurement data shipped in the binary (e.g. the H200 profile): every cost_models/data/<name>.<table>.csv
// or <name>_<table>.csv (e.g. h200_profile_kernel_timings.csv, as `megatune db export` writes it) is compiled
// in at build time and loaded, after the hardware catalog, into each embedded database, so `megatune plan`
// prices ops from real measurements on a machine with no GPU and no user database.
#pragma once
#include <string>
#include <vector>

#include "cost_models/sqlite_database.h"

namespace megatune::cost_models {

struct EmbeddedTable {
  std::string table;        // cost-database table, e.g. "kernel_timings"
  std::string source_name;  // the shipped file, for error messages:
                            // "cost_models/data/h200_profile.kernel_timings.csv"
  std::string csv_text;     // CSV with a header row (table_io.h)
};

// Every shipped table, in the order they are loaded (parents before children, then by file name).
const std::vector<EmbeddedTable>& embedded_tables();

// Writes the embedded hardware catalog and every shipped table into `database` (upserts: rows with the
// same natural key are replaced, measured GPU rows are kept). Returns the rows written.
std::int64_t install_embedded_data(Database& database);

// A fresh in-memory cost database holding the catalog and the shipped measurements.
Database open_embedded_cost_database();

}  // namespace megatune::cost_models
