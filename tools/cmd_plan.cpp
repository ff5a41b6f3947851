// `megatune plan`: search the parallel layouts of a model on a cluster, print the ranked table and why the
// winner wins, and write the plan as JSON, as `megatune train` arguments and as Megatron-LM arguments.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "base/input_file.h"
#include "base/output_file.h"
#include "base/user_error.h"
#include "base/worker_threads.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_database.h"
#include "cost_models/record_store.h"
#include "planner/layout_comparison.h"
#include "planner/memory_model.h"
#include "planner/plan_report.h"
#include "planner/pricing_source.h"
#include "planner/search.h"
#include "tools/comm_pricing_flags.h"
#include "tools/command_registry.h"
#include "tools/executor_memory_model.h"
#include "tools/fp8_flags.h"
#include "tools/input_checks.h"
#include "tools/measure_top.h"
#include "tools/megatron_args.h"
#include "tools/plan_against.h"
#include "tools/plan_flags.h"
#include "tools/progress_bar.h"

namespace megatune::tools {
namespace {

struct PlanCommandOptions {
  MegatronArgs args;
  std::string cluster = "1x8xH100";
  std::string db;
  bool no_calibration = false;  // --no-calibration
  std::string output;
  int top_k = 10;
  long long threads = 0;
  bool progress = false;
  double time_limit_s = 0.0;           // --time-limit; 0: none
  std::optional<std::string> against;  // --against: the Megatron flags of the layout to set beside the pick
  bool allow_tp_across_nodes = false;
  bool no_uneven = false;
  bool no_vpp = false;
  double headroom = 0.05;
  bool save = false;
  // --memory-model: the executor's own arena by default (megatune trains the plan); the search sizes only the
  // candidates it would simulate.
  planner::MemoryModelKind memory_model = planner::MemoryModelKind::kMegatune;
  MeasureTopOptions measure;  // --measure-top and its companions
  CommPricingFlags comm;  // --tp-comm-overlap, --grad-reduce-in-bf16, --accumulate-allreduce-grads-in-fp32
  // --fp8-format and its companions (tools/fp8_flags.h): the user's numerics, which every candidate is
  // priced, sized and emitted with (not a knob the search tries).
  layouts::Fp8Settings fp8;
};

// The flags every candidate runs with, after the winner's layout on each emitted command line: FP8 (with
// --bf16, which train's FP8 needs on the CPU backend too) and, for Megatron-LM, the communication settings.
std::vector<std::string> train_run_flags(const PlanCommandOptions& o) {
  std::vector<std::string> flags = fp8_flag_arguments(o.fp8);
  if (!flags.empty()) flags.insert(flags.begin(), "--bf16");
  return flags;
}
std::vector<std::string> megatron_run_flags(const PlanCommandOptions& o,
                                            const layouts::ParallelConfig& config) {
  std::vector<std::string> flags = megatron_comm_arguments(o.comm, config);
  for (std::string& flag : fp8_flag_arguments(o.fp8)) flags.push_back(std::move(flag));
  return flags;
}

// "plan.json" -> "plan" + suffix, next to it.
std::string sibling(const std::string& output, const std::string& suffix) {
  std::filesystem::path p(output);
  return (p.parent_path() / (p.stem().string() + suffix)).string();
}

// --measure-top: measure the top candidates and make the fastest measured one the plan's winner. Returns the
// measurements as JSON for plan.json.
std::string measure_and_rerank(const PlanCommandOptions& o, const layouts::ModelSpec& model,
                               const cost_models::ClusterSpec& cluster, const planner::PlanRequest& request,
                               planner::PricingSource& pricing, planner::PlanResult& result) {
  MeasureTopOptions measure = o.measure;
  measure.db = o.db;
  measure.save = o.save;
  measure.fp8 = o.fp8;
  const MeasureTopResult measured =
      measure_top_candidates(measure, model, cluster, result, request.step, *pricing.cost_model, std::cout);
  const std::size_t fastest = measured.fastest;
  const auto at = result.ranked.begin() + static_cast<std::ptrdiff_t>(fastest);
  std::rotate(result.ranked.begin(), at, at + 1);
  result.why_winner = "fastest measured of the top " + std::to_string(o.measure.candidates) +
                      " (megatune plan --measure-top), predicted rank " + std::to_string(fastest + 1);
  std::printf(
      "\nthe plan's winner is the fastest measured candidate (predicted rank %zu): plan.json and the .args "
      "files are written for it\n",
      fastest + 1);
  return measured.json;
}

// The plan JSON with a "measured" member (the --measure-top candidates) when there are measurements.
std::string with_measurements(std::string plan_json, const std::string& measured_json) {
  const std::size_t end = plan_json.rfind("\n}");
  if (measured_json.empty() || end == std::string::npos) return plan_json;
  return plan_json.insert(end, ",\n  \"measured\": " + measured_json);
}

// The search's progress bar on stderr: with --progress from the start, on a terminal once the search has
// run a second; none otherwise.
std::unique_ptr<ProgressBar> search_progress(bool forced, planner::PlanRequest& request) {
  const bool terminal = isatty(STDERR_FILENO) != 0;
  if (!forced && !terminal) return nullptr;
  auto bar = std::make_unique<ProgressBar>(std::cerr, "searching", 0, terminal);
  if (!forced) bar->show_after(1.0);
  request.progress = [bar = bar.get()](const planner::SearchProgress& p) {
    bar->set_total(static_cast<std::size_t>(p.total));
    char detail[64];
    if (p.best_step_s > 0)
      std::snprintf(detail, sizeof detail, "%s, best %.3f s", p.phase, p.best_step_s);
    else
      std::snprintf(detail, sizeof detail, "%s", p.phase);
    bar->update(static_cast<std::size_t>(p.done), detail);
  };
  return bar;
}

int run_plan(const PlanCommandOptions& o) {
  const MegatronArgs& a = o.args;
  if (a.model_preset.empty() && !a.num_layers) {
    throw UserError(
        "--model: name a preset (e.g. --model llama3-70b) or give the shape flags (--num-layers ...)");
  }
  layouts::ModelSpec model = resolve_model(a);
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(o.cluster);
  if (a.world_size && *a.world_size != cluster.world_size()) {
    throw UserError("--world-size " + std::to_string(*a.world_size) + " differs from --cluster " + o.cluster +
                    " (" + std::to_string(cluster.world_size()) + " GPUs): drop --world-size");
  }
  if (!a.global_batch_size) throw UserError("--global-batch-size is required (e.g. --global-batch-size 512)");
  if (o.top_k < 1) throw UserError("--top-k must be at least 1");
#ifndef MEGATUNE_HAVE_CUDA
  if (o.measure.candidates > 0 && o.measure.device == "cuda")
    throw UserError("--measure-device cuda: this megatune was built without CUDA; use --measure-device cpu");
#endif
  if (!o.measure.keep_dir.empty() && o.measure.candidates == 0)
    throw UserError("--measure-keep needs --measure-top K (the candidates to measure)");
  if (!(o.headroom >= 0.0 && o.headroom < 1.0)) throw UserError("--memory-headroom must be in [0, 1)");
  bool threads_capped = false;
  const int threads = resolve_thread_count(o.threads, "--threads", &threads_capped);
  if (threads_capped)
    std::fprintf(stderr, "megatune plan: --threads %lld capped to %d\n", o.threads, threads);

  planner::PricingSource pricing = planner::open_pricing_source(o.db, cluster, !o.no_calibration);
  planner::CostModelPricer pricer(*pricing.cost_model);

  planner::PlanRequest request;
  request.model = model;
  request.world_size = cluster.world_size();
  request.global_batch_size = *a.global_batch_size;
  request.top_k = std::max(o.top_k, o.measure.candidates);  // every measured candidate is ranked
  request.memory_headroom_fraction = o.headroom;
  request.memory_model = o.memory_model;
  request.peak_memory_of = peak_memory_function(o.memory_model);
  request.threads = threads;
  planner::SearchSpace& space = request.space;
  space.allow_tp_across_nodes = o.allow_tp_across_nodes;
  space.uneven_layouts = !o.no_uneven;
  space.virtual_pipeline = !o.no_vpp;
  pin_search_knobs(a, space);
  // Megatron runs --tp-comm-overlap only with sequence parallelism: every TP > 1 candidate then has it.
  if (o.comm.tp_comm_overlap) space.sequence_parallel = {true};
  request.tp_comm_overlap = o.comm.tp_comm_overlap;
  request.step.grad_reduce_in_bf16 = request.memory.grad_reduce_in_bf16 = o.comm.grad_reduce_in_bf16;
  request.step.fp8 = request.memory.step.fp8 = o.fp8;
  if (a.tensor_model_parallel_size && *a.tensor_model_parallel_size > cluster.gpus_per_node)
    space.allow_tp_across_nodes = true;
  request.time_limit_s = o.time_limit_s;
  // Checked, simulated and sized before the search: bad flags cost no search.
  std::optional<planner::PlanCandidate> against;
  if (o.against) against = against_candidate(*o.against, request, pricer);
  const std::unique_ptr<ProgressBar> bar = search_progress(o.progress, request);

  std::printf("planning %s (seq %d, global batch %d) on %s\nmodel: %s\npriced from: %s\n", model.name.c_str(),
              model.seq_length, *a.global_batch_size, cluster.describe().c_str(),
              planner::describe_model(model).c_str(), pricing.description.c_str());
  if (o.fp8.enabled())
    std::printf("precision: %s\n  (every candidate; %s)\n", layouts::describe(o.fp8).c_str(),
                planner::fp8_pricing_description(*pricing.cost_model).c_str());
  std::fflush(stdout);
  planner::PlanResult result = planner::plan(request, pricer);
  if (bar) bar->finish();
  const planner::PlanStatistics& st = result.statistics;

  std::printf("\n%s", planner::format_plan_table(result).c_str());
  if (!result.why_winner.empty()) std::printf("\nwhy: %s\n", result.why_winner.c_str());
  std::printf(
      "search: %lld layouts enumerated, %lld invalid, %lld out of memory, %lld beaten by their lower bound, "
      "%lld "
      "simulated in %.2f s\n",
      static_cast<long long>(st.enumerated), static_cast<long long>(st.invalid),
      static_cast<long long>(st.out_of_memory), static_cast<long long>(st.pruned_by_bound),
      static_cast<long long>(st.simulated), st.seconds);
  if (st.stopped_by_time_limit) {
    std::printf(
        "time limit: stopped after %.2f s; the plan is the best of the %lld candidates simulated, %lld were "
        "not reached (raise --time-limit to search them all)\n",
        st.seconds, static_cast<long long>(st.simulated), static_cast<long long>(st.not_reached));
  }
  if (st.failed > 0) {
    std::printf("warning: %lld candidates failed to simulate; first: %s\n", static_cast<long long>(st.failed),
                st.first_failure.c_str());
  }

  const std::string measured =
      o.measure.candidates > 0 ? measure_and_rerank(o, model, cluster, request, pricing, result) : "";
  const planner::PlanCandidate& winner = result.ranked.front();
  planner::MemoryOptions memory_options = request.memory;
  const planner::MemoryEstimate memory = request.peak_memory_of(model, winner.config, memory_options);
  std::printf("\nwinner: %s, layout %s\nsettings: %s\nmemory model: %s\n%s",
              planner::describe(winner).c_str(), winner.layout.c_str(),
              planner::describe_run_settings(model, winner.config).c_str(),
              planner::memory_model_name(o.memory_model), memory.itemize().c_str());
  if (o.memory_model == planner::MemoryModelKind::kMegatune) {
    // The Megatron command line below runs Megatron-LM, whose memory is Megatron's model.
    const planner::MemoryEstimate megatron = planner::peak_memory(model, winner.config, memory_options);
    std::printf("  Megatron-LM would need %s on pp rank %d (Megatron's memory model)%s\n",
                planner::format_bytes(double(megatron.total_bytes)).c_str(), megatron.pp_rank,
                double(megatron.total_bytes) > double(result.memory_capacity_bytes) * (1.0 - o.headroom)
                    ? ": more than fits; rank by --memory-model megatron for a Megatron run"
                    : "");
  }
  std::printf("time per op kind on pp rank %d (one iteration):\n%s", winner.simulation.critical_stage,
              winner.simulation.kind_table().c_str());
  if (against) {
    std::printf("\nagainst your layout (--against \"%s\"):\n%s", o.against->c_str(),
                planner::format_layout_comparison(*against, winner, result.memory_capacity_bytes,
                                                  result.memory_capacity_bytes * (1.0 - o.headroom))
                    .c_str());
  }

  const std::vector<std::string> train_flags = train_run_flags(o);
  const std::vector<std::string> megatron_flags = megatron_run_flags(o, winner.config);
  std::vector<std::string> train_args = planner::megatune_train_arguments(model, winner);
  train_args.insert(train_args.end(), train_flags.begin(), train_flags.end());
  const std::string train = planner::shell_join("megatune train", train_args);
  std::vector<std::string> megatron_args = planner::megatron_arguments(model, winner);
  megatron_args.insert(megatron_args.end(), megatron_flags.begin(), megatron_flags.end());
  const std::string megatron = planner::shell_join("python pretrain_gpt.py", megatron_args);
  // A device or FIFO as --output (/dev/stdout) takes the plan JSON alone; the argument files go next to a
  // regular file only.
  const std::string output_kind = o.output.empty() ? "" : non_regular_file_reason(o.output);
  const bool siblings = !o.output.empty() && (output_kind.empty() || output_kind == "does not exist");
  if (!siblings)
    std::printf("\nmegatune train:\n  %s\nMegatron-LM:\n  %s\n", train.c_str(), megatron.c_str());
  if (siblings) {
    const std::string train_path = sibling(o.output, ".megatune.args");
    const std::string megatron_path = sibling(o.output, ".megatron.args");
    // All three are written to temporaries first, then renamed: a failed write replaces none of them.
    OutputFile plan_file(o.output, "--output");
    OutputFile train_file(train_path, "--output");
    OutputFile megatron_file(megatron_path, "--output");
    plan_file.stream() << with_measurements(
        planner::plan_json(model, cluster, result, memory, train_flags, megatron_flags), measured);
    train_file.stream() << train << "\n";
    megatron_file.stream() << megatron << "\n";
    plan_file.commit();
    train_file.commit();
    megatron_file.commit();
    std::printf("\nwrote %s, %s, %s\n", o.output.c_str(), train_path.c_str(), megatron_path.c_str());
  } else if (!o.output.empty()) {
    write_output_file(
        o.output,
        with_measurements(planner::plan_json(model, cluster, result, memory, train_flags, megatron_flags),
                          measured),
        "--output");
  }
  if (o.save) {
    const std::string path = o.db.empty() ? cost_models::default_cost_database_path() : o.db;
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    cost_models::Database database = cost_models::open_cost_database(path);
    cost_models::PlanRecord record;
    record.model = model.name;
    record.cluster = cluster.short_name();
    record.config_json = planner::candidate_json(winner);
    record.predicted_step_time_s = winner.simulation.step_time_s;
    record.predicted_mfu = winner.simulation.mfu;
    record.peak_memory_bytes = winner.peak_memory_bytes;
    record.created_at = cost_models::utc_now_iso8601();
    const std::int64_t id = cost_models::upsert_plan(database, record);
    std::printf("recorded the plan as plan %lld in %s\n", static_cast<long long>(id), path.c_str());
  }
  return 0;
}

void add_measure_flags(CLI::App& sub, MeasureTopOptions& m) {
  sub.add_option(
         "--measure-top", m.candidates,
         "Train the top K candidates a few iterations (megatune train --mock-data), show predicted vs "
         "measured, calibrate and re-rank by measured step time (0: off)")
      ->capture_default_str()
      ->check(integer_at_least(0))
      ->group("Measure");
  sub.add_option("--measure-iterations", m.iterations,
                 "Iterations each measured candidate trains (the last few, up to 3, are traced)")
      ->capture_default_str()
      ->check(integer_at_least(1))
      ->group("Measure");
  sub.add_option("--measure-device", m.device, "cuda | cpu (cpu: ranks as threads on the CPU backend)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->group("Measure");
  sub.add_option("--measure-keep", m.keep_dir, "Keep the traced runs in this folder (default: removed)")
      ->group("Measure");
  sub.add_option("--measure-timeout", m.timeout_s, "Wall-clock limit of each candidate's run, in seconds")
      ->capture_default_str()
      ->check(positive_number())
      ->group("Measure");
}

const Registrar kPlanCommand{Command{
    "plan",
    "Search TP/PP/VPP/DP/CP/EP layouts, micro-batch, recomputation and optimizer sharding for a model", 30,
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<PlanCommandOptions>();
      add_model_flags(sub, o->args);
      add_parallel_flags(sub, o->args);
      add_batch_flags(sub, o->args);
      sub.add_option("--cluster", o->cluster, "NODESxGPUSxTYPE (e.g. 8x8xH100) or a cluster JSON file")
          ->capture_default_str()
          ->group("Planner");
      sub.add_option("--db", o->db,
                     "Cost database (default: the default database if it exists, else the embedded catalog)")
          ->group("Planner");
      sub.add_flag("--no-calibration", o->no_calibration,
                   "Price without the corrections fitted from traced runs (megatune db calibrate)")
          ->group("Planner");
      sub.add_option("--top-k", o->top_k, "Rows of the ranked table")
          ->capture_default_str()
          ->check(integer_at_least(1))
          ->group("Planner");
      sub.add_option(
             "--output,-o", o->output,
             "Write the plan JSON here, with <stem>.megatune.args and <stem>.megatron.args next to it")
          ->group("Planner");
      sub.add_option("--threads", o->threads,
                     "Simulation threads (default 0: all cores; capped at 4 per core)")
          ->check(integer_at_least(0))
          ->group("Planner");
      sub.add_flag("--progress", o->progress,
                   "Progress bar from the start, even when stderr is not a terminal (on a terminal it "
                   "appears once the search has run a second)")
          ->group("Planner");
      sub.add_option("--against", o->against,
                     "Megatron parallel and batch flags of a layout to set beside the pick, quoted as one "
                     "argument, e.g. --against \"--tp 8 --pp 4 --micro-batch-size 1\"")
          ->group("Planner");
      sub.add_option("--time-limit", o->time_limit_s,
                     "Stop searching after this many seconds and return the best plan found so far")
          ->check(positive_number())
          ->group("Planner");
      sub.add_flag("--allow-tp-across-nodes", o->allow_tp_across_nodes, "Search TP sizes larger than a node")
          ->group("Planner");
      sub.add_flag("--no-uneven-layouts", o->no_uneven, "Only uniform pipeline splits")->group("Planner");
      sub.add_flag("--no-virtual-pipeline", o->no_vpp, "No interleaved (VPP) schedules")->group("Planner");
      sub.add_flag("--save", o->save,
                   "Record the winning plan in the cost database (--db, else the default database) for later "
                   "predicted-vs-measured comparison")
          ->group("Planner");
      add_memory_model_flag(sub, o->memory_model, "Planner");
      add_measure_flags(sub, o->measure);
      add_comm_pricing_flags(sub, o->comm, "Planner");
      add_fp8_flags(sub, o->fp8);
      sub.add_option("--memory-headroom", o->headroom, "Fraction of GPU memory to keep free (0..1)")
          ->capture_default_str()
          ->check(fraction_in(0.0, 1.0, false))
          ->group("Planner");
      sub.footer(
          "Parallel flags given (--tp, --pp, --cp, --dp, --ep, --mbs, --recompute-granularity, "
          "--sequence-parallel, --use-distributed-optimizer, --pipeline-model-parallel-layout, "
          "--num-virtual-stages-per-pipeline-rank, --num-layers-per-virtual-pipeline-stage, "
          "--decoder-first/last-pipeline-num-layers, --account-for-embedding/loss-in-pipeline-split, "
          "--recompute-method uniform|block, --recompute-num-layers N) pin that knob; "
          "--moe-token-dispatcher-type, --microbatch-group-size-per-virtual-pipeline-stage and "
          "--use-tp-pp-dp-mapping are what every candidate runs with. --against takes the same parallel and "
          "batch flags as one quoted argument.\nExample:\n  megatune plan --model "
          "llama3-70b "
          "--cluster "
          "8x8xH100 --global-batch-size 512 --seq-length 4096 -o plan.json");
      return [o]() { return run_plan(*o); };
    }}};

}  // namespace
}  // namespace megatune::tools
