// Opening a cost database: recognizing foreign, newer and damaged files, creating and migrating the schema,
// and the table descriptions used by import/export.
#include "cost_models/cost_database.h"

#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>

#include "base/user_error.h"

namespace megatune::cost_models {
namespace {

constexpr const char* kVersionColumns =
    "driver_version TEXT NOT NULL DEFAULT '', cuda_version TEXT NOT NULL DEFAULT '', "
    "cublas_version TEXT NOT NULL DEFAULT '', nccl_version TEXT NOT NULL DEFAULT '', "
    "commit_hash TEXT NOT NULL DEFAULT ''";

// Migration step i brings the schema from version i to i + 1.
std::string migration_sql(int from_version) {
  const std::string versions = kVersionColumns;
  if (from_version == 0) {
    return R"sql(
CREATE TABLE gpu_models (
  name TEXT PRIMARY KEY NOT NULL,
  peak_bf16_tflops REAL NOT NULL CHECK (peak_bf16_tflops > 0),
  peak_fp16_tflops REAL NOT NULL DEFAULT 0 CHECK (peak_fp16_tflops >= 0),
  peak_fp8_tflops REAL NOT NULL DEFAULT 0 CHECK (peak_fp8_tflops >= 0),
  peak_tf32_tflops REAL NOT NULL DEFAULT 0 CHECK (peak_tf32_tflops >= 0),
  peak_fp32_tflops REAL NOT NULL DEFAULT 0 CHECK (peak_fp32_tflops >= 0),
  memory_bytes INTEGER NOT NULL CHECK (memory_bytes > 0),
  hbm_bandwidth_bytes_per_s REAL NOT NULL CHECK (hbm_bandwidth_bytes_per_s > 0),
  default_intra_node_interconnect TEXT NOT NULL DEFAULT '',
  default_inter_node_interconnect TEXT NOT NULL DEFAULT '',
  default_gpus_per_node INTEGER NOT NULL DEFAULT 8 CHECK (default_gpus_per_node > 0),
  source TEXT NOT NULL DEFAULT 'datasheet' CHECK (source IN ('datasheet', 'measured')));
CREATE TABLE interconnects (
  name TEXT PRIMARY KEY NOT NULL,
  kind TEXT NOT NULL CHECK (kind IN ('intra_node', 'inter_node')),
  domain_size INTEGER NOT NULL DEFAULT 0 CHECK (domain_size >= 0),
  bandwidth_per_direction_bytes_per_s REAL NOT NULL CHECK (bandwidth_per_direction_bytes_per_s > 0),
  latency_s REAL NOT NULL DEFAULT 0 CHECK (latency_s >= 0),
  source TEXT NOT NULL DEFAULT 'datasheet' CHECK (source IN ('datasheet', 'measured')));
CREATE TABLE kernel_timings (
  id INTEGER PRIMARY KEY,
  op_kind TEXT NOT NULL,
  m INTEGER NOT NULL DEFAULT 0, n INTEGER NOT NULL DEFAULT 0, k INTEGER NOT NULL DEFAULT 0,
  batch INTEGER NOT NULL DEFAULT 0, heads INTEGER NOT NULL DEFAULT 0, kv_heads INTEGER NOT NULL DEFAULT 0,
  seq_q INTEGER NOT NULL DEFAULT 0, seq_kv INTEGER NOT NULL DEFAULT 0, head_dim INTEGER NOT NULL DEFAULT 0,
  causal INTEGER NOT NULL DEFAULT 0 CHECK (causal IN (0, 1)),
  bytes INTEGER NOT NULL DEFAULT 0,
  dtype TEXT NOT NULL DEFAULT 'bf16' CHECK (dtype IN ('bf16', 'fp16', 'fp8', 'tf32', 'fp32')),
  gpu TEXT NOT NULL,
  )sql" + versions +
           R"sql(,
  median_s REAL NOT NULL CHECK (median_s > 0),
  min_s REAL, max_s REAL,
  repeats INTEGER NOT NULL DEFAULT 1,
  measured_at TEXT NOT NULL DEFAULT '',
  UNIQUE (op_kind, m, n, k, batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, bytes, dtype, gpu,
          driver_version, cuda_version, cublas_version, nccl_version, commit_hash));
CREATE INDEX kernel_timings_by_gpu ON kernel_timings (gpu, op_kind);
CREATE TABLE collective_timings (
  id INTEGER PRIMARY KEY,
  op TEXT NOT NULL CHECK (op IN ('all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all', 'send_recv', 'broadcast')),
  group_size INTEGER NOT NULL CHECK (group_size >= 1),
  placement TEXT NOT NULL DEFAULT 'intra' CHECK (placement IN ('intra', 'inter')),
  nodes INTEGER NOT NULL DEFAULT 1 CHECK (nodes >= 1),
  bytes INTEGER NOT NULL CHECK (bytes > 0),
  gpu TEXT NOT NULL,
  interconnect TEXT NOT NULL DEFAULT '',
  )sql" + versions +
           R"sql(,
  median_s REAL NOT NULL CHECK (median_s > 0),
  min_s REAL, max_s REAL,
  repeats INTEGER NOT NULL DEFAULT 1,
  measured_at TEXT NOT NULL DEFAULT '',
  UNIQUE (op, group_size, placement, nodes, bytes, gpu, interconnect,
          driver_version, cuda_version, cublas_version, nccl_version, commit_hash));
CREATE INDEX collective_timings_by_gpu ON collective_timings (gpu, op);
CREATE TABLE fitted_models (
  model_kind TEXT NOT NULL,
  gpu TEXT NOT NULL,
  variant TEXT NOT NULL DEFAULT '',
  params_json TEXT NOT NULL,
  r2 REAL NOT NULL DEFAULT 0,
  mape REAL NOT NULL DEFAULT 0,
  n_points INTEGER NOT NULL DEFAULT 0,
  fitted_at TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (model_kind, gpu, variant));
)sql";
  }
  if (from_version == 1) {
    return R"sql(
CREATE TABLE plans (
  id INTEGER PRIMARY KEY,
  model TEXT NOT NULL,
  cluster TEXT NOT NULL,
  config_json TEXT NOT NULL,
  predicted_step_time_s REAL NOT NULL DEFAULT 0,
  predicted_mfu REAL NOT NULL DEFAULT 0,
  peak_memory_bytes INTEGER NOT NULL DEFAULT 0,
  created_at TEXT NOT NULL DEFAULT '',
  UNIQUE (model, cluster, config_json));
CREATE TABLE runs (
  id INTEGER PRIMARY KEY,
  plan_id INTEGER REFERENCES plans (id) ON DELETE SET NULL,
  predicted_step_time_s REAL NOT NULL DEFAULT 0,
  measured_step_time_s REAL NOT NULL DEFAULT 0,
  predicted_mfu REAL NOT NULL DEFAULT 0,
  measured_mfu REAL NOT NULL DEFAULT 0,
  gpu TEXT NOT NULL DEFAULT '',
  )sql" + versions +
           R"sql(,
  started_at TEXT NOT NULL DEFAULT '');
CREATE TABLE run_ops (
  run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
  op_id INTEGER NOT NULL,
  op_text TEXT NOT NULL DEFAULT '',
  predicted_s REAL NOT NULL DEFAULT 0,
  measured_s REAL NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, op_id));
)sql";
  }
  if (from_version == 2) {
    return R"sql(
CREATE TABLE calibrations (
  id INTEGER PRIMARY KEY,
  gpu TEXT NOT NULL,
  params_json TEXT NOT NULL,
  runs_json TEXT NOT NULL DEFAULT '[]',
  n_runs INTEGER NOT NULL DEFAULT 0 CHECK (n_runs >= 0),
  n_ops INTEGER NOT NULL DEFAULT 0 CHECK (n_ops >= 0),
  op_error_before REAL NOT NULL DEFAULT 0,
  op_error_after REAL NOT NULL DEFAULT 0,
  calibrated_at TEXT NOT NULL DEFAULT '');
CREATE INDEX calibrations_by_gpu ON calibrations (gpu, id);
)sql";
  }
  throw std::logic_error("no cost-database migration from schema version " + std::to_string(from_version));
}

// SQLite's own message, without the call site: for one-line errors about a user's file.
std::string brief(const SqliteError& error) {
  return error.sqlite_message().empty() ? error.what() : error.sqlite_message();
}

// The file and its folder (SQLite writes -wal and -shm files next to it) can be written by this process.
bool writable(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return ::access(path.c_str(), W_OK) == 0 && ::access(parent.empty() ? "." : parent.c_str(), W_OK) == 0;
}

bool is_damage(const SqliteError& error) {
  return error.sqlite_code() == SQLITE_NOTADB || error.sqlite_code() == SQLITE_CORRUPT;
}

[[noreturn]] void throw_damaged(const std::string& path, const std::string& detail) {
  throw UserError(
      "cost database " + path + " is not a SQLite database or is damaged (" + detail +
      "); point --db (or $MEGATUNE_DB) at a megatune database, or move the file away to start a new one");
}

}  // namespace

int schema_version(Database& database) {
  return static_cast<int>(database.query_int64("PRAGMA user_version"));
}

Database open_cost_database(const std::string& path, const CostDatabaseOpenOptions& options) {
  namespace fs = std::filesystem;
  const bool in_memory = path.empty() || path == ":memory:";
  bool existed = false;
  if (!in_memory) {
    std::error_code error;
    const fs::file_status status = fs::status(path, error);
    existed = fs::exists(status);
    if (existed && fs::is_directory(status)) {
      throw UserError("cost database " + path + " is a directory; pass a file path with --db");
    }
    if (existed && !fs::is_regular_file(status)) {
      throw UserError("cost database " + path +
                      " is not a regular file (a FIFO or device); pass a database "
                      "file with --db");
    }
    if (!existed) {
      if (!options.create_if_missing || options.read_only) {
        throw UserError("cost database " + path + " does not exist; run `megatune db info --db " + path +
                        "` to create it, or fix the path");
      }
      const fs::path parent = fs::path(path).parent_path();
      if (!parent.empty() && !fs::exists(parent, error)) {
        fs::create_directories(parent, error);
        if (error) {
          throw UserError("cannot create the folder " + parent.string() + " for cost database " + path +
                          " (" + error.message() + "); pass a writable path with --db");
        }
      }
    }
  }
  const int target =
      options.target_schema_version > 0 ? options.target_schema_version : kCostDatabaseSchemaVersion;

  // A database the user may read but not write (a shared, read-only copy) is opened read-only: reading works,
  // and a command that writes says that the file is not writable.
  const bool read_only = options.read_only || (existed && !writable(path));
  DatabaseOpenOptions open_options;
  open_options.create_if_missing = options.create_if_missing;
  open_options.read_only = read_only;
  // Read-only without the WAL's -shm file beside it (and no right to create one): read it as immutable.
  std::error_code shm_error;
  open_options.immutable = read_only && !in_memory && !writable(path) &&
                           !fs::exists(path + "-shm", shm_error) && !fs::exists(path + "-wal", shm_error);
  open_options.busy_timeout_ms = options.busy_timeout_ms;
  std::optional<Database> opened;
  try {
    opened.emplace(in_memory ? std::string(":memory:") : path, open_options);
  } catch (const SqliteError& error) {
    throw UserError("cannot open cost database " + path + " (" + brief(error) +
                    "); check the path and its permissions, or pass another with --db");
  }
  Database& database = *opened;

  std::int64_t application_id = 0;
  int version = 0;
  std::int64_t objects = 0;
  try {
    // One read transaction, so that the header and the table list come from the same snapshot even while
    // another process creates the schema.
    Transaction snapshot(database, Transaction::Mode::kDeferred);
    objects = database.query_int64("SELECT count(*) FROM sqlite_master");
    application_id = database.query_int64("PRAGMA application_id");
    version = schema_version(database);
    if (existed && objects > 0) {
      Statement check(database, "PRAGMA quick_check");
      if (check.step()) {
        const std::string verdict = check.column_text(0);
        if (verdict != "ok") throw_damaged(path, "integrity check: " + verdict);
      }
    }
    snapshot.commit();
  } catch (const SqliteError& error) {
    if (is_damage(error)) throw_damaged(path, brief(error));
    throw;
  }
  if (application_id != 0 && application_id != kCostDatabaseApplicationId) {
    throw UserError("cost database " + path + " is a SQLite file of another application (application_id " +
                    std::to_string(application_id) +
                    "); pass a megatune cost database with --db, or a new path to create one");
  }
  if (application_id == 0 && objects > 0) {
    throw UserError(
        "cost database " + path +
        " is a SQLite file not written by megatune (it has tables but no megatune application_id); "
        "pass a new path with --db");
  }
  if (version > kCostDatabaseSchemaVersion) {
    throw UserError("cost database " + path + " has schema version " + std::to_string(version) +
                    ", written by a newer megatune (this one reads up to " +
                    std::to_string(kCostDatabaseSchemaVersion) + "); upgrade megatune or use another --db");
  }
  if (read_only) return std::move(*opened);

  try {
    if (!in_memory) {
      // Switching a new file to WAL needs the file to itself: while another process creating the schema holds
      // it, SQLite answers SQLITE_BUSY at once (no busy handler for this switch), so retry until the timeout.
      const auto deadline = std::chrono::steady_clock::now() +
                            std::chrono::milliseconds(std::max(options.busy_timeout_ms, 1000));
      for (;;) {
        try {
          Statement journal(database, "PRAGMA journal_mode=WAL");
          journal.run();
          break;
        } catch (const SqliteError& error) {
          if (error.sqlite_code() != SQLITE_BUSY || std::chrono::steady_clock::now() > deadline) throw;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
    }
    database.execute("PRAGMA foreign_keys=ON; PRAGMA synchronous=NORMAL");
    if (version < target) {
      Transaction transaction(database, Transaction::Mode::kImmediate);
      // Another process may have migrated between our read and the write lock: read again.
      version = schema_version(database);
      application_id = database.query_int64("PRAGMA application_id");
      if (application_id != 0 && application_id != kCostDatabaseApplicationId) {
        throw UserError("cost database " + path +
                        " became a foreign SQLite file while opening; use another --db");
      }
      for (int step = version; step < target; ++step) database.execute(migration_sql(step));
      if (version < target) {
        database.execute("PRAGMA application_id=" + std::to_string(kCostDatabaseApplicationId));
        database.execute("PRAGMA user_version=" + std::to_string(target));
      }
      transaction.commit();
    }
  } catch (const SqliteError& error) {
    if (is_damage(error)) throw_damaged(path, brief(error));
    if (error.sqlite_code() == SQLITE_READONLY || error.sqlite_code() == SQLITE_CANTOPEN ||
        error.sqlite_code() == SQLITE_PERM) {
      throw UserError("cost database " + path + " is not writable (" + brief(error) +
                      "); fix its permissions or pass another path with --db");
    }
    throw;
  }
  return std::move(*opened);
}

Database open_in_memory_cost_database() { return open_cost_database(":memory:"); }

std::string default_cost_database_path() {
  if (const char* explicit_path = std::getenv("MEGATUNE_DB");
      explicit_path != nullptr && *explicit_path != 0) {
    return explicit_path;
  }
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && *cache != 0) {
    return std::string(cache) + "/megatune/costs.db";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != 0) {
    return std::string(home) + "/.cache/megatune/costs.db";
  }
  throw UserError("no default cost database path: neither $MEGATUNE_DB nor $HOME is set; pass --db FILE");
}

const std::vector<TableDescription>& cost_database_tables() {
  using T = ColumnDescription::Type;
  static const std::vector<TableDescription> tables = [] {
    const std::vector<ColumnDescription> versions = {{"driver_version", T::kText, false},
                                                     {"cuda_version", T::kText, false},
                                                     {"cublas_version", T::kText, false},
                                                     {"nccl_version", T::kText, false},
                                                     {"commit_hash", T::kText, false}};
    auto with_versions = [&](std::vector<ColumnDescription> head, std::vector<ColumnDescription> tail) {
      head.insert(head.end(), versions.begin(), versions.end());
      head.insert(head.end(), tail.begin(), tail.end());
      return head;
    };
    const std::vector<ColumnDescription> timing_tail = {{"median_s", T::kReal, true},
                                                        {"min_s", T::kReal, false},
                                                        {"max_s", T::kReal, false},
                                                        {"repeats", T::kInteger, false},
                                                        {"measured_at", T::kText, false}};
    std::vector<TableDescription> all;
    all.push_back({"gpu_models",
                   {{"name", T::kText, true},
                    {"peak_bf16_tflops", T::kReal, true},
                    {"peak_fp16_tflops", T::kReal, false},
                    {"peak_fp8_tflops", T::kReal, false},
                    {"peak_tf32_tflops", T::kReal, false},
                    {"peak_fp32_tflops", T::kReal, false},
                    {"memory_bytes", T::kInteger, true},
                    {"hbm_bandwidth_bytes_per_s", T::kReal, true},
                    {"default_intra_node_interconnect", T::kText, false},
                    {"default_inter_node_interconnect", T::kText, false},
                    {"default_gpus_per_node", T::kInteger, false},
                    {"source", T::kText, false}},
                   {"name"},
                   "name"});
    all.push_back({"interconnects",
                   {{"name", T::kText, true},
                    {"kind", T::kText, true},
                    {"domain_size", T::kInteger, false},
                    {"bandwidth_per_direction_bytes_per_s", T::kReal, true},
                    {"latency_s", T::kReal, false},
                    {"source", T::kText, false}},
                   {"name"},
                   "name"});
    all.push_back(
        {"kernel_timings",
         with_versions({{"op_kind", T::kText, true},
                        {"m", T::kInteger, false},
                        {"n", T::kInteger, false},
                        {"k", T::kInteger, false},
                        {"batch", T::kInteger, false},
                        {"heads", T::kInteger, false},
                        {"kv_heads", T::kInteger, false},
                        {"seq_q", T::kInteger, false},
                        {"seq_kv", T::kInteger, false},
                        {"head_dim", T::kInteger, false},
                        {"causal", T::kInteger, false},
                        {"bytes", T::kInteger, false},
                        {"dtype", T::kText, false},
                        {"gpu", T::kText, true}},
                       timing_tail),
         {"op_kind", "m", "n", "k", "batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim", "causal",
          "bytes", "dtype", "gpu", "driver_version", "cuda_version", "cublas_version", "nccl_version",
          "commit_hash"},
         "gpu, op_kind, dtype, m, n, k, batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, bytes, "
         "driver_version, cuda_version, cublas_version, nccl_version, commit_hash"});
    all.push_back(
        {"collective_timings",
         with_versions({{"op", T::kText, true},
                        {"group_size", T::kInteger, true},
                        {"placement", T::kText, false},
                        {"nodes", T::kInteger, false},
                        {"bytes", T::kInteger, true},
                        {"gpu", T::kText, true},
                        {"interconnect", T::kText, false}},
                       timing_tail),
         {"op", "group_size", "placement", "nodes", "bytes", "gpu", "interconnect", "driver_version",
          "cuda_version", "cublas_version", "nccl_version", "commit_hash"},
         "gpu, op, group_size, placement, nodes, bytes, interconnect, driver_version, cuda_version, "
         "cublas_version, nccl_version, commit_hash"});
    all.push_back({"fitted_models",
                   {{"model_kind", T::kText, true},
                    {"gpu", T::kText, true},
                    {"variant", T::kText, false},
                    {"params_json", T::kText, true},
                    {"r2", T::kReal, false},
                    {"mape", T::kReal, false},
                    {"n_points", T::kInteger, false},
                    {"fitted_at", T::kText, false}},
                   {"model_kind", "gpu", "variant"},
                   "gpu, model_kind, variant"});
    all.push_back({"plans",
                   {{"id", T::kInteger, false},
                    {"model", T::kText, true},
                    {"cluster", T::kText, true},
                    {"config_json", T::kText, true},
                    {"predicted_step_time_s", T::kReal, false},
                    {"predicted_mfu", T::kReal, false},
                    {"peak_memory_bytes", T::kInteger, false},
                    {"created_at", T::kText, false}},
                   {"model", "cluster", "config_json"},
                   "id"});
    all.push_back({"runs",
                   with_versions({{"id", T::kInteger, false},
                                  {"plan_id", T::kInteger, false},
                                  {"predicted_step_time_s", T::kReal, false},
                                  {"measured_step_time_s", T::kReal, false},
                                  {"predicted_mfu", T::kReal, false},
                                  {"measured_mfu", T::kReal, false},
                                  {"gpu", T::kText, false}},
                                 {{"started_at", T::kText, false}}),
                   {"id"},
                   "id"});
    all.push_back({"run_ops",
                   {{"run_id", T::kInteger, true},
                    {"op_id", T::kInteger, true},
                    {"op_text", T::kText, false},
                    {"predicted_s", T::kReal, false},
                    {"measured_s", T::kReal, false}},
                   {"run_id", "op_id"},
                   "run_id, op_id"});
    all.push_back({"calibrations",
                   {{"id", T::kInteger, false},
                    {"gpu", T::kText, true},
                    {"params_json", T::kText, true},
                    {"runs_json", T::kText, false},
                    {"n_runs", T::kInteger, false},
                    {"n_ops", T::kInteger, false},
                    {"op_error_before", T::kReal, false},
                    {"op_error_after", T::kReal, false},
                    {"calibrated_at", T::kText, false}},
                   {"id"},
                   "id"});
    return all;
  }();
  return tables;
}

const TableDescription& cost_database_table(const std::string& name) {
  std::string known;
  for (const TableDescription& table : cost_database_tables()) {
    if (table.name == name) return table;
    known += (known.empty() ? "" : ", ") + table.name;
  }
  throw UserError("unknown table '" + name + "'; use one of: " + known);
}

}  // namespace megatune::cost_models
