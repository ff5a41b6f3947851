// `megatune profile`: microbenchmark sweeps of the executor's kernels and of NCCL collectives on this host's
// GPUs into the cost database (CUPTI-timed, resumable, one worker process per GPU), then a fit of the
// planner's cost models. `--dry-run` shows what would be measured, on any machine.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/fitting.h"
#include "cost_models/hardware_catalog.h"
#include "cost_models/record_store.h"
#include "layouts/model_spec.h"
#include "profiler/profile_session.h"
#include "profiler/sweep_builder.h"
#include "tools/command_registry.h"
#include "tools/fp8_flags.h"
#include "tools/input_checks.h"
#include "tools/progress_bar.h"
#ifdef MEGATUNE_HAVE_CUDA
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "layouts/parallel_config.h"
#include "profiler/cuda/gpu_profile_workers.h"
#include "profiler/cuda/traced_training.h"
#endif

namespace megatune::tools {
namespace {

using namespace megatune::profiler;

struct ProfileOptions {
  std::string model;
  std::string database_path;
  int gpus = 0;  // 0: every visible GPU
  bool quick = false;
  bool dry_run = false;
  bool no_grid = false;
  bool no_collectives = false;
  bool no_kernels = false;
  bool no_fit = false;
  std::string gpu_name = "H200 SXM";  // --dry-run without a GPU
  SweepCandidates candidates;
  int warmup = 3;
  int repeats = 10;
  // --trace
  bool trace = false;
  int train_iters = 3;
  int num_microbatches = 1;
};

// The FP8 part of a model sweep: the linears' FP8 GEMMs and their casts.
void print_fp8_counts(const layouts::Fp8Settings& fp8, const Sweep& sweep) {
  std::size_t gemms = 0, casts = 0;
  for (const GemmItem& item : sweep.gemms) gemms += item.dtype == layouts::DType::kFP8;
  for (const MemoryBoundItem& item : sweep.memory_bound) casts += item.is_fp8_cast();
  std::printf("%s: %zu FP8 GEMMs and %zu FP8 casts of the FP8 step programs\n",
              layouts::describe(fp8).c_str(), gemms, casts);
}

Sweep build_sweep(const ProfileOptions& options, int gpus) {
  Sweep sweep;
  if (!options.no_kernels) {
    if (!options.model.empty()) {
      ModelSweepReport report;
      sweep = model_sweep(layouts::model_preset(options.model), options.candidates, &report);
      std::printf("model %s: %d candidate layouts expanded (%d not valid for the model)%s\n",
                  options.model.c_str(), report.layouts_expanded, report.layouts_invalid,
                  report.cross_attention_skipped > 0
                      ? "; context-parallel attention chunks priced from the grid"
                      : "");
      if (options.candidates.fp8.enabled()) print_fp8_counts(options.candidates.fp8, sweep);
    }
    if (!options.no_grid) merge_sweep(sweep, generic_kernel_grid(options.quick));
  }
  if (!options.no_collectives) {
    for (const CollectiveItem& item : collective_sweep(gpus, options.quick))
      sweep.collectives.push_back(item);
  }
  return sweep;
}

void print_counts(const char* title, const Sweep& sweep) {
  std::printf("%-9s %6zu GEMMs  %5zu attention  %5zu memory-bound  %5zu collectives\n", title,
              sweep.gemms.size(), sweep.attention.size(), sweep.memory_bound.size(),
              sweep.collectives.size());
}

// A few headline figures from what the database now holds for `identity`.
void print_headlines(cost_models::Database& database, const DeviceIdentity& identity) {
  for (const auto& row : cost_models::load_kernel_timings(database, identity.gpu)) {
    if (row.versions == identity.versions && row.op_kind == "gemm" && row.m == 8192 && row.n == 8192 &&
        row.k == 8192) {
      std::printf("gemm 8192^3 bf16: %.3f ms  %.0f TFLOP/s (median of %d, CUPTI)\n", row.median_s * 1e3,
                  2.0 * 8192.0 * 8192.0 * 8192.0 / row.median_s / 1e12, row.repeats);
    }
  }
  for (const auto& row : cost_models::load_collective_timings(database, identity.gpu)) {
    if (row.versions != identity.versions || row.bytes != (std::int64_t(1) << 30)) continue;
    const CollectiveItem item{cost_models::parse_collective_op(row.op), row.group_size, row.bytes};
    const CollectiveBandwidth bw = collective_bandwidth(item, row.median_s);
    std::printf("%-14s n=%d 1 GiB: %.3f ms  algbw %.0f GB/s  busbw %.0f GB/s\n", row.op.c_str(),
                row.group_size, row.median_s * 1e3, bw.algbw_bytes_per_s / 1e9, bw.busbw_bytes_per_s / 1e9);
  }
}

#ifdef MEGATUNE_HAVE_CUDA
// --trace: a short training run on GPU 0 stored as a run with per-op predicted and measured times.
int run_trace(const ProfileOptions& options, const std::string& path, const DeviceIdentity& identity) {
  if (options.model.empty()) throw UserError("--trace needs --model PRESET (e.g. --model gpt-125m)");
  const layouts::ModelSpec model = layouts::model_preset(options.model);
  layouts::ParallelConfig config;
  config.micro_batch_size =
      options.candidates.micro_batch.empty() ? 1 : options.candidates.micro_batch.front();
  config.global_batch_size = config.micro_batch_size * options.num_microbatches;
  cost_models::Database database = cost_models::open_cost_database(path);
  if (database.query_int64("SELECT count(*) FROM gpu_models") == 0)
    cost_models::HardwareCatalog::embedded().install_into(database);
  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("1x1x" + identity.gpu);
  const cost_models::CostModel prices(database, cluster);
  const cuda::TracedTrainingResult result =
      cuda::trace_training(model, config, options.train_iters, prices, database, identity);
  std::printf(
      "traced %s: %d iterations, %d ops per iteration (%d joined to the step program, %d loosely, %d not)\n",
      options.model.c_str(), result.iterations, result.ops_per_iteration,
      static_cast<int>(result.joined.ops.size()), result.joined.matched_loosely, result.joined.unmatched);
  std::printf(
      "iteration %.2f ms; CUPTI per-op busy time sum %.2f ms (joined ops %.2f ms); all CUPTI kernels %.2f "
      "ms; "
      "outside op ranges %.2f ms; predicted %.2f ms\n",
      result.iteration_s * 1e3, result.attributed_s * 1e3, result.joined.measured_total_s * 1e3,
      result.cupti_kernel_s * 1e3, result.unattributed_s * 1e3, result.joined.predicted_total_s * 1e3);
  if (result.ops_without_activity > 0)
    std::printf("%d ops launched no device work CUPTI saw (stored as 0 ms)\n", result.ops_without_activity);
  std::printf("longest ops (CUPTI):\n");
  for (const MeasuredOp& op : result.slowest_ops)
    std::printf("  %8.3f ms  %s\n", op.measured_s * 1e3, layouts::to_string(op.op).c_str());
  std::printf("MFU measured %.1f%%, predicted %.1f%%; stored as run %lld in %s\n", result.measured_mfu * 100,
              result.predicted_mfu * 100, static_cast<long long>(result.run_id), path.c_str());
  return 0;
}
#endif

int run_profile(const ProfileOptions& options) {
  const std::string path =
      options.database_path.empty() ? cost_models::default_cost_database_path() : options.database_path;
  if (options.warmup < 0 || options.repeats < 1)
    throw UserError("--warmup must be >= 0 and --repeats >= 1 (e.g. --warmup 3 --repeats 10)");
  if (options.candidates.fp8.enabled() && (options.model.empty() || options.trace || options.no_kernels))
    throw UserError(
        "--fp8-format measures the FP8 GEMMs and casts of a model's step programs: give --model PRESET, "
        "without --trace or --no-kernels");

  DeviceIdentity identity;
  int visible_gpus = 0;
#ifdef MEGATUNE_HAVE_CUDA
  if (!options.dry_run) {
    try {
      const cuda::HostGpus host = cuda::probe_host_gpus();
      identity = host.identity;
      visible_gpus = host.count;
    } catch (const std::exception& error) {
      throw UserError(std::string(error.what()) +
                      "; run it on a machine with an NVIDIA GPU, or pass --dry-run to see the sweep");
    }
  }
#endif
  if (options.dry_run) {
    identity.gpu = cost_models::HardwareCatalog::embedded().gpu(options.gpu_name).name;
    visible_gpus = options.gpus > 0 ? options.gpus : 1;
  } else if (visible_gpus == 0) {
    throw UserError(
        "this megatune was built without CUDA; rebuild with nvcc, CUPTI and NCCL present "
        "(-DMEGATUNE_CUDA=ON), or pass --dry-run to see the sweep");
  }
#ifdef MEGATUNE_HAVE_CUDA
  if (options.trace && !options.dry_run) return run_trace(options, path, identity);
#endif
  if (options.gpus > visible_gpus)
    throw UserError("--gpus " + std::to_string(options.gpus) + ": only " + std::to_string(visible_gpus) +
                    " GPU(s) are visible; pass --gpus " + std::to_string(visible_gpus) + " or fewer");
  const int gpus = options.gpus > 0 ? options.gpus : visible_gpus;

  const Sweep sweep = build_sweep(options, gpus);
  Sweep pending;
  {
    // A dry run writes nothing: it reads the database when there is one (read-only) and otherwise counts
    // against an empty one in memory, so no database is created where none was.
    std::error_code missing;
    const bool exists = std::filesystem::exists(path, missing);
    cost_models::CostDatabaseOpenOptions open_options;
    open_options.read_only = options.dry_run && exists;
    cost_models::Database database =
        cost_models::open_cost_database(options.dry_run && !exists ? ":memory:" : path, open_options);
    if (!database.read_only() && database.query_int64("SELECT count(*) FROM gpu_models") == 0)
      cost_models::HardwareCatalog::embedded().install_into(database);
    pending = pending_items(database, sweep, identity);
  }
  std::printf("database %s\n", path.c_str());
  std::printf("device   %s x%d  driver %s  CUDA %s  cuBLAS %s  NCCL %s  commit %s\n", identity.gpu.c_str(),
              gpus, identity.versions.driver.c_str(), identity.versions.cuda.c_str(),
              identity.versions.cublas.c_str(), identity.versions.nccl.c_str(),
              identity.versions.commit.c_str());
  print_counts("sweep", sweep);
  print_counts("to do", pending);
  if (options.dry_run) {
    std::printf("dry run: nothing measured\n");
    return 0;
  }
  if (pending.size() == 0) std::printf("everything is already measured for this GPU and software\n");

#ifdef MEGATUNE_HAVE_CUDA
  if (pending.size() > 0) {
    cuda::GpuProfileJob job;
    job.database_path = path;
    job.sweep = pending;
    job.gpus = gpus;
    job.kernel_policy = {options.warmup, options.repeats};
    job.collective_policy = {std::max(options.warmup, 5), std::max(options.repeats, 20)};
    ProgressBar bar(std::cerr, "profile", pending.size(), isatty(fileno(stderr)) != 0);
    const cuda::GpuProfileOutcome outcome =
        cuda::run_gpu_profile(job, [&](const ProfileProgress& p) { bar.update(p.done, p.current); });
    bar.finish();
    std::printf("measured %d kernels (%d without an executor kernel) and %d collectives in %.1f s\n",
                outcome.kernels.measured, outcome.kernels.unsupported, outcome.collectives.measured,
                outcome.wall_s);
    for (const std::string& error : outcome.errors) std::fprintf(stderr, "error: %s\n", error.c_str());
    if (!outcome.errors.empty()) {
      std::fprintf(stderr, "what was measured is kept; run the same command again to resume\n");
      return 1;
    }
  }
#endif
  cost_models::Database database = cost_models::open_cost_database(path);
  print_headlines(database, identity);
  if (!options.no_fit) {
    const auto fitted = cost_models::fit_and_store(database, identity.gpu);
    std::printf("fitted %zu cost models for %s (megatune db info --db %s)\n", fitted.size(),
                identity.gpu.c_str(), path.c_str());
  }
  return 0;
}

const Registrar kProfileCommand{Command{
    "profile",
    "Measure the executor's kernels and NCCL collectives on this host's GPUs into the cost database", 70,
    [](CLI::App& sub) -> std::function<int()> {
      auto options = std::make_shared<ProfileOptions>();
      sub.add_option(
          "--model", options->model,
          "Also measure the shapes this model preset issues under the candidate layouts (e.g. llama3-1b)");
      sub.add_option("--gpus", options->gpus, "GPUs to use, one worker process each (default: all visible)")
          ->check(integer_at_least(1));
      sub.add_option("--db", options->database_path,
                     "Cost database (default: $MEGATUNE_DB or ~/.cache/megatune/costs.db)");
      sub.add_flag("--quick", options->quick, "Coarser grids: just enough points for every fit");
      sub.add_flag("--dry-run", options->dry_run,
                   "Print the sweep and what the database still lacks; measure nothing");
      sub.add_option("--gpu", options->gpu_name, "GPU assumed by --dry-run (default: H200 SXM)");
      sub.add_flag("--no-grid", options->no_grid, "Skip the generic fitting grid (model shapes only)");
      sub.add_flag("--no-collectives", options->no_collectives, "Skip the NCCL collectives");
      sub.add_flag("--no-kernels", options->no_kernels, "Skip GEMMs, attention and memory-bound kernels");
      sub.add_flag("--no-fit", options->no_fit, "Do not fit cost models afterwards (see `megatune db fit`)");
      sub.add_option("--tp", options->candidates.tensor_parallel, "Candidate tensor-parallel sizes")
          ->delimiter(',')
          ->check(integer_at_least(1))
          ->capture_default_str();
      sub.add_option("--cp", options->candidates.context_parallel, "Candidate context-parallel sizes")
          ->delimiter(',')
          ->check(integer_at_least(1))
          ->capture_default_str();
      sub.add_option("--ep", options->candidates.expert_parallel,
                     "Candidate expert-parallel sizes (MoE models)")
          ->delimiter(',')
          ->check(integer_at_least(1))
          ->capture_default_str();
      sub.add_option("--mbs", options->candidates.micro_batch, "Candidate micro-batch sizes")
          ->delimiter(',')
          ->check(integer_at_least(1))
          ->capture_default_str();
      sub.add_option("--warmup", options->warmup, "Untimed runs before timing each item")
          ->capture_default_str()
          ->check(integer_at_least(0));
      sub.add_option("--repeats", options->repeats, "Timed runs per item (the median is stored)")
          ->capture_default_str()
          ->check(integer_at_least(1));
      sub.add_flag(
          "--trace", options->trace,
          "Instead of sweeps: train --model for --train-iters steps on GPU 0 (mock data) and store the last "
          "iteration's per-op device times, joined to the step program, as a run");
      sub.add_option("--train-iters", options->train_iters, "--trace: iterations (the first ones warm up)")
          ->capture_default_str()
          ->check(integer_at_least(1));
      sub.add_option("--num-microbatches", options->num_microbatches, "--trace: micro-batches per iteration")
          ->capture_default_str()
          ->check(integer_at_least(1));
      add_fp8_flags(sub, options->candidates.fp8);
      return [options] { return run_profile(*options); };
    }}};

}  // namespace
}  // namespace megatune::tools
