// CSV/JSON import and export of cost-database tables: round-trips, validation, all-or-nothing.
#include "cost_models/table_io.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/record_store.h"
#include "tests/cost_models/test_paths.h"

namespace megatune::cost_models {
namespace {

std::string import_error(Database& database, const std::string& table, TableFormat format,
                         const std::string& text) {
  try {
    import_table_text(database, table, format, text, "input.csv");
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

void fill(Database& database) {
  KernelTiming gemm;
  gemm.op_kind = "gemm";
  gemm.m = 4096;
  gemm.n = 8192;
  gemm.k = 1024;
  gemm.gpu = "H200 SXM";
  gemm.versions = {"570.1", "13.0", "13.1.0.3", "2.28.3", "a1b2c3"};
  gemm.median_s = 1.234567890123e-4;
  gemm.min_s = 1.2e-4;
  gemm.max_s = 1.3e-4;
  gemm.repeats = 20;
  gemm.measured_at = "2026-11-29T22:00:00Z";
  upsert_kernel_timing(database, gemm);
  KernelTiming norm;
  norm.op_kind = "norm";
  norm.bytes = 1 << 26;
  norm.gpu = "H200 SXM";
  norm.median_s = 2e-5;
  norm.repeats = 3;
  upsert_kernel_timing(database, norm);
  CollectiveTiming collective;
  collective.op = "all_gather";
  collective.group_size = 8;
  collective.bytes = 1 << 20;
  collective.gpu = "H200 SXM";
  collective.interconnect = "NVLink4";
  collective.median_s = 3e-5;
  upsert_collective_timing(database, collective);
  upsert_fitted_model(
      database, {"collective", "H200 SXM", "all_gather:8:1",
                 "{\"form\":\"latency_bandwidth\",\"latency_s\":1e-05,\"seconds_per_byte\":2e-12}", 0.99,
                 0.02, 12, "2026-11-29"});
  const std::int64_t plan = upsert_plan(
      database, {0, "llama3-8b", "1x8xH200 SXM", "{\"tp\": 2, \"note\": \"comma, \\\"quote\\\"\\nnewline\"}",
                 1.5, 0.45, 1LL << 36, "2026-11-29"});
  RunRecord run;
  run.plan_id = plan;
  run.measured_step_time_s = 1.6;
  run.gpu = "H200 SXM";
  const std::int64_t run_id = insert_run(database, run);
  upsert_run_op(database, {run_id, 3, "F mb0 c0 L0 gemm qkv", 1e-4, 1.2e-4});
}

TEST(TableIo, RoundTripsEveryTableThroughCsvAndJson) {
  for (const TableFormat format : {TableFormat::kCsv, TableFormat::kJson}) {
    Database source = open_in_memory_cost_database();
    fill(source);
    Database target = open_in_memory_cost_database();
    for (const TableDescription& table : cost_database_tables()) {
      std::ostringstream exported;
      const std::int64_t rows = export_table(source, table.name, format, exported);
      EXPECT_EQ(import_table_text(target, table.name, format, exported.str(), table.name), rows)
          << table.name;
      std::ostringstream again;
      export_table(target, table.name, format, again);
      EXPECT_EQ(again.str(), exported.str()) << table.name;
    }
    EXPECT_EQ(load_kernel_timings(target), load_kernel_timings(source));
    EXPECT_EQ(load_collective_timings(target), load_collective_timings(source));
    EXPECT_EQ(load_fitted_models(target), load_fitted_models(source));
    EXPECT_EQ(load_plans(target), load_plans(source));
    EXPECT_EQ(load_runs(target), load_runs(source));
    EXPECT_EQ(load_run_ops(target, 1), load_run_ops(source, 1));
  }
}

TEST(TableIo, ImportUpsertsByNaturalKey) {
  Database database = open_in_memory_cost_database();
  const std::string csv =
      "op_kind,m,n,k,gpu,median_s\n"
      "gemm,128,128,128,H100 SXM,1e-5\n"
      "gemm,256,128,128,H100 SXM,2e-5\n";
  EXPECT_EQ(import_table_text(database, "kernel_timings", TableFormat::kCsv, csv, "a.csv"), 2);
  EXPECT_EQ(import_table_text(database, "kernel_timings", TableFormat::kCsv,
                              "op_kind,m,n,k,gpu,median_s\ngemm,128,128,128,H100 SXM,3e-5\n", "b.csv"),
            1);
  const auto rows = load_kernel_timings(database);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& row : rows) {
    if (row.m == 128) {
      EXPECT_EQ(row.median_s, 3e-5);
    }
    EXPECT_EQ(row.dtype, "bf16");  // column default
  }
}

TEST(TableIo, BadRowsNameFileLineAndColumnAndWriteNothing) {
  Database database = open_in_memory_cost_database();
  const std::string header = "op_kind,m,n,k,gpu,median_s\n";
  std::string message = import_error(database, "kernel_timings", TableFormat::kCsv,
                                     header + "gemm,1,1,1,H100,1e-5\ngemm,2,x2,1,H100,1e-5\n");
  EXPECT_NE(message.find("input.csv:3:"), std::string::npos) << message;
  EXPECT_NE(message.find("column n"), std::string::npos) << message;
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM kernel_timings"), 0);

  message = import_error(database, "kernel_timings", TableFormat::kCsv, header + "gemm,1,1,1,H100,fast\n");
  EXPECT_NE(message.find("column median_s"), std::string::npos) << message;
  message = import_error(database, "kernel_timings", TableFormat::kCsv, header + "gemm,1,1,1,,1e-5\n");
  EXPECT_NE(message.find("column gpu: a value is required"), std::string::npos) << message;
  message = import_error(database, "kernel_timings", TableFormat::kCsv, "op_kind,mm\ngemm,1\n");
  EXPECT_NE(message.find("\"mm\" is not in table kernel_timings"), std::string::npos) << message;
  message = import_error(database, "kernel_timings", TableFormat::kCsv, header + "gemm,1,1\n");
  EXPECT_NE(message.find("input.csv:2: has 3 fields"), std::string::npos) << message;
  // A constraint of the table (median_s > 0) on the 3rd data row: the first two are rolled back.
  message = import_error(database, "kernel_timings", TableFormat::kCsv,
                         header + "gemm,1,1,1,H100,1e-5\ngemm,2,1,1,H100,1e-5\ngemm,3,1,1,H100,-1\n");
  EXPECT_NE(message.find("input.csv:4:"), std::string::npos) << message;
  EXPECT_NE(message.find("CHECK constraint"), std::string::npos) << message;
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM kernel_timings"), 0);
  message = import_error(database, "collective_timings", TableFormat::kCsv,
                         "op,group_size,bytes,gpu,median_s\nall_scatter,8,1024,H100,1e-5\n");
  EXPECT_NE(message.find("input.csv:2:"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);

  message = import_error(database, "nope", TableFormat::kCsv, header);
  EXPECT_NE(message.find("unknown table 'nope'"), std::string::npos) << message;
}

TEST(TableIo, JsonRowsReportTheirLine) {
  Database database = open_in_memory_cost_database();
  const std::string json =
      "[\n"
      "  {\"op\": \"all_reduce\", \"group_size\": 8, \"bytes\": 1024, \"gpu\": \"H100\", \"median_s\": "
      "1e-5},\n"
      "  {\"op\": \"all_reduce\", \"group_size\": \"eight\", \"bytes\": 2048, \"gpu\": \"H100\", "
      "\"median_s\": 1e-5}\n"
      "]\n";
  const std::string message = import_error(database, "collective_timings", TableFormat::kJson, json);
  EXPECT_NE(message.find("input.csv:3:"), std::string::npos) << message;
  EXPECT_NE(message.find("column group_size"), std::string::npos) << message;
  EXPECT_EQ(database.query_int64("SELECT count(*) FROM collective_timings"), 0);
  EXPECT_NE(
      import_error(database, "collective_timings", TableFormat::kJson, "[{\"op\": ").find("invalid JSON"),
      std::string::npos);
  // {"rows": [...]} is accepted too.
  EXPECT_EQ(import_table_text(
                database, "collective_timings", TableFormat::kJson,
                "{\"rows\": [{\"op\": \"broadcast\", \"group_size\": 2, \"bytes\": 8, \"gpu\": \"H100\","
                " \"median_s\": 1e-5}]}",
                "rows.json"),
            1);
}

TEST(TableIo, CsvQuotingSurvivesCommasQuotesAndNewlines) {
  Database database = open_in_memory_cost_database();
  const std::string csv =
      "model,cluster,config_json\n"
      "\"a,b\",\"1x8xH100\",\"{\"\"x\"\": 1,\n \"\"y\"\": 2}\"\n";
  ASSERT_EQ(import_table_text(database, "plans", TableFormat::kCsv, csv, "plans.csv"), 1);
  const auto plans = load_plans(database);
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_EQ(plans[0].model, "a,b");
  EXPECT_EQ(plans[0].config_json, "{\"x\": 1,\n \"y\": 2}");
}

TEST(TableIo, ImportsFilesByExtension) {
  testing::TemporaryDirectory directory;
  const std::string path = directory.file("gpus.json");
  {
    std::ofstream file(path);
    file << "[{\"name\": \"My GPU\", \"peak_bf16_tflops\": 500, \"memory_bytes\": 80e9, "
            "\"hbm_bandwidth_bytes_per_s\": 2e12, \"source\": \"measured\"}]";
  }
  Database database = open_in_memory_cost_database();
  EXPECT_EQ(import_table_file(database, "gpu_models", path), 1);
  EXPECT_EQ(load_gpu_models(database).at(0).source, "measured");
  EXPECT_THROW(import_table_file(database, "gpu_models", directory.file("gpus.txt")), UserError);
  {
    std::ofstream file(path);  // a figure off by a unit is refused, not stored
    file << "[{\"name\": \"Odd GPU\", \"peak_bf16_tflops\": 1e300, \"memory_bytes\": 80e9, "
            "\"hbm_bandwidth_bytes_per_s\": 2e12, \"source\": \"measured\"}]";
  }
  EXPECT_THROW(import_table_file(database, "gpu_models", path), UserError);
  EXPECT_EQ(load_gpu_models(database).size(), 1u);
  EXPECT_THROW(import_table_file(database, "gpu_models", directory.file("missing.csv")), UserError);
  EXPECT_EQ(table_format_from_name("json"), TableFormat::kJson);
  EXPECT_THROW(table_format_from_name("xml"), UserError);
}

}  // namespace
}  // namespace megatune::cost_models
