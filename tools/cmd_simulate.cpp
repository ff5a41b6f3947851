// `megatune simulate`: predict one training iteration of a given layout (step time, MFU, tokens/s, bubble,
// exposed communication, per-stage and per-op-kind times, memory) and write a Perfetto trace.
#include <cstdio>

#include "base/output_file.h"
#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "layouts/fp8.h"
#include "layouts/rank_shape.h"
#include "planner/chrome_trace.h"
#include "planner/memory_model.h"
#include "planner/pricing_source.h"
#include "planner/simulator.h"
#include "tools/comm_pricing_flags.h"
#include "tools/command_registry.h"
#include "tools/executor_memory_model.h"
#include "tools/fp8_flags.h"
#include "tools/megatron_args.h"

namespace megatune::tools {
namespace {

struct SimulateCommandOptions {
  MegatronArgs args;
  std::string cluster = "1x8xH100";
  std::string db;
  bool no_calibration = false;  // --no-calibration
  std::string trace;
  bool all_ranks = false;
  std::string granularity;  // "pass" | "kernel"; default: kernel with --trace, else pass
  CommPricingFlags comm;    // --tp-comm-overlap, --grad-reduce-in-bf16, --accumulate-allreduce-grads-in-fp32
  planner::MemoryModelKind memory_model = planner::MemoryModelKind::kMegatune;  // --memory-model
  layouts::Fp8Settings fp8;  // --fp8-format, --fp8-recipe, ... (tools/fp8_flags.h), as train takes them
};

int run_simulate(const SimulateCommandOptions& o) {
  const MegatronArgs& a = o.args;
  if (a.model_preset.empty() && !a.num_layers) {
    throw UserError(
        "--model: name a preset (e.g. --model llama3-8b) or give the shape flags (--num-layers ...)");
  }
  const layouts::ModelSpec model = resolve_model(a);
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec(o.cluster);
  MegatronArgs with_world = a;
  if (!with_world.world_size) with_world.world_size = cluster.world_size();
  layouts::ParallelConfig config = resolve_parallel(with_world);
  if (!a.world_size) {
    // The world comes from --cluster: name it (not a --world-size the user never passed).
    const long long model_parallel = static_cast<long long>(config.tp()) * config.cp() * config.pp();
    if (cluster.world_size() % model_parallel != 0) {
      std::string fits;
      for (int tp = 1; tp <= cluster.world_size(); tp *= 2)
        if (cluster.world_size() % (tp * config.cp() * config.pp()) == 0)
          fits += (fits.empty() ? "" : ", ") + std::to_string(tp);
      throw UserError("--tp " + std::to_string(config.tp()) + " x --cp " + std::to_string(config.cp()) +
                      " x --pp " + std::to_string(config.pp()) + " = " + std::to_string(model_parallel) +
                      " does not divide the " + std::to_string(cluster.world_size()) + " GPUs of --cluster " +
                      o.cluster + (fits.empty() ? "; lower --cp or --pp" : "; use --tp " + fits));
    }
  }
  if (config.world_size != cluster.world_size()) {
    throw UserError("--world-size " + std::to_string(config.world_size) + " differs from --cluster " +
                    o.cluster + " (" + std::to_string(cluster.world_size()) +
                    " GPUs): drop --world-size or change --cluster");
  }
  config.validate(model);
  check_tp_comm_overlap(o.comm, config);
  if (o.fp8.enabled())
    if (const std::string problem = layouts::fp8_shape_problem(layouts::resolve_rank_shape(model, config));
        !problem.empty())
      throw UserError("--fp8-format: " + problem +
                      ", FP8 GEMMs need multiples of 16; change the model or micro-batch shape, or simulate "
                      "without --fp8-format");

  planner::PricingSource pricing = planner::open_pricing_source(o.db, cluster, !o.no_calibration);
  planner::CostModelPricer pricer(*pricing.cost_model);
  planner::SimulationOptions options;
  options.all_ranks = o.all_ranks;
  options.record_trace = !o.trace.empty();
  options.step.grad_reduce_in_bf16 = o.comm.grad_reduce_in_bf16;
  options.step.fp8 = o.fp8;
  options.tp_comm_overlap = o.comm.tp_comm_overlap;
  if (o.granularity.empty()) {
    options.granularity = options.record_trace ? planner::SimulationGranularity::kKernel
                                               : planner::SimulationGranularity::kPass;
  } else {  // checked while parsing: pass or kernel
    options.granularity = o.granularity == "pass" ? planner::SimulationGranularity::kPass
                                                  : planner::SimulationGranularity::kKernel;
  }
  const planner::SimulationResult r = planner::simulate(model, config, pricer, options);

  std::printf(
      "simulated %s (seq %d) on %s: tp%d pp%d vpp%d dp%d cp%d ep%d, mbs %d, gbs %d, %d microbatches\n",
      model.name.c_str(), model.seq_length, cluster.describe().c_str(), config.tp(), config.pp(),
      config.vpp(model), config.dp(), config.cp(), config.ep(), config.micro_batch_size,
      config.resolved_global_batch_size(), config.num_microbatches());
  std::printf("priced from: %s\n", pricing.description.c_str());
  if (o.fp8.enabled())
    std::printf("precision: %s; %s\n", layouts::describe(o.fp8).c_str(),
                planner::fp8_pricing_description(*pricing.cost_model).c_str());
  std::printf("  step time        %10.3f s\n", r.step_time_s);
  std::printf("  MFU              %10.1f %%   (%.1f TFLOP/s per GPU of %.1f peak)\n", 100.0 * r.mfu,
              r.tflops_per_gpu, pricer.peak_bf16_tflops());
  std::printf("  tokens/s         %10.0f\n", r.tokens_per_s);
  std::printf("  pipeline bubble  %10.1f %%\n", 100.0 * r.bubble_fraction);
  std::printf("  exposed comm     %10.3f s   (critical stage pp%d)\n", r.exposed_comm_s, r.critical_stage);
  std::printf("  grad reduction   %10s   (%s)\n", o.comm.grad_reduce_in_bf16 ? "bf16" : "fp32",
              o.comm.grad_reduce_in_bf16
                  ? "--grad-reduce-in-bf16: bf16 grad buffers, 2 B per gradient"
                  : "fp32 main-grad buffers, 4 B per gradient; --grad-reduce-in-bf16 halves it");
  std::printf("  tp comm overlap  %10s\n", o.comm.tp_comm_overlap ? "on" : "off");
  std::printf("  ranks replayed   %10d   (%s, %s level)\n", r.simulated_ranks,
              o.all_ranks ? "all ranks" : "one per pipeline stage",
              options.granularity == planner::SimulationGranularity::kKernel ? "kernel" : "pass");
  std::printf(
      "  ops priced       measured %lld, interpolated %lld, fitted %lld, transferred %lld, analytic %lld\n",
      static_cast<long long>(r.provenance_counts[0]), static_cast<long long>(r.provenance_counts[1]),
      static_cast<long long>(r.provenance_counts[2]), static_cast<long long>(r.provenance_counts[3]),
      static_cast<long long>(r.provenance_counts[4]));
  std::printf("\n  %-4s %-6s %11s %11s %11s %11s %11s\n", "pp", "rank", "finish (s)", "compute", "exp. comm",
              "waiting", "async comm");
  for (const planner::StageReport& s : r.stages) {
    std::printf("  %-4d %-6d %11.3f %11.3f %11.3f %11.3f %11.3f\n", s.pp_rank, s.rank, s.finish_s,
                s.compute_s, s.exposed_comm_s, s.pipeline_wait_s, s.async_comm_s);
  }
  std::printf("\ntime per op kind on pp rank %d (one iteration):\n%s", r.critical_stage,
              r.kind_table().c_str());
  planner::MemoryOptions memory_options;
  memory_options.grad_reduce_in_bf16 = o.comm.grad_reduce_in_bf16;
  memory_options.step = options.step;
  const planner::MemoryEstimate memory = peak_memory_function(o.memory_model)(model, config, memory_options);
  std::printf("\nmemory model: %s\n%s  capacity %26s\n", planner::memory_model_name(o.memory_model),
              memory.itemize().c_str(),
              planner::format_bytes(static_cast<double>(pricer.memory_capacity_bytes())).c_str());
  if (memory.total_bytes > pricer.memory_capacity_bytes()) {
    std::printf(
        "warning: the predicted peak memory exceeds the GPU's capacity: this layout would run out of "
        "memory\n");
  }

  if (!o.trace.empty()) {
    OutputFile out(o.trace, "--trace");
    planner::write_chrome_trace(out.stream(), r.trace_processes, r.trace_events);
    out.commit();
    std::printf("\nwrote %s (%zu events, %zu ranks): open it in https://ui.perfetto.dev\n", o.trace.c_str(),
                r.trace_events.size(), r.trace_processes.size());
  }
  return 0;
}

const Registrar kSimulateCommand{Command{
    "simulate",
    "Predict one iteration of a layout: step time, MFU, bubble, exposed comm, memory, Perfetto trace", 31,
    [](CLI::App& sub) -> std::function<int()> {
      auto o = std::make_shared<SimulateCommandOptions>();
      add_model_flags(sub, o->args);
      add_parallel_flags(sub, o->args);
      add_batch_flags(sub, o->args);
      sub.add_option("--cluster", o->cluster, "NODESxGPUSxTYPE (e.g. 2x8xH100) or a cluster JSON file")
          ->capture_default_str()
          ->group("Simulator");
      sub.add_option("--db", o->db,
                     "Cost database (default: the default database if it exists, else the embedded catalog)")
          ->group("Simulator");
      sub.add_flag("--no-calibration", o->no_calibration,
                   "Price without the corrections fitted from traced runs (megatune db calibrate)")
          ->group("Simulator");
      sub.add_option("--trace", o->trace, "Write a Chrome-trace/Perfetto JSON timeline here")
          ->group("Simulator");
      sub.add_flag("--all-ranks", o->all_ranks,
                   "Replay every rank (default: one representative per pipeline stage)")
          ->group("Simulator");
      add_comm_pricing_flags(sub, o->comm, "Simulator");
      add_memory_model_flag(sub, o->memory_model, "Simulator");
      add_fp8_flags(sub, o->fp8);
      sub.add_option("--granularity", o->granularity,
                     "pass or kernel (default: kernel with --trace, else pass)")
          ->check(CLI::IsMember({"pass", "kernel"}))
          ->group("Simulator");
      sub.footer(
          "Example:\n  megatune simulate --model llama3-8b --cluster 1x8xH100 --tp 2 --pp 2 --gbs 64 "
          "--sequence-parallel --trace t.json");
      return [o]() { return run_simulate(*o); };
    }}};

}  // namespace
}  // namespace megatune::tools
