// run_compare: read the trace, rebuild (model, layout, cluster), check the join, simulate at kernel level,
// size the executor's arena, and render the comparison.
#include "tools/compare_command.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "base/input_file.h"
#include "base/output_file.h"
#include "base/user_error.h"
#include "calibration/compare_report.h"
#include "calibration/comparison_store.h"
#include "calibration/leave_one_out.h"
#include "calibration/measured_run.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/json_value.h"
#include "executor/backend/sizing_backend.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/training/arena_sizing.h"
#include "planner/pricing_source.h"
#include "tools/traced_run_target.h"

namespace megatune::tools {
namespace {

struct Target {
  std::vector<std::string> args;
  std::string cluster, source;
};

Target plan_target(const std::string& path) {
  const std::string text = read_regular_file(path, "--plan");  // a FIFO or a directory is refused, not read
  try {
    const cost_models::JsonValue plan = cost_models::JsonValue::parse(text);
    Target t;
    for (const cost_models::JsonValue& a : plan.at("megatune_train_args").as_array())
      t.args.push_back(a.as_string());
    t.cluster = plan.at("cluster").as_string();
    t.source = "--plan " + path;
    return t;
  } catch (const cost_models::JsonParseError& e) {
    throw UserError("--plan " + path + ": " + e.what() + "; give the plan.json that megatune plan -o wrote");
  } catch (const std::runtime_error& e) {
    throw UserError("--plan " + path + ": " + e.what() + "; give the plan.json that megatune plan -o wrote");
  }
}

using Resolved = ResolvedTarget;

// Measured arena, the executor's own sizing and the memory model, for the rank with the largest arena.
std::vector<calibration::MemoryColumn> memory_columns(const calibration::MeasuredRun& run,
                                                      const Resolved& target) {
  const calibration::TracedRank* peak = &run.ranks.front();
  for (const calibration::TracedRank& r : run.ranks)
    if (r.arena_capacity_bytes > peak->arena_capacity_bytes) peak = &r;
  std::vector<calibration::MemoryColumn> columns;
  calibration::MemoryColumn measured{"measured arena", peak->arena_capacity_bytes, {}, ""};
  for (const calibration::TracedArenaUse& u : peak->arena) measured.items.push_back({u.what, u.bytes});
  measured.note = "rank " + std::to_string(peak->rank) + ", " + peak->backend;
  if (peak->device_memory_used_bytes >= 0)
    measured.note +=
        "; device memory in use " + planner::format_bytes(double(peak->device_memory_used_bytes));
  columns.push_back(std::move(measured));

  calibration::MemoryColumn sizing{"executor sizing", -1, {}, ""};
  try {
    executor::TrainOptions options;
    options.bf16 = run.device == "cuda" || run.backend.find("bf16") != std::string::npos;
    options.fp8 = target.step.fp8;
    std::unique_ptr<executor::Backend> backend;
    if (run.device == "cpu") {
      backend = std::make_unique<executor::CpuBackend>(options.bf16);
      sizing.note = "size_training_arena on the CPU backend (4-byte storage)";
    } else {
      backend = std::make_unique<executor::SizingBackend>();
      sizing.note = "size_training_arena + SizingBackend (kernel scratch not included)";
    }
    const executor::RankArena arena =
        executor::size_rank_arena(target.model, target.config, options, peak->rank, *backend);
    for (const executor::ArenaUse& u : arena.breakdown) sizing.items.push_back({u.what, u.bytes});
    sizing.total_bytes = arena.total_bytes;
  } catch (const std::exception& e) {
    sizing.note = std::string("not available: ") + e.what();
  }
  columns.push_back(std::move(sizing));

  planner::MemoryOptions memory_options;
  memory_options.step = target.step;
  const planner::MemoryEstimate megatron = planner::peak_memory(target.model, target.config, memory_options);
  calibration::MemoryColumn model{"memory model (Megatron)", megatron.total_bytes, {}, ""};
  for (const planner::MemoryItem& item : megatron.items) model.items.push_back({item.name, item.bytes});
  model.note =
      "planner/memory_model, pp rank " + std::to_string(megatron.pp_rank) + " (what megatune plan ranks by)";
  columns.push_back(std::move(model));
  return columns;
}

}  // namespace

namespace {

// --rank names one of the run's ranks.
void check_rank_option(int rank, const calibration::MeasuredRun& run) {
  if (rank < 0) return;
  for (const calibration::TracedRank& r : run.ranks)
    if (r.rank == rank) return;
  throw UserError("--rank " + std::to_string(rank) + ": --run " + run.dir + " traced ranks 0 to " +
                  std::to_string(run.ranks.size() - 1) +
                  "; give one of them, or leave --rank out for every rank");
}

calibration::RunComparison compare_one(const CompareOptions& o, const std::string& run_dir,
                                       std::ostream& out) {
  // The run must agree with its own flags before it is set beside anything.
  const TracedRunTarget own = read_traced_run(run_dir);
  const calibration::MeasuredRun& run = own.run;
  check_rank_option(o.rank, run);
  Target target{run.model_args, run.cluster, "the run's flags (" + run_dir + "/run.json)"};
  if (!o.plan.empty()) target = plan_target(o.plan);
  if (!o.simulate_args.empty()) target = {split_words(o.simulate_args), run.cluster, "--simulate-args"};
  if (!o.cluster.empty()) target.cluster = o.cluster;
  const bool own_flags = o.plan.empty() && o.simulate_args.empty();
  const Resolved resolved = own_flags ? own.target : resolve_target(target.args, target.source);
  if (!own_flags)
    calibration::check_join(run, resolved.model, resolved.config, calibration::JoinTarget::kGiven,
                            resolved.step);

  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(target.cluster);
  if (cluster.world_size() != resolved.config.world_size)
    throw UserError("--cluster " + target.cluster + " has " + std::to_string(cluster.world_size()) +
                    " GPUs, the layout " + std::to_string(resolved.config.world_size) +
                    " ranks; give --cluster with as many GPUs (e.g. 1x" +
                    std::to_string(resolved.config.world_size) + "xH200)");
  planner::PricingSource pricing = planner::open_pricing_source(o.db, cluster, !o.no_calibration);
  planner::CostModelPricer pricer(*pricing.cost_model);
  planner::SimulationOptions options;
  options.granularity = planner::SimulationGranularity::kKernel;
  options.all_ranks = resolved.config.world_size <= 64;
  options.record_op_timeline = true;
  options.step = resolved.step;
  const planner::SimulationResult simulation =
      planner::simulate(resolved.model, resolved.config, pricer, options);

  calibration::RunComparison comparison = calibration::compare_run(
      run, resolved.model, resolved.config, simulation, memory_columns(run, resolved), resolved.step);
  comparison.cluster = cluster.describe();
  comparison.priced_from = pricing.description;
  if (resolved.step.fp8.enabled())
    comparison.priced_from += "; " + layouts::describe(resolved.step.fp8) + ": " +
                              planner::fp8_pricing_description(*pricing.cost_model);
  if (o.save) calibration::save_runs(comparison, run, o.db, out);
  return comparison;
}

}  // namespace

// --leave-one-out: every run predicted from a calibration fitted on the others.
void run_leave_one_out(const CompareOptions& o, std::ostream& out) {
  calibration::parse_hold_out(o.hold_out);  // a bad value is reported before the runs are read
  if (o.runs.size() < 2)
    throw UserError(
        "--leave-one-out needs at least two --run directories (each is predicted from the others)");
  std::vector<calibration::CalibrationCase> cases;
  std::optional<cost_models::ClusterSpec> cluster;
  for (const std::string& dir : o.runs) {
    TracedRunTarget t = read_traced_run(dir);
    const cost_models::ClusterSpec spec =
        cost_models::parse_cluster_spec(o.cluster.empty() ? t.run.cluster : o.cluster);
    if (spec.world_size() != t.target.config.world_size)
      throw UserError("--run " + dir + " has " + std::to_string(t.target.config.world_size) +
                      " ranks, its cluster " + std::to_string(spec.world_size()) +
                      " GPUs; give --cluster 1x" + std::to_string(t.target.config.world_size) + "x<GPU>");
    if (cluster && spec.gpu.name != cluster->gpu.name)
      throw UserError("--run " + dir + " ran on " + spec.gpu.name + ", the first run on " +
                      cluster->gpu.name + ": evaluate one GPU at a time (or name it with --cluster)");
    if (!cluster) cluster = spec;
    cases.push_back(
        {std::move(t.run), std::move(t.target.model), std::move(t.target.config), std::move(t.target.step)});
  }
  planner::PricingSource pricing = planner::open_pricing_source(o.db, *cluster, false);
  out << "simulated on " << cluster->gpu.name << "; priced from: " << pricing.description << "\n";
  const calibration::HoldOut hold_out = calibration::parse_hold_out(o.hold_out);
  out << calibration::leave_one_out_table(calibration::leave_one_out(cases, *pricing.cost_model, hold_out),
                                          hold_out);
}

void run_compare(const CompareOptions& o, std::ostream& out) {
  if (o.runs.empty()) throw UserError("--run DIR is required: the --trace-dir of a megatune train run");
  require_distinct_runs(o.runs);
  if (o.rank < -1)
    throw UserError("--rank " + std::to_string(o.rank) + " is not a rank; give a rank >= 0, or leave it out");
  if (o.leave_one_out) {
    if (!o.simulate_args.empty() || !o.plan.empty() || !o.html.empty() || !o.perfetto.empty() || o.save)
      throw UserError(
          "--leave-one-out prints one table: leave out --simulate-args, --plan, --html, --perfetto "
          "and --save");
    run_leave_one_out(o, out);
    return;
  }
  if (!o.simulate_args.empty() && !o.plan.empty())
    throw UserError("give only one of --simulate-args and --plan");
  if (o.runs.size() > 1 && (!o.simulate_args.empty() || !o.plan.empty() || !o.perfetto.empty()))
    throw UserError(
        "--simulate-args, --plan and --perfetto take one --run; several runs are compared by their own "
        "flags");
  std::vector<calibration::RunComparison> comparisons;
  for (const std::string& dir : o.runs) {
    comparisons.push_back(compare_one(o, dir, out));
    if (o.runs.size() > 1) out << "\n";
    out << comparison_table(comparisons.back(), o.top, o.rank);
  }
  if (comparisons.size() > 1) out << calibration::layouts_table(comparisons);
  if (!o.html.empty()) {
    write_output_file(o.html,
                      comparisons.size() == 1 ? calibration::comparison_html(comparisons.front())
                                              : calibration::comparison_html(comparisons),
                      "--html");
    out << "\nwrote " << o.html << " (open it in a browser; it needs no network)\n";
  }
  if (!o.perfetto.empty()) {
    std::ostringstream trace;
    calibration::write_comparison_trace(trace, comparisons.front());
    write_output_file(o.perfetto, trace.str(), "--perfetto");
    out << "wrote " << o.perfetto
        << " (predicted and measured tracks per rank: open it in https://ui.perfetto.dev)\n";
  }
}

}  // namespace megatune::tools
