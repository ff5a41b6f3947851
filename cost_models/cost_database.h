// The megatune cost database: opening a file with its schema checked or created and migrated, the default
// path, and the description of every table (used by import/export and `megatune db info`).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cost_models/sqlite_database.h"

namespace megatune::cost_models {

// PRAGMA application_id of a megatune database ("MGTN"); any other non-zero id is a foreign file.
inline constexpr std::int32_t kCostDatabaseApplicationId = 0x4D47544E;
// PRAGMA user_version written by this build. Version 1: hardware and measurement tables; version 2: plans,
// runs and run_ops; version 3: calibrations.
inline constexpr int kCostDatabaseSchemaVersion = 3;

struct CostDatabaseOpenOptions {
  bool create_if_missing = true;
  bool read_only = false;  // never migrates; an older schema is read as it is
  // Migrate only up to this version (tests use it to build an older database); 0 = current.
  int target_schema_version = 0;
  int busy_timeout_ms = 30000;
};

// Opens (or creates) a cost database and brings its schema to the current version, all migration steps in
// one IMMEDIATE transaction (safe when several processes open a new file at once). Throws UserError, one
// line naming the file and the fix, for: a file that is not a database or is corrupt/truncated, a SQLite
// file of another application, a schema written by a newer megatune, a missing file with
// create_if_missing false, an unwritable location. Never overwrites a foreign or damaged file.
Database open_cost_database(const std::string& path, const CostDatabaseOpenOptions& options = {});

// An in-memory database with the current schema (tests; the embedded catalog).
Database open_in_memory_cost_database();

// Schema version of an open database (PRAGMA user_version).
int schema_version(Database& database);

// $MEGATUNE_DB if set, else $XDG_CACHE_HOME/megatune/costs.db, else ~/.cache/megatune/costs.db.
std::string default_cost_database_path();

// Column of a table as import/export and `db info` see it.
struct ColumnDescription {
  std::string name;
  enum class Type { kInteger, kReal, kText } type;
  bool required;  // must be present in an imported row (natural-key and measurement columns)
};

struct TableDescription {
  std::string name;
  std::vector<ColumnDescription> columns;  // every column except the rowid
  std::vector<std::string> natural_key;    // upsert conflict target (empty: rows are appended)
  std::string order_by;                    // export order
};

// Every table of the current schema, in dependency order (parents before children).
const std::vector<TableDescription>& cost_database_tables();
// Throws UserError naming the valid table names when `name` is unknown.
const TableDescription& cost_database_table(const std::string& name);

}  // namespace megatune::cost_models
