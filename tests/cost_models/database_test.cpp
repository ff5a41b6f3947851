// Cost database: schema creation, round-trips of every table, migrations, concurrent writers, and damaged,
// foreign and newer files.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/record_store.h"
#include "tests/cost_models/test_paths.h"

namespace megatune::cost_models {
namespace {

using testing::TemporaryDirectory;

KernelTiming gemm_timing(std::int64_t m, double median_s) {
  KernelTiming row;
  row.op_kind = "gemm";
  row.m = m;
  row.n = 4096;
  row.k = 4096;
  row.dtype = "bf16";
  row.gpu = "H200 SXM";
  row.versions = {"570.86", "13.0", "13.1.0", "2.28.3", "abc123"};
  row.median_s = median_s;
  row.min_s = median_s * 0.98;
  row.max_s = median_s * 1.05;
  row.repeats = 20;
  row.measured_at = "2026-11-29T22:00:00Z";
  return row;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(CostDatabase, CreatesSchemaWithApplicationIdAndVersion) {
  TemporaryDirectory directory;
  const std::string path = directory.file("nested/costs.db");
  Database database = open_cost_database(path);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(schema_version(database), kCostDatabaseSchemaVersion);
  EXPECT_EQ(database.query_int64("PRAGMA application_id"), kCostDatabaseApplicationId);
  Statement journal(database, "PRAGMA journal_mode");
  ASSERT_TRUE(journal.step());
  EXPECT_EQ(journal.column_text(0), "wal");
  EXPECT_EQ(database.query_int64("PRAGMA foreign_keys"), 1);
  for (const TableDescription& table : cost_database_tables()) {
    EXPECT_EQ(database.query_int64("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='" +
                                   table.name + "'"),
              1)
        << table.name;
  }
  // Reopening an existing, current database changes nothing.
  Database again = open_cost_database(path);
  EXPECT_EQ(schema_version(again), kCostDatabaseSchemaVersion);
}

TEST(CostDatabase, RoundTripsEveryTable) {
  Database database = open_in_memory_cost_database();
  GpuModel gpu;
  gpu.name = "Test GPU";
  gpu.peak_bf16_tflops = 100;
  gpu.peak_fp16_tflops = 100;
  gpu.peak_fp8_tflops = 200;
  gpu.peak_tf32_tflops = 50;
  gpu.peak_fp32_tflops = 10;
  gpu.memory_bytes = 1LL << 34;
  gpu.hbm_bandwidth_bytes_per_s = 1e12;
  gpu.default_intra_node_interconnect = "NVLink4";
  gpu.default_inter_node_interconnect = "InfiniBand NDR400";
  gpu.default_gpus_per_node = 4;
  upsert_gpu_model(database, gpu);
  ASSERT_EQ(load_gpu_models(database), std::vector<GpuModel>{gpu});

  Interconnect fabric{"Fabric", "inter_node", 0, 25e9, 4e-6, "measured"};
  upsert_interconnect(database, fabric);
  ASSERT_EQ(load_interconnects(database), std::vector<Interconnect>{fabric});

  KernelTiming attention;
  attention.op_kind = "attention_bwd";
  attention.batch = 2;
  attention.heads = 32;
  attention.kv_heads = 8;
  attention.seq_q = 4096;
  attention.seq_kv = 4096;
  attention.head_dim = 128;
  attention.causal = true;
  attention.gpu = "H200 SXM";
  attention.median_s = 3e-3;
  attention.min_s = 2.9e-3;
  attention.max_s = 3.2e-3;
  attention.repeats = 5;
  const KernelTiming gemm = gemm_timing(8192, 1e-3);
  upsert_kernel_timing(database, gemm);
  upsert_kernel_timing(database, attention);
  auto kernels = load_kernel_timings(database, "H200 SXM");
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_TRUE(kernels[0] == attention || kernels[1] == attention);
  EXPECT_TRUE(kernels[0] == gemm || kernels[1] == gemm);
  EXPECT_TRUE(load_kernel_timings(database, "Other").empty());

  CollectiveTiming collective;
  collective.op = "all_reduce";
  collective.group_size = 16;
  collective.placement = "inter";
  collective.nodes = 2;
  collective.bytes = 1 << 30;
  collective.gpu = "H200 SXM";
  collective.interconnect = "InfiniBand NDR400";
  collective.median_s = 0.05;
  collective.min_s = 0.049;
  collective.max_s = 0.052;
  collective.repeats = 10;
  upsert_collective_timing(database, collective);
  ASSERT_EQ(load_collective_timings(database), std::vector<CollectiveTiming>{collective});

  FittedModel fit{"gemm_efficiency",     "H200 SXM", "bf16", "{\"form\":\"x\"}", 0.97, 0.04, 120,
                  "2026-11-29T22:00:00Z"};
  upsert_fitted_model(database, fit);
  ASSERT_EQ(load_fitted_models(database, "H200 SXM"), std::vector<FittedModel>{fit});

  PlanRecord plan{0,    "llama3-8b", "1x8xH200 SXM", "{\"tp\":2}",
                  1.25, 0.52,        60LL << 30,     "2026-11-29T22:00:00Z"};
  plan.id = upsert_plan(database, plan);
  EXPECT_GT(plan.id, 0);
  ASSERT_EQ(load_plans(database), std::vector<PlanRecord>{plan});

  RunRecord run;
  run.plan_id = plan.id;
  run.predicted_step_time_s = 1.25;
  run.measured_step_time_s = 1.31;
  run.predicted_mfu = 0.52;
  run.measured_mfu = 0.49;
  run.gpu = "H200 SXM";
  run.versions = {"570", "13.0", "13.1", "2.28", "deadbeef"};
  run.started_at = "2026-11-29T22:10:00Z";
  run.id = insert_run(database, run);
  ASSERT_EQ(load_runs(database), std::vector<RunRecord>{run});
  RunOp op{run.id, 7, "F mb0 c0 L0 gemm qkv", 1e-4, 1.1e-4};
  upsert_run_op(database, op);
  ASSERT_EQ(load_run_ops(database, run.id), std::vector<RunOp>{op});

  // A run_op of a run that does not exist violates the foreign key.
  EXPECT_THROW(upsert_run_op(database, RunOp{run.id + 100, 1, "", 0, 0}), SqliteError);
}

TEST(CostDatabase, UpsertReplacesOnNaturalKey) {
  Database database = open_in_memory_cost_database();
  upsert_kernel_timing(database, gemm_timing(1024, 1e-3));
  upsert_kernel_timing(database, gemm_timing(1024, 2e-3));  // re-measure: replaces
  KernelTiming other_version = gemm_timing(1024, 3e-3);
  other_version.versions.cublas = "13.2.0";  // another software version: a new row
  upsert_kernel_timing(database, other_version);
  const auto rows = load_kernel_timings(database);
  ASSERT_EQ(rows.size(), 2u);
  int replaced = 0;
  for (const auto& row : rows) replaced += row.versions.cublas == "13.1.0" && row.median_s == 2e-3;
  EXPECT_EQ(replaced, 1);

  PlanRecord plan{0, "m", "c", "{}", 1.0, 0.5, 1, ""};
  const std::int64_t first = upsert_plan(database, plan);
  plan.predicted_step_time_s = 2.0;
  EXPECT_EQ(upsert_plan(database, plan), first);
  ASSERT_EQ(load_plans(database).size(), 1u);
  EXPECT_EQ(load_plans(database)[0].predicted_step_time_s, 2.0);
}

TEST(CostDatabase, MigratesFromAnOlderSchemaKeepingData) {
  TemporaryDirectory directory;
  const std::string path = directory.file("old.db");
  {
    CostDatabaseOpenOptions options;
    options.target_schema_version = 1;
    Database old = open_cost_database(path, options);
    EXPECT_EQ(schema_version(old), 1);
    EXPECT_EQ(old.query_int64("SELECT count(*) FROM sqlite_master WHERE name='plans'"), 0);
    upsert_kernel_timing(old, gemm_timing(2048, 1e-3));
  }
  Database migrated = open_cost_database(path);
  EXPECT_EQ(schema_version(migrated), kCostDatabaseSchemaVersion);
  EXPECT_EQ(load_kernel_timings(migrated).size(), 1u);
  EXPECT_GT(upsert_plan(migrated, PlanRecord{0, "m", "c", "{}", 1, 0.5, 1, ""}), 0);
  // Read-only opening of an old file does not migrate it.
  CostDatabaseOpenOptions options;
  options.target_schema_version = 1;
  const std::string older = directory.file("older.db");
  { open_cost_database(older, options); }
  CostDatabaseOpenOptions read_only;
  read_only.read_only = true;
  Database reader = open_cost_database(older, read_only);
  EXPECT_EQ(schema_version(reader), 1);
}

TEST(CostDatabase, TwoProcessesWritingConcurrentlyLoseNothing) {
  TemporaryDirectory directory;
  const std::string path = directory.file("shared.db");
  constexpr int kWriters = 2;
  constexpr int kTransactions = 60;
  constexpr int kRowsPerTransaction = 5;
  std::vector<pid_t> children;
  for (int writer = 0; writer < kWriters; ++writer) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      int status = 0;
      try {
        // Both processes also race to create the schema.
        Database database = open_cost_database(path);
        for (int t = 0; t < kTransactions; ++t) {
          Transaction transaction(database);
          for (int r = 0; r < kRowsPerTransaction; ++r) {
            upsert_kernel_timing(database,
                                 gemm_timing(1 + writer * 100000 + t * kRowsPerTransaction + r, 1e-3));
          }
          transaction.commit();
        }
      } catch (const std::exception& error) {
        std::fprintf(stderr, "writer %d: %s\n", writer, error.what());
        status = 1;
      }
      _exit(status);
    }
    children.push_back(child);
  }
  for (const pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  Database database = open_cost_database(path);
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM kernel_timings"),
            kWriters * kTransactions * kRowsPerTransaction);
  EXPECT_EQ(database.query_int64("SELECT count(DISTINCT m) FROM kernel_timings"),
            kWriters * kTransactions * kRowsPerTransaction);
}

TEST(CostDatabase, TwoThreadsWithOwnConnectionsLoseNothing) {
  TemporaryDirectory directory;
  const std::string path = directory.file("threads.db");
  { open_cost_database(path); }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int writer = 0; writer < 2; ++writer) {
    threads.emplace_back([&, writer] {
      try {
        Database database = open_cost_database(path);
        for (int t = 0; t < 50; ++t) {
          Transaction transaction(database);
          upsert_kernel_timing(database, gemm_timing(1 + writer * 1000 + t, 1e-3));
          transaction.commit();
        }
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  Database database = open_cost_database(path);
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM kernel_timings"), 100);
}

TEST(CostDatabase, TransactionRollsBackUnlessCommitted) {
  Database database = open_in_memory_cost_database();
  {
    Transaction transaction(database);
    upsert_kernel_timing(database, gemm_timing(1, 1e-3));
  }
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM kernel_timings"), 0);
  {
    Transaction transaction(database);
    upsert_kernel_timing(database, gemm_timing(1, 1e-3));
    transaction.commit();
  }
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM kernel_timings"), 1);
}

TEST(CostDatabase, RefusesAFileThatIsNotADatabase) {
  TemporaryDirectory directory;
  const std::string path = directory.file("notes.db");
  {
    std::ofstream file(path);
    for (int i = 0; i < 200; ++i) file << "this is a text file, not a database\n";
  }
  const auto size_before = std::filesystem::file_size(path);
  const std::string message = error_of([&] { open_cost_database(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("not a SQLite database"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);
  EXPECT_EQ(std::filesystem::file_size(path), size_before);  // never overwritten
}

TEST(CostDatabase, RefusesATruncatedDatabase) {
  TemporaryDirectory directory;
  const std::string path = directory.file("truncated.db");
  {
    Database database = open_cost_database(path);
    Transaction transaction(database);
    for (int i = 0; i < 2000; ++i) upsert_kernel_timing(database, gemm_timing(i + 1, 1e-3));
    transaction.commit();
    database.execute("PRAGMA wal_checkpoint(TRUNCATE)");
  }
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  const auto full = std::filesystem::file_size(path);
  ASSERT_GT(full, 40000u);
  for (const std::uintmax_t keep : {full / 2, std::uintmax_t{4096 + 100}, std::uintmax_t{60}}) {
    std::filesystem::resize_file(path, keep);
    const std::string message = error_of([&] {
      Database database = open_cost_database(path);
      load_kernel_timings(database);
    });
    EXPECT_NE(message.find("damaged"), std::string::npos) << "kept " << keep << " bytes: " << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
    std::filesystem::remove(path + "-wal");
    std::filesystem::remove(path + "-shm");
  }
}

TEST(CostDatabase, RefusesAForeignSqliteDatabase) {
  TemporaryDirectory directory;
  const std::string plain = directory.file("plain.db");
  {
    Database database(plain);
    database.execute("CREATE TABLE songs (title TEXT); INSERT INTO songs VALUES ('x')");
  }
  std::string message = error_of([&] { open_cost_database(plain); });
  EXPECT_NE(message.find("not written by megatune"), std::string::npos) << message;

  const std::string other_app = directory.file("other.db");
  {
    Database database(other_app);
    database.execute("PRAGMA application_id=1234");
  }
  message = error_of([&] { open_cost_database(other_app); });
  EXPECT_NE(message.find("another application"), std::string::npos) << message;
  // Still the other application's file.
  Database check(other_app);
  EXPECT_EQ(check.query_int64("PRAGMA application_id"), 1234);
}

TEST(CostDatabase, RefusesANewerSchema) {
  TemporaryDirectory directory;
  const std::string path = directory.file("newer.db");
  {
    Database database = open_cost_database(path);
    database.execute("PRAGMA user_version=" + std::to_string(kCostDatabaseSchemaVersion + 1));
  }
  const std::string message = error_of([&] { open_cost_database(path); });
  EXPECT_NE(message.find("newer megatune"), std::string::npos) << message;
  Database check(path);
  EXPECT_EQ(schema_version(check), kCostDatabaseSchemaVersion + 1);
}

TEST(CostDatabase, ClearErrorsForBadPaths) {
  TemporaryDirectory directory;
  EXPECT_NE(error_of([&] { open_cost_database(directory.path().string()); }).find("is a directory"),
            std::string::npos);
  CostDatabaseOpenOptions no_create;
  no_create.create_if_missing = false;
  EXPECT_NE(
      error_of([&] { open_cost_database(directory.file("missing.db"), no_create); }).find("does not exist"),
      std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(directory.file("missing.db")));
}

TEST(CostDatabase, SqliteErrorsCarryFileAndLine) {
  Database database = open_in_memory_cost_database();
  try {
    Statement statement(database, "SELECT * FROM no_such_table");
    FAIL() << "prepare should fail";
  } catch (const SqliteError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("sqlite_database.cpp:"), std::string::npos) << message;
    EXPECT_NE(message.find("no such table"), std::string::npos) << message;
  }
  Statement statement(database, "SELECT :value");
  statement.bind(":value", std::int64_t{42});
  ASSERT_TRUE(statement.step());
  EXPECT_EQ(statement.column_int64(0), 42);
  EXPECT_THROW(statement.parameter_index(":missing"), SqliteError);
}

TEST(CostDatabase, DefaultPathFollowsEnvironment) {
  setenv("MEGATUNE_DB", "/tmp/somewhere/costs.db", 1);
  EXPECT_EQ(default_cost_database_path(), "/tmp/somewhere/costs.db");
  unsetenv("MEGATUNE_DB");
  setenv("XDG_CACHE_HOME", "/tmp/cache-home", 1);
  EXPECT_EQ(default_cost_database_path(), "/tmp/cache-home/megatune/costs.db");
  unsetenv("XDG_CACHE_HOME");
  EXPECT_NE(default_cost_database_path().find("/.cache/megatune/costs.db"), std::string::npos);
}

TEST(CostDatabase, RowCountsCoverEveryTable) {
  Database database = open_in_memory_cost_database();
  upsert_kernel_timing(database, gemm_timing(1, 1e-3));
  const auto counts = table_row_counts(database);
  ASSERT_EQ(counts.size(), cost_database_tables().size());
  for (const auto& [table, count] : counts) EXPECT_EQ(count, table == "kernel_timings" ? 1 : 0) << table;
}

}  // namespace
}  // namespace megatune::cost_models
