// `megatune db`: the cost database: info (schema, row counts, GPUs and software versions), import and export
// of tables as CSV/JSON, fitting cost models from measurements, and pricing single ops with provenance.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "base/output_file.h"
#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_database.h"
#include "cost_models/cost_model.h"
#include "cost_models/embedded_data.h"
#include "cost_models/fitting.h"
#include "cost_models/hardware_catalog.h"
#include "cost_models/record_store.h"
#include "cost_models/table_io.h"
#include "layouts/op.h"
#include "tools/calibrate_command.h"
#include "tools/command_registry.h"
#include "tools/input_checks.h"

namespace megatune::tools {
namespace {

using namespace megatune::cost_models;

struct DbCommandOptions {
  std::string database_path;
  bool embedded = false;
  // import / export
  std::string file;
  std::string table;
  std::string format;
  std::string output;
  // fit
  std::string gpu;
  // price
  std::string cluster = "1x8xH100";
  std::string op;
  std::vector<std::int64_t> shape;
  std::string dtype = "bf16";
  int group_size = 8;
  int group_nodes = 1;
  bool causal = true;
  std::vector<std::string> price_flags_given;  // --group-size / --group-nodes / --no-causal when passed
  // calibrate
  CalibrateOptions calibrate;
};

std::string resolved_path(const DbCommandOptions& options) {
  return options.database_path.empty() ? default_cost_database_path() : options.database_path;
}

// Opens the database (creating it when missing; a new one starts with the shipped catalog and measurements),
// or with --embedded the data compiled into the binary.
Database open_for_cli(const DbCommandOptions& options, bool* created = nullptr) {
  if (options.embedded) return open_embedded_cost_database();
  const std::string path = resolved_path(options);
  std::error_code error;
  const bool existed = std::filesystem::exists(path, error);
  Database database = open_cost_database(path);
  if (database.query_int64("SELECT count(*) FROM gpu_models") == 0) {
    if (database.read_only()) {
      throw UserError("cost database " + path +
                      " is read-only and holds no GPU catalog; pass a megatune "
                      "database with --db, or --embedded");
    }
    install_embedded_data(database);
  }
  if (created != nullptr) *created = !existed;
  return database;
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// Prints rows as left-aligned columns separated by two spaces.
void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

int run_info(const DbCommandOptions& options) {
  const std::string path = options.embedded ? "(embedded in the binary)" : resolved_path(options);
  bool created = false;
  Database database = open_for_cli(options, &created);
  std::printf("cost database   %s%s\n", path.c_str(),
              created ? " (created now, with the embedded data)" : "");
  std::printf("schema version  %d (this megatune writes %d)\n\n", schema_version(database),
              kCostDatabaseSchemaVersion);
  std::vector<std::vector<std::string>> counts{{"table", "rows"}};
  for (const auto& [table, count] : table_row_counts(database))
    counts.push_back({table, std::to_string(count)});
  print_table(counts);

  std::map<std::string, std::int64_t> kernels_per_gpu, collectives_per_gpu, fits_per_gpu;
  {
    Statement statement(database, "SELECT gpu, count(*) FROM kernel_timings GROUP BY gpu");
    while (statement.step()) kernels_per_gpu[statement.column_text(0)] = statement.column_int64(1);
  }
  {
    Statement statement(database, "SELECT gpu, count(*) FROM collective_timings GROUP BY gpu");
    while (statement.step()) collectives_per_gpu[statement.column_text(0)] = statement.column_int64(1);
  }
  {
    Statement statement(database, "SELECT gpu, count(*) FROM fitted_models GROUP BY gpu");
    while (statement.step()) fits_per_gpu[statement.column_text(0)] = statement.column_int64(1);
  }
  std::printf("\n");
  std::vector<std::vector<std::string>> gpus{{"GPU", "bf16 TFLOP/s", "memory GiB", "HBM TB/s", "intra-node",
                                              "inter-node", "source", "kernels", "collectives", "fits"}};
  std::set<std::string> listed;
  for (const GpuModel& gpu : load_gpu_models(database)) {
    listed.insert(gpu.name);
    gpus.push_back({gpu.name, fixed(gpu.peak_bf16_tflops, 1),
                    fixed(static_cast<double>(gpu.memory_bytes) / (1LL << 30), 1),
                    fixed(gpu.hbm_bandwidth_bytes_per_s / 1e12, 3), gpu.default_intra_node_interconnect,
                    gpu.default_inter_node_interconnect, gpu.source,
                    std::to_string(kernels_per_gpu[gpu.name]), std::to_string(collectives_per_gpu[gpu.name]),
                    std::to_string(fits_per_gpu[gpu.name])});
  }
  for (const auto& [name, count] : kernels_per_gpu) {
    if (listed.insert(name).second) {
      gpus.push_back({name + " (not in gpu_models)", "-", "-", "-", "-", "-", "-", std::to_string(count),
                      std::to_string(collectives_per_gpu[name]), std::to_string(fits_per_gpu[name])});
    }
  }
  print_table(gpus);

  std::vector<std::vector<std::string>> versions{
      {"measured on", "driver", "CUDA", "cuBLAS", "NCCL", "commit", "rows", "newest"}};
  Statement statement(
      database,
      "SELECT gpu, driver_version, cuda_version, cublas_version, nccl_version, commit_hash, count(*), "
      "max(measured_at) FROM (SELECT gpu, driver_version, cuda_version, cublas_version, nccl_version, "
      "commit_hash, measured_at FROM kernel_timings UNION ALL SELECT gpu, driver_version, "
      "cuda_version, cublas_version, nccl_version, commit_hash, measured_at FROM collective_timings) "
      "GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 8");
  while (statement.step()) {
    std::vector<std::string> row;
    for (int c = 0; c < 8; ++c) {
      const std::string text = statement.column_text(c);
      row.push_back(text.empty() ? "-" : text);
    }
    versions.push_back(row);
  }
  std::printf("\n");
  if (versions.size() == 1) {
    std::printf(
        "no measurements yet: ops are priced from the catalog (analytic); `megatune profile` measures "
        "them\n");
  } else {
    print_table(versions);
  }
  return 0;
}

// A command that writes refuses a database this user can only read, before it does any work.
void require_writable(const Database& database, const std::string& path, const char* command) {
  if (database.read_only()) {
    throw UserError(std::string("db ") + command + ": cost database " + path +
                    " is read-only for this user; copy it somewhere writable and pass the copy with --db");
  }
}

int run_import(const DbCommandOptions& options) {
  if (options.embedded)
    throw UserError("--embedded is read-only; import into a database file with --db FILE");
  const std::string path = resolved_path(options);
  Database database = open_for_cli(options);
  require_writable(database, path, "import");
  const std::int64_t rows = import_table_file(database, options.table, options.file);
  std::printf("imported %lld rows from %s into %s (%s)\n", static_cast<long long>(rows), options.file.c_str(),
              options.table.c_str(), path.c_str());
  return 0;
}

int run_export(const DbCommandOptions& options) {
  Database database = open_for_cli(options);
  cost_database_table(options.table);  // a clear error before any output
  TableFormat format = TableFormat::kCsv;
  if (!options.format.empty()) {
    format = table_format_from_name(options.format);
  } else if (!options.output.empty() && options.output != "-") {
    format = table_format_from_path(options.output);
  }
  if (options.output.empty() || options.output == "-") {
    export_table(database, options.table, format, std::cout);
    std::cout.flush();
    return 0;
  }
  OutputFile file(options.output, "db export -o");
  const std::int64_t rows = export_table(database, options.table, format, file.stream());
  file.commit();
  std::fprintf(stderr, "exported %lld rows of %s to %s\n", static_cast<long long>(rows),
               options.table.c_str(), options.output.c_str());
  return 0;
}

int run_fit(const DbCommandOptions& options) {
  Database database = open_for_cli(options);
  if (!options.embedded) require_writable(database, resolved_path(options), "fit");
  std::vector<std::string> gpus;
  if (!options.gpu.empty()) {
    const HardwareCatalog catalog = HardwareCatalog::load(database);
    const GpuModel* gpu = catalog.find_gpu(options.gpu);
    gpus.push_back(gpu != nullptr ? gpu->name : options.gpu);
  } else {
    Statement statement(database,
                        "SELECT DISTINCT gpu FROM (SELECT gpu FROM kernel_timings UNION SELECT gpu FROM "
                        "collective_timings) ORDER BY gpu");
    while (statement.step()) gpus.push_back(statement.column_text(0));
  }
  if (gpus.empty()) {
    std::printf("nothing to fit: the database holds no measurements (run `megatune profile` first)\n");
    return 0;
  }
  std::vector<std::vector<std::string>> rows{{"GPU", "model", "variant", "points", "r2 (log time)", "MAPE"}};
  for (const std::string& gpu : gpus) {
    std::vector<FittedModel> fitted;
    try {
      fitted = fit_and_store(database, gpu);
    } catch (const UserError& error) {
      if (!options.gpu.empty()) throw;
      std::fprintf(stderr, "skipped measurements of \"%s\": %s\n", gpu.c_str(), error.what());
    }
    for (const FittedModel& fit : fitted) {
      rows.push_back({fit.gpu, fit.model_kind, fit.variant, std::to_string(fit.n_points), fixed(fit.r2, 4),
                      fixed(fit.mape * 100, 2) + "%"});
    }
  }
  if (rows.size() == 1) {
    std::printf("no variant has enough measurements to fit yet\n");
  } else {
    print_table(rows);
  }
  return 0;
}

// nccl-tests' names of the collectives `db price` prices.
const std::vector<std::string> kCollectiveNames = {"all_reduce",     "all_to_all", "all_gather",
                                                   "reduce_scatter", "send_recv",  "broadcast"};

// Every op `db price` knows: GEMM, attention, the collectives and the memory-bound kinds of the step program.
std::vector<std::string> price_op_names() {
  std::vector<std::string> names = {"gemm", "attention_fwd", "attention_bwd"};
  names.insert(names.end(), kCollectiveNames.begin(), kCollectiveNames.end());
  for (int kind = static_cast<int>(layouts::OpKind::kEmbedding);
       kind <= static_cast<int>(layouts::OpKind::kOptimizer); ++kind)
    names.push_back(layouts::op_kind_name(static_cast<layouts::OpKind>(kind)));
  return names;
}

int run_price(const DbCommandOptions& options) {
  const ClusterSpec cluster = parse_cluster_spec(options.cluster);
  Database database = open_for_cli(options);
  CostModel model(database, cluster);
  const layouts::DType dtype = parse_dtype(options.dtype);
  const auto& s = options.shape;
  auto need = [&](std::size_t count, const char* what) {
    if (s.size() != count) {
      throw UserError("--shape for " + options.op + " takes " + std::to_string(count) + " numbers: " + what);
    }
  };
  for (const std::int64_t value : s) {
    if (value <= 0) {
      throw UserError("--shape " + std::to_string(value) +
                      ": every number of an op's shape must be positive");
    }
  }
  // Past these sizes the products of shape numbers leave int64 and the prices are nonsense.
  const std::int64_t limit = options.op == "gemm" || options.op.rfind("attention", 0) == 0
                                 ? std::int64_t{1} << 24
                                 : std::int64_t{1} << 50;
  for (const std::int64_t value : s) {
    if (value > limit) {
      throw UserError("--shape " + std::to_string(value) + " is larger than " + std::to_string(limit) +
                      " for " + options.op + "; give a realistic size");
    }
  }
  if (s.size() == 5 && s[1] % s[2] != 0) {
    throw UserError("--shape: " + std::to_string(s[1]) + " heads are not a multiple of " +
                    std::to_string(s[2]) + " key/value heads; give KV_HEADS dividing HEADS");
  }
  const bool collective =
      std::find(kCollectiveNames.begin(), kCollectiveNames.end(), options.op) != kCollectiveNames.end();
  if (collective && options.op != "send_recv" &&
      (options.group_size > cluster.world_size() || options.group_nodes > cluster.nodes ||
       options.group_size > options.group_nodes * cluster.gpus_per_node)) {
    throw UserError("--group-size " + std::to_string(options.group_size) + " --group-nodes " +
                    std::to_string(options.group_nodes) + " does not fit --cluster " + cluster.short_name() +
                    "; give at most " + std::to_string(cluster.gpus_per_node) +
                    " ranks per node and at most " + std::to_string(cluster.nodes) + " nodes");
  }
  if (options.group_size < 1 || options.group_nodes < 1 || options.group_nodes > options.group_size) {
    throw UserError("--group-size " + std::to_string(options.group_size) + " --group-nodes " +
                    std::to_string(options.group_nodes) +
                    ": a collective group needs at least 1 rank on 1 to group-size nodes");
  }
  if (options.group_nodes > 1 && options.group_size % options.group_nodes != 0) {
    throw UserError("--group-nodes " + std::to_string(options.group_nodes) +
                    " does not divide --group-size " + std::to_string(options.group_size) +
                    "; give a node count that divides the group");
  }
  const bool attention = options.op.rfind("attention", 0) == 0;
  for (const std::string& flag : options.price_flags_given) {
    const bool applies = flag == "--no-causal" ? attention : collective && options.op != "send_recv";
    if (!applies) {
      throw UserError(flag + " does not apply to " + options.op + " (it would be ignored); drop it" +
                      (flag == "--no-causal" ? " or price attention_fwd / attention_bwd"
                                             : " or price a collective such as all_reduce"));
    }
  }
  OpCost cost;
  std::string detail;
  if (options.op == "gemm") {
    need(3, "M N K");
    cost = model.gemm(s[0], s[1], s[2], dtype);
    detail = fixed(2.0 * s[0] * s[1] * s[2] / cost.time_s / 1e12, 1) + " TFLOP/s";
  } else if (options.op == "attention_fwd" || options.op == "attention_bwd") {
    need(5, "BATCH HEADS KV_HEADS SEQ HEAD_DIM");
    layouts::AttentionShape shape;
    shape.batch = s[0];
    shape.heads = s[1];
    shape.kv_heads = s[2];
    shape.seq_q = shape.seq_kv = s[3];
    shape.head_dim = s[4];
    shape.causal = options.causal;
    const bool forward = options.op == "attention_fwd";
    cost = forward ? model.attention_forward(shape, dtype) : model.attention_backward(shape, dtype);
    const double flops = AttentionCostModel::flops(
        forward ? AttentionDirection::kForward : AttentionDirection::kBackward, shape);
    detail = fixed(flops / cost.time_s / 1e12, 1) + " TFLOP/s";
  } else if (collective) {
    need(1, "BYTES");
    const CollectiveOp op = parse_collective_op(options.op);
    const CollectiveGroup group{op == CollectiveOp::kSendRecv ? 2 : options.group_size, options.group_nodes};
    cost = model.collective(op, static_cast<double>(s[0]), group);
    if (cost.time_s > 0) {
      detail = "busbw " +
               fixed(static_cast<double>(s[0]) * bus_factor(op, group.size) / cost.time_s / 1e9, 1) +
               " GB/s over " + std::to_string(group.size) + " ranks on " + std::to_string(group.nodes) +
               " node(s)";
    }
  } else {
    need(1, "BYTES");
    cost = model.memory_bound_model().cost(options.op, static_cast<double>(s[0]));
    detail = fixed(static_cast<double>(s[0]) / cost.time_s / 1e9, 1) + " GB/s";
  }
  std::printf("%s on %s: %s us (%s), %s\n", options.op.c_str(), cluster.describe().c_str(),
              fixed(cost.time_s * 1e6, 2).c_str(), provenance_name(cost.provenance), detail.c_str());
  return 0;
}

const Registrar kDbCommand{Command{
    "db", "The cost database: info, import/export (CSV/JSON), fit cost models, price an op", 60,
    [](CLI::App& sub) -> std::function<int()> {
      auto options = std::make_shared<DbCommandOptions>();
      sub.require_subcommand(1);
      sub.add_option("--db", options->database_path,
                     "Cost database file (default: $MEGATUNE_DB, else ~/.cache/megatune/costs.db)")
          ->expected(1);
      CLI::Option* db_option = sub.get_option("--db");
      sub.add_flag("--embedded", options->embedded,
                   "Use the data compiled into the binary (catalog + shipped measurements) instead of a file")
          ->excludes(db_option);
      sub.fallthrough();
      CLI::App* info =
          sub.add_subcommand("info", "Schema version, rows per table, GPUs and software versions");
      CLI::App* import =
          sub.add_subcommand("import", "Import a CSV or JSON file into a table (all or nothing)");
      import->add_option("file", options->file, "FILE.csv or FILE.json")->required();
      import->add_option("--table", options->table, "Target table")->required();
      CLI::App* exporter = sub.add_subcommand("export", "Export a table as CSV or JSON");
      exporter->add_option("--table", options->table, "Table to export")->required();
      exporter
          ->add_option("--format", options->format, "csv or json (default: from -o's extension, else csv)")
          ->check(CLI::IsMember({"csv", "json"}));
      exporter->add_option("-o,--output", options->output, "Output file (default: standard output)");
      CLI::App* fit = sub.add_subcommand("fit", "Fit cost models from the measurements and store them");
      fit->add_option("--gpu", options->gpu, "Only this GPU (default: every GPU with measurements)");
      CLI::App* price =
          sub.add_subcommand("price", "Price one op on a cluster and say where the price comes from");
      price
          ->add_option(
              "op", options->op,
              "gemm | attention_fwd | attention_bwd | all_reduce | all_gather | reduce_scatter | "
              "all_to_all | send_recv | broadcast | a memory-bound kind (norm, rope, optimizer, ...)")
          ->required()
          ->check(CLI::IsMember(price_op_names()));
      price
          ->add_option("--shape", options->shape,
                       "gemm: M N K; attention: BATCH HEADS KV_HEADS SEQ HEAD_DIM; others: BYTES")
          ->required();
      price->add_option("--cluster", options->cluster, "NODESxGPUSxTYPE or a cluster JSON file")
          ->default_val("1x8xH100");
      price->add_option("--dtype", options->dtype, "bf16 | fp16 | fp8 | fp32")
          ->default_val("bf16")
          ->check(CLI::IsMember({"bf16", "fp16", "fp8", "fp32", "tf32"}, CLI::ignore_case));
      price->add_option("--group-size", options->group_size, "Collective group size")
          ->default_val(8)
          ->check(integer_at_least(1));
      price->add_option("--group-nodes", options->group_nodes, "Nodes the collective group spans")
          ->default_val(1)
          ->check(integer_at_least(1));
      price->add_flag("!--no-causal", options->causal, "Attention without the causal mask");
      CLI::App* calibrate = sub.add_subcommand(
          "calibrate", "Fit corrections from traced runs (train --trace-dir) and store them with provenance");
      calibrate->add_option("--run", options->calibrate.runs, "the --trace-dir of a megatune train run")
          ->required();
      calibrate->add_option("--cluster", options->calibrate.cluster,
                            "the GPU whose prices are corrected, as NODESxGPUSxTYPE (default: the run's own; "
                            "required for a CPU run)");
      sub.footer(
          "Examples:\n  megatune db info\n  megatune db export --table gpu_models --format json\n"
          "  megatune db import timings.csv --table kernel_timings\n  megatune db fit --gpu H200\n"
          "  megatune db price gemm --shape 8192 8192 8192 --cluster 1x8xH200\n"
          "  megatune db calibrate --run run-mbs1 --run run-mbs4");
      return [options, info, import, exporter, fit, price, calibrate]() {
        if (calibrate->parsed()) {
          if (options->embedded)
            throw UserError("db calibrate writes the database: pass --db FILE (or none), not --embedded");
          options->calibrate.database_given = !options->database_path.empty();
          run_calibrate(
              options->calibrate, [&] { return open_for_cli(*options); }, std::cout);
          return 0;
        }
        if (info->parsed()) return run_info(*options);
        if (import->parsed()) return run_import(*options);
        if (exporter->parsed()) return run_export(*options);
        if (fit->parsed()) return run_fit(*options);
        if (price->parsed()) {
          for (const char* flag : {"--group-size", "--group-nodes", "--no-causal"})
            if (price->count(flag) > 0) options->price_flags_given.push_back(flag);
          return run_price(*options);
        }
        return 1;
      };
    }}};

}  // namespace
}  // namespace megatune::tools
