// Import and export of cost-database tables as CSV (header row = column names) or JSON (an array of objects,
// or {"rows": [...]}). Import validates every row against the table's columns and types and is
// all-or-nothing: one bad row is a UserError "FILE:LINE: column C: problem" and nothing is written.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>

#include "cost_models/sqlite_database.h"

namespace megatune::cost_models {

enum class TableFormat { kCsv, kJson };

// "csv" | "json" (throws UserError otherwise); from_path uses the file extension.
TableFormat table_format_from_name(const std::string& name);
TableFormat table_format_from_path(const std::string& path);

// Imports `text` (read from `source_name`, used in error messages) into `table` in one IMMEDIATE
// transaction; rows upsert by the table's natural key. Returns the number of rows imported.
std::int64_t import_table_text(Database& database, const std::string& table, TableFormat format,
                               const std::string& text, const std::string& source_name);
// Reads `path` and imports it; the format comes from its extension unless given.
std::int64_t import_table_file(Database& database, const std::string& table, const std::string& path);

// Writes every row of `table` (in the table's export order) to `out`. CSV quotes fields per RFC 4180;
// NULL is an empty field. JSON is an array of objects with NULL as null. Returns the number of rows.
std::int64_t export_table(Database& database, const std::string& table, TableFormat format,
                          std::ostream& out);

}  // namespace megatune::cost_models
