// Typed upserts and loads of cost-database rows.
#include "cost_models/record_store.h"

#include <chrono>
#include <ctime>

#include "cost_models/cost_database.h"

namespace megatune::cost_models {
namespace {

constexpr const char* kVersionNames =
    "driver_version, cuda_version, cublas_version, nccl_version, commit_hash";

int bind_versions(Statement& statement, int index, const SoftwareVersions& versions) {
  statement.bind(index++, versions.driver);
  statement.bind(index++, versions.cuda);
  statement.bind(index++, versions.cublas);
  statement.bind(index++, versions.nccl);
  statement.bind(index++, versions.commit);
  return index;
}

int read_versions(const Statement& statement, int column, SoftwareVersions& versions) {
  versions.driver = statement.column_text(column++);
  versions.cuda = statement.column_text(column++);
  versions.cublas = statement.column_text(column++);
  versions.nccl = statement.column_text(column++);
  versions.commit = statement.column_text(column++);
  return column;
}

// "a, b, c" -> "a=excluded.a, b=excluded.b, c=excluded.c"
std::string excluded_assignments(const std::string& names) {
  std::string out;
  std::size_t start = 0;
  while (start < names.size()) {
    std::size_t end = names.find(',', start);
    if (end == std::string::npos) end = names.size();
    std::string name = names.substr(start, end - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!out.empty()) out += ", ";
    out += name + "=excluded." + name;
    start = end + 1;
  }
  return out;
}

}  // namespace

std::string utc_now_iso8601() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm parts{};
  gmtime_r(&now, &parts);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
  return text;
}

void upsert_gpu_model(Database& database, const GpuModel& gpu) {
  static const std::string values =
      "peak_bf16_tflops, peak_fp16_tflops, peak_fp8_tflops, peak_tf32_tflops, peak_fp32_tflops, "
      "memory_bytes, "
      "hbm_bandwidth_bytes_per_s, default_intra_node_interconnect, default_inter_node_interconnect, "
      "default_gpus_per_node, source";
  Statement statement(database, "INSERT INTO gpu_models (name, " + values +
                                    ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (name) DO UPDATE SET " +
                                    excluded_assignments(values));
  statement.bind(1, gpu.name)
      .bind(2, gpu.peak_bf16_tflops)
      .bind(3, gpu.peak_fp16_tflops)
      .bind(4, gpu.peak_fp8_tflops)
      .bind(5, gpu.peak_tf32_tflops)
      .bind(6, gpu.peak_fp32_tflops)
      .bind(7, gpu.memory_bytes)
      .bind(8, gpu.hbm_bandwidth_bytes_per_s)
      .bind(9, gpu.default_intra_node_interconnect)
      .bind(10, gpu.default_inter_node_interconnect)
      .bind(11, gpu.default_gpus_per_node)
      .bind(12, gpu.source);
  statement.run();
}

std::vector<GpuModel> load_gpu_models(Database& database) {
  Statement statement(
      database,
      "SELECT name, peak_bf16_tflops, peak_fp16_tflops, peak_fp8_tflops, peak_tf32_tflops, "
      "peak_fp32_tflops, memory_bytes, hbm_bandwidth_bytes_per_s, default_intra_node_interconnect, "
      "default_inter_node_interconnect, default_gpus_per_node, source FROM gpu_models ORDER BY name");
  std::vector<GpuModel> rows;
  while (statement.step()) {
    GpuModel gpu;
    gpu.name = statement.column_text(0);
    gpu.peak_bf16_tflops = statement.column_double(1);
    gpu.peak_fp16_tflops = statement.column_double(2);
    gpu.peak_fp8_tflops = statement.column_double(3);
    gpu.peak_tf32_tflops = statement.column_double(4);
    gpu.peak_fp32_tflops = statement.column_double(5);
    gpu.memory_bytes = statement.column_int64(6);
    gpu.hbm_bandwidth_bytes_per_s = statement.column_double(7);
    gpu.default_intra_node_interconnect = statement.column_text(8);
    gpu.default_inter_node_interconnect = statement.column_text(9);
    gpu.default_gpus_per_node = static_cast<int>(statement.column_int64(10));
    gpu.source = statement.column_text(11);
    rows.push_back(std::move(gpu));
  }
  return rows;
}

void upsert_interconnect(Database& database, const Interconnect& interconnect) {
  static const std::string values =
      "kind, domain_size, bandwidth_per_direction_bytes_per_s, latency_s, source";
  Statement statement(database, "INSERT INTO interconnects (name, " + values +
                                    ") VALUES (?,?,?,?,?,?) ON CONFLICT (name) DO UPDATE SET " +
                                    excluded_assignments(values));
  statement.bind(1, interconnect.name)
      .bind(2, interconnect.kind)
      .bind(3, interconnect.domain_size)
      .bind(4, interconnect.bandwidth_per_direction_bytes_per_s)
      .bind(5, interconnect.latency_s)
      .bind(6, interconnect.source);
  statement.run();
}

std::vector<Interconnect> load_interconnects(Database& database) {
  Statement statement(
      database,
      "SELECT name, kind, domain_size, bandwidth_per_direction_bytes_per_s, latency_s, source "
      "FROM interconnects ORDER BY name");
  std::vector<Interconnect> rows;
  while (statement.step()) {
    Interconnect row;
    row.name = statement.column_text(0);
    row.kind = statement.column_text(1);
    row.domain_size = static_cast<int>(statement.column_int64(2));
    row.bandwidth_per_direction_bytes_per_s = statement.column_double(3);
    row.latency_s = statement.column_double(4);
    row.source = statement.column_text(5);
    rows.push_back(std::move(row));
  }
  return rows;
}

void upsert_kernel_timing(Database& database, const KernelTiming& timing) {
  static const std::string key = std::string(
                                     "op_kind, m, n, k, batch, heads, kv_heads, seq_q, seq_kv, head_dim, "
                                     "causal, bytes, dtype, gpu, ") +
                                 kVersionNames;
  static const std::string values = "median_s, min_s, max_s, repeats, measured_at";
  Statement statement(database,
                      "INSERT INTO kernel_timings (" + key + ", " + values +
                          ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (" + key +
                          ") DO UPDATE SET " + excluded_assignments(values));
  statement.bind(1, timing.op_kind)
      .bind(2, timing.m)
      .bind(3, timing.n)
      .bind(4, timing.k)
      .bind(5, timing.batch)
      .bind(6, timing.heads)
      .bind(7, timing.kv_heads)
      .bind(8, timing.seq_q)
      .bind(9, timing.seq_kv)
      .bind(10, timing.head_dim)
      .bind(11, timing.causal ? 1 : 0)
      .bind(12, timing.bytes)
      .bind(13, timing.dtype)
      .bind(14, timing.gpu);
  const int index = bind_versions(statement, 15, timing.versions);
  statement.bind(index, timing.median_s);
  statement.bind(index + 1, timing.min_s);
  statement.bind(index + 2, timing.max_s);
  statement.bind(index + 3, timing.repeats);
  statement.bind(index + 4, timing.measured_at);
  statement.run();
}

std::vector<KernelTiming> load_kernel_timings(Database& database, const std::string& gpu) {
  Statement statement(
      database,
      std::string("SELECT op_kind, m, n, k, batch, heads, kv_heads, seq_q, seq_kv, head_dim, causal, "
                  "bytes, dtype, gpu, ") +
          kVersionNames +
          ", median_s, min_s, max_s, repeats, measured_at FROM kernel_timings"
          " WHERE (?1 = '' OR gpu = ?1) ORDER BY " +
          cost_database_table("kernel_timings").order_by);
  statement.bind(1, gpu);
  std::vector<KernelTiming> rows;
  while (statement.step()) {
    KernelTiming row;
    row.op_kind = statement.column_text(0);
    row.m = statement.column_int64(1);
    row.n = statement.column_int64(2);
    row.k = statement.column_int64(3);
    row.batch = statement.column_int64(4);
    row.heads = statement.column_int64(5);
    row.kv_heads = statement.column_int64(6);
    row.seq_q = statement.column_int64(7);
    row.seq_kv = statement.column_int64(8);
    row.head_dim = statement.column_int64(9);
    row.causal = statement.column_int64(10) != 0;
    row.bytes = statement.column_int64(11);
    row.dtype = statement.column_text(12);
    row.gpu = statement.column_text(13);
    int column = read_versions(statement, 14, row.versions);
    row.median_s = statement.column_double(column++);
    row.min_s = statement.column_double(column++);
    row.max_s = statement.column_double(column++);
    row.repeats = static_cast<int>(statement.column_int64(column++));
    row.measured_at = statement.column_text(column++);
    rows.push_back(std::move(row));
  }
  return rows;
}

void upsert_collective_timing(Database& database, const CollectiveTiming& timing) {
  static const std::string key =
      std::string("op, group_size, placement, nodes, bytes, gpu, interconnect, ") + kVersionNames;
  static const std::string values = "median_s, min_s, max_s, repeats, measured_at";
  Statement statement(database, "INSERT INTO collective_timings (" + key + ", " + values +
                                    ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT (" + key +
                                    ") DO UPDATE SET " + excluded_assignments(values));
  statement.bind(1, timing.op)
      .bind(2, timing.group_size)
      .bind(3, timing.placement)
      .bind(4, timing.nodes)
      .bind(5, timing.bytes)
      .bind(6, timing.gpu)
      .bind(7, timing.interconnect);
  const int index = bind_versions(statement, 8, timing.versions);
  statement.bind(index, timing.median_s);
  statement.bind(index + 1, timing.min_s);
  statement.bind(index + 2, timing.max_s);
  statement.bind(index + 3, timing.repeats);
  statement.bind(index + 4, timing.measured_at);
  statement.run();
}

std::vector<CollectiveTiming> load_collective_timings(Database& database, const std::string& gpu) {
  Statement statement(database,
                      std::string("SELECT op, group_size, placement, nodes, bytes, gpu, interconnect, ") +
                          kVersionNames +
                          ", median_s, min_s, max_s, repeats, measured_at FROM collective_timings"
                          " WHERE (?1 = '' OR gpu = ?1) ORDER BY " +
                          cost_database_table("collective_timings").order_by);
  statement.bind(1, gpu);
  std::vector<CollectiveTiming> rows;
  while (statement.step()) {
    CollectiveTiming row;
    row.op = statement.column_text(0);
    row.group_size = static_cast<int>(statement.column_int64(1));
    row.placement = statement.column_text(2);
    row.nodes = static_cast<int>(statement.column_int64(3));
    row.bytes = statement.column_int64(4);
    row.gpu = statement.column_text(5);
    row.interconnect = statement.column_text(6);
    int column = read_versions(statement, 7, row.versions);
    row.median_s = statement.column_double(column++);
    row.min_s = statement.column_double(column++);
    row.max_s = statement.column_double(column++);
    row.repeats = static_cast<int>(statement.column_int64(column++));
    row.measured_at = statement.column_text(column++);
    rows.push_back(std::move(row));
  }
  return rows;
}

void upsert_fitted_model(Database& database, const FittedModel& model) {
  static const std::string values = "params_json, r2, mape, n_points, fitted_at";
  Statement statement(database,
                      "INSERT INTO fitted_models (model_kind, gpu, variant, " + values +
                          ") VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (model_kind, gpu, variant) DO UPDATE SET " +
                          excluded_assignments(values));
  statement.bind(1, model.model_kind)
      .bind(2, model.gpu)
      .bind(3, model.variant)
      .bind(4, model.params_json)
      .bind(5, model.r2)
      .bind(6, model.mape)
      .bind(7, model.n_points)
      .bind(8, model.fitted_at);
  statement.run();
}

std::vector<FittedModel> load_fitted_models(Database& database, const std::string& gpu) {
  Statement statement(
      database,
      "SELECT model_kind, gpu, variant, params_json, r2, mape, n_points, fitted_at FROM fitted_models "
      "WHERE (?1 = '' OR gpu = ?1) ORDER BY gpu, model_kind, variant");
  statement.bind(1, gpu);
  std::vector<FittedModel> rows;
  while (statement.step()) {
    FittedModel row;
    row.model_kind = statement.column_text(0);
    row.gpu = statement.column_text(1);
    row.variant = statement.column_text(2);
    row.params_json = statement.column_text(3);
    row.r2 = statement.column_double(4);
    row.mape = statement.column_double(5);
    row.n_points = static_cast<int>(statement.column_int64(6));
    row.fitted_at = statement.column_text(7);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::int64_t upsert_plan(Database& database, const PlanRecord& plan) {
  static const std::string values = "predicted_step_time_s, predicted_mfu, peak_memory_bytes, created_at";
  Statement statement(
      database, "INSERT INTO plans (model, cluster, config_json, " + values +
                    ") VALUES (?,?,?,?,?,?,?) ON CONFLICT (model, cluster, config_json) DO UPDATE SET " +
                    excluded_assignments(values) + " RETURNING id");
  statement.bind(1, plan.model)
      .bind(2, plan.cluster)
      .bind(3, plan.config_json)
      .bind(4, plan.predicted_step_time_s)
      .bind(5, plan.predicted_mfu)
      .bind(6, plan.peak_memory_bytes)
      .bind(7, plan.created_at);
  std::int64_t id = 0;
  if (statement.step()) id = statement.column_int64(0);
  statement.run();
  return id;
}

std::vector<PlanRecord> load_plans(Database& database) {
  Statement statement(database,
                      "SELECT id, model, cluster, config_json, predicted_step_time_s, predicted_mfu, "
                      "peak_memory_bytes, created_at FROM plans ORDER BY id");
  std::vector<PlanRecord> rows;
  while (statement.step()) {
    PlanRecord row;
    row.id = statement.column_int64(0);
    row.model = statement.column_text(1);
    row.cluster = statement.column_text(2);
    row.config_json = statement.column_text(3);
    row.predicted_step_time_s = statement.column_double(4);
    row.predicted_mfu = statement.column_double(5);
    row.peak_memory_bytes = statement.column_int64(6);
    row.created_at = statement.column_text(7);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::int64_t insert_run(Database& database, const RunRecord& run) {
  Statement statement(database,
                      std::string("INSERT INTO runs (plan_id, predicted_step_time_s, measured_step_time_s, "
                                  "predicted_mfu, measured_mfu, gpu, ") +
                          kVersionNames + ", started_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
  statement.bind(1, run.plan_id)
      .bind(2, run.predicted_step_time_s)
      .bind(3, run.measured_step_time_s)
      .bind(4, run.predicted_mfu)
      .bind(5, run.measured_mfu)
      .bind(6, run.gpu);
  const int index = bind_versions(statement, 7, run.versions);
  statement.bind(index, run.started_at);
  statement.run();
  return database.last_insert_rowid();
}

std::vector<RunRecord> load_runs(Database& database) {
  Statement statement(
      database, std::string("SELECT id, plan_id, predicted_step_time_s, measured_step_time_s, predicted_mfu, "
                            "measured_mfu, gpu, ") +
                    kVersionNames + ", started_at FROM runs ORDER BY id");
  std::vector<RunRecord> rows;
  while (statement.step()) {
    RunRecord row;
    row.id = statement.column_int64(0);
    if (!statement.column_is_null(1)) row.plan_id = statement.column_int64(1);
    row.predicted_step_time_s = statement.column_double(2);
    row.measured_step_time_s = statement.column_double(3);
    row.predicted_mfu = statement.column_double(4);
    row.measured_mfu = statement.column_double(5);
    row.gpu = statement.column_text(6);
    const int column = read_versions(statement, 7, row.versions);
    row.started_at = statement.column_text(column);
    rows.push_back(std::move(row));
  }
  return rows;
}

void upsert_run_op(Database& database, const RunOp& op) {
  Statement statement(
      database,
      "INSERT INTO run_ops (run_id, op_id, op_text, predicted_s, measured_s) VALUES (?,?,?,?,?) "
      "ON CONFLICT (run_id, op_id) DO UPDATE SET op_text=excluded.op_text, "
      "predicted_s=excluded.predicted_s, measured_s=excluded.measured_s");
  statement.bind(1, op.run_id)
      .bind(2, op.op_id)
      .bind(3, op.op_text)
      .bind(4, op.predicted_s)
      .bind(5, op.measured_s);
  statement.run();
}

std::vector<RunOp> load_run_ops(Database& database, std::int64_t run_id) {
  Statement statement(database,
                      "SELECT run_id, op_id, op_text, predicted_s, measured_s FROM run_ops WHERE run_id = ? "
                      "ORDER BY op_id");
  statement.bind(1, run_id);
  std::vector<RunOp> rows;
  while (statement.step()) {
    RunOp row;
    row.run_id = statement.column_int64(0);
    row.op_id = statement.column_int64(1);
    row.op_text = statement.column_text(2);
    row.predicted_s = statement.column_double(3);
    row.measured_s = statement.column_double(4);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<std::pair<std::string, std::int64_t>> table_row_counts(Database& database) {
  std::vector<std::pair<std::string, std::int64_t>> counts;
  for (const TableDescription& table : cost_database_tables()) {
    const bool exists =
        database.query_int64("SELECT count(*) FROM sqlite_master WHERE type='table' AND name='" + table.name +
                             "'") > 0;
    if (!exists) continue;
    counts.emplace_back(table.name, database.query_int64("SELECT count(*) FROM " + table.name));
  }
  return counts;
}

}  // namespace megatune::cost_models
