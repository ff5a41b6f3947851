// `megatune train`: trains a model with Megatron's flags on the CUDA or the CPU backend, printing Megatron's
// log lines, saving and resuming checkpoints.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "base/output_file.h"
#include "base/user_error.h"
#include "cost_models/hardware_catalog.h"
#include "executor/backend/sizing_backend.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/launch_environment.h"
#include "executor/parallel/local_launcher.h"
#include "executor/training/arena_sizing.h"
#include "executor/training/hf_conversion.h"
#include "executor/training/run_setup.h"
#include "executor/training/thread_run.h"
#include "executor/training/training_run.h"
#include "layouts/flops.h"
#include "layouts/fp8.h"
#include "layouts/rank_grid.h"
#include "planner/plan_report.h"
#include "tools/command_registry.h"
#include "tools/fp8_flags.h"
#include "tools/input_checks.h"
#include "tools/megatron_args.h"
#include "tools/megatron_compat_flags.h"
#include "tools/tokenizer_flags.h"
#include "tools/train_memory_check.h"
#include "tools/train_option_checks.h"
#ifdef MEGATUNE_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/flash_attention.h"
#include "executor/cuda/nccl_communicator.h"
#endif

namespace megatune::tools {
namespace {

using namespace megatune::executor;

struct TrainArgs {
  MegatronArgs megatron;
  TrainOptions options;
  std::string device;
  std::string ops_out;
  int nproc = 0;                             // --nproc: ranks on this host (0: the layout's world size)
  std::string trace_iterations;              // --trace-iterations START:COUNT
  bool dry_run = false;                      // --dry-run: print the arena, train nothing
  bool ranks_on_one_gpu = false;             // --ranks-on-one-gpu: every rank a thread on GPU 0
  executor::data::TokenizerFiles tokenizer;  // --tokenizer-type and its files (default: the byte tokenizer)
  std::vector<std::string> adopted_model_flags;  // the --load checkpoint's model flags, when none were given
  MegatronCompatFlags compat;                    // Megatron flags without an option of train's own
  const CLI::App* app = nullptr;
};

// Megatron takes the vocabulary size (before padding) and the end-of-document id from the tokenizer flags.
void apply_tokenizer(TrainArgs& a) {
  if (a.tokenizer.type == "byte") return;
  if (a.tokenizer.type == "NullTokenizer") {  // Megatron's _NullTokenizer(vocab_size): EOD is vocab_size
    if (!a.megatron.vocab_size)
      throw UserError("--tokenizer-type NullTokenizer needs --vocab-size N (token ids below N; EOD is N)");
    // A vocabulary adopted from the --load checkpoint already counts the EOD.
    if (a.app->count("--vocab-size") > 0) *a.megatron.vocab_size += 1;
    a.options.eod_token = *a.megatron.vocab_size - 1;
    return;
  }
  const auto tokenizer = executor::data::make_tokenizer(a.tokenizer);
  const std::int64_t vocab = tokenizer->vocab_size();
  if (a.megatron.vocab_size && *a.megatron.vocab_size < vocab)
    throw UserError("--vocab-size " + std::to_string(*a.megatron.vocab_size) + " is smaller than the " +
                    a.tokenizer.type + " vocabulary (" + std::to_string(vocab) +
                    " ids): drop --vocab-size (it comes from the tokenizer, as in Megatron) or raise it");
  if (!a.megatron.vocab_size) a.megatron.vocab_size = static_cast<int>(vocab);
  a.options.eod_token = tokenizer->eod_id();
}

// `train --load DIR` with no model flags: the model the checkpoint records (its model_args), so a resumed
// or converted checkpoint needs none; --seq-length, --rotary-base and --norm-epsilon given here still win.
void adopt_checkpoint_model(TrainArgs& a) {
  if (a.options.load.empty() || !given_model_flags(*a.app, {"--seq-length"}).empty()) return;
  if (!std::filesystem::exists(std::filesystem::path(a.options.load) / "latest_checkpointed_iteration.txt"))
    return;
  const std::vector<std::string> flags = checkpoint_model_args(a.options.load);
  if (flags.empty()) return;  // a save from before model_args: the model flags are needed, as before
  const std::optional<int> seq_length = a.megatron.seq_length;
  layouts::ModelNumerics numerics{a.options.rotary_base, a.options.norm_epsilon};
  parse_recorded_model_flags(flags, a.megatron, numerics, "--load " + a.options.load);
  for (std::size_t i = 0; i < flags.size(); ++i) {  // those given here stay the user's (value after name)
    const bool valued = i + 1 < flags.size() && flags[i + 1].rfind("--", 0) != 0;
    if (a.app->count(flags[i]) == 0) {
      a.adopted_model_flags.push_back(flags[i]);
      if (valued) a.adopted_model_flags.push_back(flags[i + 1]);
    }
    if (valued) ++i;
  }
  if (seq_length) a.megatron.seq_length = seq_length;
  if (a.app->count("--rotary-base") == 0) a.options.rotary_base = numerics.rotary_base;
  if (a.app->count("--norm-epsilon") == 0) a.options.norm_epsilon = numerics.norm_epsilon;
}

#ifdef MEGATUNE_HAVE_CUDA
// The GPU's dense bf16 peak, 0 for a GPU the catalog does not know (no MFU column then).
double peak_tflops_of(const CudaBackend& backend) {
  return cost_models::device_peak_bf16_tflops(backend.device_name());
}
#endif

// The flags given on the command line, as typed (for the trace manifest: compare re-parses them).
std::vector<std::string> given_arguments(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* option : app.get_options()) {
    const std::vector<std::string>& names = option->get_lnames();
    if (option->count() == 0 || names.empty() || names.front() == "help") continue;
    out.push_back("--" + names.front());
    if (option->get_items_expected_max() != 0)  // not a flag
      for (const std::string& value : option->results()) out.push_back(value);
  }
  return out;
}

// DIR/run.json of a traced run, once every rank's file is written.
void write_trace_manifest(const TrainArgs& a, const layouts::ModelSpec& spec,
                          const layouts::ParallelConfig& parallel, const std::string& backend,
                          const std::string& gpu, double peak_tflops) {
  RunManifest m;
  m.model_args = given_arguments(*a.app);
  // A model taken from the --load checkpoint: its flags, so that compare rebuilds the same model.
  m.model_args.insert(m.model_args.end(), a.adopted_model_flags.begin(), a.adopted_model_flags.end());
  m.command = {"megatune", "train"};
  m.command.insert(m.command.end(), m.model_args.begin(), m.model_args.end());
  // The vocabulary a tokenizer flag chose is part of the model that compare rebuilds from these flags.
  if (a.megatron.vocab_size && a.app->count("--vocab-size") == 0 && a.adopted_model_flags.empty())
    m.model_args.insert(m.model_args.end(), {"--vocab-size", std::to_string(*a.megatron.vocab_size)});
  m.model = spec.name;
  m.parameters = layouts::ModelSpec(spec).total_parameters();
  m.layout = describe_layout(spec, parallel);
  m.world_size = parallel.world_size;
  m.micro_batch_size = parallel.micro_batch_size;
  m.global_batch_size = parallel.resolved_global_batch_size();
  m.num_microbatches = parallel.num_microbatches();
  m.seq_length = spec.seq_length;
  m.model_flops_per_iteration = layouts::model_flops_per_iteration(spec, m.global_batch_size, 1);
  m.device = a.device;
  m.backend = backend;
  m.gpu = gpu;
  m.peak_tflops = peak_tflops;
  const int world = parallel.world_size;
  const std::string gpus = world <= 8 ? "1x" + std::to_string(world) : std::to_string((world + 7) / 8) + "x8";
  if (a.device == "cuda") {
    m.cluster = gpus + "x" + (gpu.rfind("NVIDIA ", 0) == 0 ? gpu.substr(7) : gpu);
    m.timing = "CUDA events around each op on the compute stream (synchronized per iteration)";
  } else {
    m.cluster = gpus + "xH200";
    m.timing = "host steady_clock around each op (the CPU backend runs ops synchronously per rank thread)";
  }
  m.trace = a.options.trace;
  resolve_trace_window(m.trace, a.options.train_iters);
  write_run_manifest(m);
  std::cout << "trace: wrote " << m.trace.dir << "/run.json and " << world << " rank file"
            << (world == 1 ? "" : "s") << " (iterations " << m.trace.first_iteration << ".."
            << m.trace.first_iteration + m.trace.iterations - 1 << "); compare with: megatune compare --run "
            << m.trace.dir << std::endl;
}

std::unique_ptr<Backend> make_backend(const std::string& device, bool bf16, double* peak_tflops) {
  if (device == "cpu") {
    *peak_tflops = 0.0;
    return std::make_unique<CpuBackend>(/*emulate_bf16=*/bf16);
  }
#ifdef MEGATUNE_HAVE_CUDA
  auto backend = std::make_unique<CudaBackend>(read_launch_environment().local_rank);  // this rank's GPU
  *peak_tflops = peak_tflops_of(*backend);
  return backend;
#else
  throw UserError("--device cuda: this megatune was built without CUDA; use --device cpu");
#endif
}

std::string gpu_name(Backend& backend) {
#ifdef MEGATUNE_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaBackend*>(&backend)) return cuda->device_name();
#endif
  (void)backend;
  return "";
}

std::string default_device() {
#ifdef MEGATUNE_HAVE_CUDA
  return CudaBackend::device_count() > 0 ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

// A backend that only counts, in the storage sizes of `device`'s backend.
std::unique_ptr<Backend> make_sizing_backend(const std::string& device, bool bf16) {
  if (device != "cuda") return std::make_unique<CpuBackend>(bf16);
#ifdef MEGATUNE_HAVE_CUDA
  return std::make_unique<SizingBackend>(nullptr, cuda::flash_attention_unsupported,
                                         CudaBackend::norm_width_unsupported);
#else
  return std::make_unique<SizingBackend>();
#endif
}

// Refuses, before anything is allocated on GPU `device`, a layout whose arena does not fit its free memory.
// MEGATUNE_TEST_FREE_DEVICE_MEMORY_BYTES (for tests, undocumented) stands in for the GPU's free memory.
void require_fits_on_gpu(const TrainArgs& a, const layouts::ModelSpec& spec,
                         const layouts::ParallelConfig& parallel, int device) {
  DeviceMemory memory;
  if (const char* injected = std::getenv("MEGATUNE_TEST_FREE_DEVICE_MEMORY_BYTES")) {
    memory.free_bytes = std::strtoll(injected, nullptr, 10);
  } else {
#ifdef MEGATUNE_HAVE_CUDA
    const CudaBackend::MemoryInfo info = CudaBackend::memory_info(device);
    memory = {info.free_bytes, info.total_bytes};
#else
    (void)device;
    return;  // no GPU to check against: make_backend names the missing CUDA
#endif
  }
  TrainOptions options = a.options;
  options.trace.dir.clear();
  options.bf16 = true;
  require_arena_fits(spec, parallel, options, memory, [] { return make_sizing_backend("cuda", true); });
}

// --dry-run: each pipeline stage's arena as the chosen backend lays it out; needs no GPU and no data.
int dry_run(const TrainArgs& a, const layouts::ModelSpec& spec, const layouts::ParallelConfig& parallel) {
  TrainOptions options = a.options;
  options.trace.dir.clear();
  options.bf16 = options.bf16 || a.device == "cuda";
  std::cout << "megatune train --dry-run: " << spec.name << ", layout " << describe_layout(spec, parallel)
            << ", "
            << (a.device == "cuda" ? "the CUDA backend's arena (SizingBackend; kernel scratch and the GEMM / "
                                     "grad-norm workspaces not included)"
                                   : "the CPU backend's arena (4 bytes per element)")
            << "; nothing is allocated or trained" << std::endl;
  std::cout << "model: " << planner::describe_model(spec)
            << "\nsettings: " << planner::describe_run_settings(spec, parallel) << std::endl;
  if (options.fp8.enabled()) std::cout << "precision: " << layouts::describe(options.fp8) << std::endl;
  if (options.rampup_batch_size)
    std::cout << batch_size_calculator(spec, parallel, options).describe() << "; " << options.train_iters
              << " iterations for --train-samples " << options.train_samples.value_or(0)
              << "; the arena holds the final batch's micro-batches" << std::endl;
  for (int rank : one_rank_per_stage(parallel)) {
    const std::unique_ptr<Backend> sizing = make_sizing_backend(a.device, options.bf16);
    const RankArena arena = size_rank_arena(spec, parallel, options, rank, *sizing);
    const layouts::DenseCoordinates& c = arena.coordinates;
    std::cout << "rank " << rank << " (pp" << c.pp << " tp" << c.tp << " dp" << c.dp << " cp" << c.cp
              << "; its tp / dp / cp peers hold the same):\n"
              << format_arena_breakdown(arena.breakdown) << format_sizing_notes(arena)
              << format_parameter_state_bytes(arena);
  }
  return 0;
}

// One rank of a multi-GPU job under a launcher (torchrun, Slurm, mpirun, or --nproc): the CUDA backend on
// LOCAL_RANK's GPU, NCCL communicators per process group (rendezvous at MASTER_ADDR:MASTER_PORT), the last
// rank logs. A rank's failure aborts the communicators, so every rank ends with the failing rank's line.
int train_nccl_rank(TrainArgs& a, const layouts::ModelSpec& spec, const layouts::ParallelConfig& parallel,
                    const LaunchEnvironment& launch) {
#ifdef MEGATUNE_HAVE_CUDA
  require_fits_on_gpu(a, spec, parallel, launch.local_rank);
  RunConfig run = build_run_config(spec, parallel, a.options, launch.rank);
  auto backend = std::make_unique<CudaBackend>(launch.local_rank);
  run.peak_tflops = peak_tflops_of(*backend);
  RendezvousOptions rendezvous;
  rendezvous.fingerprint = spec.name + " " + describe_layout(spec, parallel);
  rendezvous.timeout_s = a.options.distributed_timeout_s();
  NcclOptions nccl;
  nccl.collective_timeout_s = nccl.setup_timeout_s = a.options.distributed_timeout_s();
  std::unique_ptr<NcclCommunicator> communicator =
      NcclCommunicator::connect(*backend, layouts::RankGrid::from_config(parallel), launch, rendezvous, nccl);
  const bool logs = launch.rank == launch.world_size - 1;
  std::ostringstream quiet;
  std::ostream& log = logs ? std::cout : quiet;
  if (logs)
    std::cout << "megatune train: " << spec.name << ", layout " << describe_layout(spec, parallel) << ", "
              << parallel.world_size << " ranks (NCCL), backend " << backend->name() << std::endl;
  try {
    TrainingRun training(run, *backend, *communicator, log);
    training.run();
    communicator->synchronize();  // every rank's trace file is written by now
    if (launch.rank == 0 && !a.options.trace.dir.empty())
      write_trace_manifest(a, spec, parallel, backend->name(), backend->device_name(), run.peak_tflops);
  } catch (const std::exception& e) {
    communicator->abort("rank " + std::to_string(launch.rank) + ": " + e.what());
    throw;
  }
  return 0;
#else
  (void)a, (void)spec, (void)parallel, (void)launch;
  throw UserError("--device cuda: this megatune was built without CUDA; use --device cpu");
#endif
}

// The flags that must agree with each other and with the layout, checked alike for a real run and for
// --dry-run (which alone may leave out the data: it reads none).
void check_run_flags(TrainArgs& a, const layouts::ParallelConfig& parallel, const LaunchEnvironment& launch) {
  if (a.options.mock_data && !a.options.data_path.empty())
    throw UserError("give only one of --data-path PREFIX and --mock-data");
  if (!a.dry_run && !a.options.mock_data && a.options.data_path.empty())
    throw UserError("give exactly one of --data-path PREFIX and --mock-data");
  if (!a.trace_iterations.empty()) {
    if (a.options.trace.dir.empty()) throw UserError("--trace-iterations needs --trace-dir DIR");
    parse_trace_iterations(a.trace_iterations, a.options.trace);
  }
  if (a.nproc > 0 && a.nproc != parallel.world_size)
    throw UserError("--nproc " + std::to_string(a.nproc) + " does not match --world-size " +
                    std::to_string(parallel.world_size) +
                    "; give one of them (the data-parallel size is "
                    "derived from the world size)");
  if (given(a.compat, "--calculate-per-token-loss") && a.options.eod_mask_loss)
    throw UserError(
        "--calculate-per-token-loss with --eod-mask-loss: megatune averages each micro-batch's loss over its "
        "own counted tokens, which differs from Megatron's per-token loss when masks vary; drop one of them");
  if ((a.options.finetune || a.options.no_load_optim) && a.options.load.empty())
    throw UserError(std::string(a.options.finetune ? "--finetune" : "--no-load-optim") +
                    " needs --load DIR (the checkpoint whose weights the run starts from)");
  if (launch.world_size > 1) check_layout_world_size(launch, parallel.world_size);
  if (a.ranks_on_one_gpu) {
    if (a.device != "cuda")
      throw UserError(
          "--ranks-on-one-gpu runs the layout's ranks on the CUDA kernels: use it with --device cuda");
    if (launch.world_size > 1 || a.nproc > 1)
      throw UserError(
          "--ranks-on-one-gpu runs every rank in this one process: start it once, without a "
          "launcher or --nproc");
  }
}

// --ranks-on-one-gpu: every rank of the layout as a thread of this process on GPU 0, with its own CUDA
// backend; collectives and pipeline transfers are staged through the host (a check of the layout on the
// CUDA kernels with one GPU, not a way to train fast).
int train_ranks_on_one_gpu(const TrainArgs& a, const layouts::ModelSpec& spec,
                           const layouts::ParallelConfig& parallel) {
#ifdef MEGATUNE_HAVE_CUDA
  if (CudaBackend::device_count() == 0) throw UserError("--ranks-on-one-gpu: no CUDA device is visible");
  std::cout << "megatune train: " << spec.name << ", layout " << describe_layout(spec, parallel) << ", "
            << parallel.world_size
            << " ranks as threads on GPU 0 (CUDA kernels; collectives staged through the host)" << std::endl;
  train_on_threads(spec, parallel, a.options, std::cout, {}, false,
                   [](int) { return std::make_unique<CudaBackend>(0); });
  return 0;
#else
  (void)a, (void)spec, (void)parallel;
  throw UserError("--ranks-on-one-gpu: this megatune was built without CUDA; use --device cpu");
#endif
}

int run_train(TrainArgs& a) {
  // Like Megatron, the world size defaults to the launcher's (torchrun, Slurm, mpirun).
  const LaunchEnvironment launch = read_launch_environment();
  order_as_given(a.compat, *a.app);
  check_megatron_compat_flags(a.compat);
  if (!a.megatron.world_size && launch.world_size > 1) a.megatron.world_size = launch.world_size;
  // --nproc is the world size on one host, as torchrun's: the data-parallel size follows from it.
  if (!a.megatron.world_size && a.nproc > 0) a.megatron.world_size = a.nproc;
  adopt_checkpoint_model(a);
  apply_tokenizer(a);
  const layouts::ModelSpec spec = resolve_model(a.megatron);
  layouts::ParallelConfig parallel = resolve_parallel(a.megatron);
  parallel.validate(spec);
  resolve_sample_schedule(a.options, parallel.resolved_global_batch_size(),
                          a.app->count("--train-iters") > 0);
  validate_train_options(a.options);
  const std::string fresh_start = check_load_path(a.options.load);  // refuses a --load that does not exist
  if (!fresh_start.empty() && launch.rank == 0 && a.nproc <= 1) std::cout << fresh_start << std::endl;
  if (a.device.empty()) a.device = default_device();
  if (a.device == "cpu") require_single_process_for_cpu(launch);
  check_run_flags(a, parallel, launch);
  // Named once: by this process when it runs the ranks (or sizes them), by the logging rank under a
  // launcher; not by a process that starts one per GPU (its ranks do).
  const bool relaunches = !a.dry_run && a.device == "cuda" && launch.world_size == 1 && !a.ranks_on_one_gpu &&
                          (a.nproc > 1 || (a.nproc == 0 && parallel.world_size > 1));
  const std::string accepted = accepted_compat_flags_line(a.compat);
  if (!accepted.empty() && !relaunches && launch.rank == launch.world_size - 1)
    std::cout << accepted << std::endl;
  if (a.dry_run) return dry_run(a, spec, parallel);
  a.options.bf16 = a.options.bf16 || a.device == "cuda";  // the CUDA backend computes in bf16
  if (a.ranks_on_one_gpu) return train_ranks_on_one_gpu(a, spec, parallel);
  // A multi-GPU layout started without a launcher (e.g. a plan's megatune.args as written): one process per
  // GPU on this host, as --nproc would.
  if (a.device == "cuda" && parallel.world_size > 1 && launch.world_size == 1 && a.nproc == 0)
    a.nproc = parallel.world_size;
  if (a.nproc > 1 && a.device == "cuda") {  // one process per GPU: this command line again in each
#ifdef MEGATUNE_HAVE_CUDA
    if (CudaBackend::device_count() < a.nproc)
      throw UserError("--nproc " + std::to_string(a.nproc) + ": only " +
                      std::to_string(CudaBackend::device_count()) +
                      " GPUs are visible; use at most that many, or --device cpu");
#endif
    return relaunch_with_nproc(a.nproc, std::cout, std::cerr);
  }
  if (parallel.world_size > 1 && a.device == "cuda") return train_nccl_rank(a, spec, parallel, launch);
  if (parallel.world_size > 1) {
    std::cout << "megatune train: " << spec.name << ", layout " << describe_layout(spec, parallel) << ", "
              << parallel.world_size << " ranks as threads on the CPU backend" << std::endl;
    train_on_threads(spec, parallel, a.options, std::cout);
    if (!a.options.trace.dir.empty())
      write_trace_manifest(a, spec, parallel, a.options.bf16 ? "cpu (bf16 emulated)" : "cpu", "", 0.0);
    return 0;
  }

  if (a.device == "cuda") require_fits_on_gpu(a, spec, parallel, read_launch_environment().local_rank);
  RunConfig run = build_run_config(spec, parallel, a.options, 0);
  run.record_first_iteration = !a.ops_out.empty();
  const TrainerConfig& t = run.trainer;
  std::unique_ptr<Backend> backend = make_backend(a.device, a.options.bf16, &run.peak_tflops);
  SingleRankCommunicator communicator(*backend);
  std::cout << "megatune train: " << spec.name << " (" << t.model.describe() << "), "
            << layouts::ModelSpec(spec).total_parameters() << " parameters, seq " << t.batch.seq
            << ", micro-batch " << t.batch.micro_batch << " x " << t.batch.num_microbatches << ", recompute "
            << layouts::to_string(t.recompute.granularity)
            << (t.recompute.full() ? " (" + std::string(layouts::to_string(t.recompute.method)) + " " +
                                         std::to_string(t.recompute.num_layers) + ")"
                                   : std::string())
            << (t.model.fp8.enabled() ? ", " + layouts::describe(t.model.fp8) : std::string()) << ", backend "
            << backend->name() << std::endl;
  TrainingRun training(run, *backend, communicator, std::cout);
  std::cout << "memory: arena " << backend->arena_capacity_bytes() / (1 << 20) << " MiB" << std::endl;
  training.run();
  if (!a.ops_out.empty()) {
    OutputFile out(a.ops_out, "--ops-out");  // temporary + rename; a failed write (disk full) is an error
    for (const layouts::Op& op : backend->recorder().ops()) out.stream() << layouts::to_string(op) << "\n";
    out.commit();
  }
  if (!a.options.trace.dir.empty())
    write_trace_manifest(a, spec, parallel, backend->name(), gpu_name(*backend), run.peak_tflops);
  return 0;
}

const Registrar kTrainCommand({
    "train",
    "train a model with Megatron's flags and parallel layout (GPU, or the CPU backend with ranks as threads)",
    40,
    [](CLI::App& app) -> std::function<int()> {
      auto args = std::make_shared<TrainArgs>();
      TrainArgs& a = *args;
      add_model_flags(app, a.megatron);
      add_parallel_flags(app, a.megatron);
      add_batch_flags(app, a.megatron);
      app.add_option("--lr", a.options.lr,
                     "peak learning rate (Megatron requires it; megatune default 1e-4)");
      app.add_option("--min-lr", a.options.min_lr, "learning rate floor of the decay");
      app.add_option("--lr-warmup-init", a.options.lr_warmup_init, "learning rate at the start of warm-up");
      app.add_option("--decoupled-lr", a.options.decoupled_lr,
                     "peak learning rate of the word embeddings and the output layer (same schedule)");
      app.add_option(
          "--decoupled-min-lr", a.options.decoupled_min_lr,
          "their floor (default --min-lr; without --decoupled-lr it changes nothing, as in Megatron)");
      app.add_option("--lr-decay-style", a.options.lr_decay_style,
                     "constant | linear | cosine | inverse-square-root | WSD")
          ->check(CLI::IsMember({"constant", "linear", "cosine", "inverse-square-root", "WSD", "wsd"}));
      app.add_option("--lr-warmup-iters", a.options.lr_warmup_iters, "warm-up iterations");
      app.add_option("--lr-warmup-fraction", a.options.lr_warmup_fraction,
                     "warm-up as a fraction of the decay");
      app.add_option("--lr-decay-iters", a.options.lr_decay_iters,
                     "iterations of the decay (default --train-iters)");
      app.add_option("--lr-wsd-decay-iters", a.options.lr_wsd_decay_iters,
                     "WSD: iterations of the final anneal");
      app.add_option("--lr-wsd-decay-style", a.options.lr_wsd_decay_style,
                     "WSD anneal: exponential | linear | cosine | minus_sqrt")
          ->check(CLI::IsMember({"exponential", "linear", "cosine", "minus_sqrt"}));
      app.add_option("--weight-decay", a.options.weight_decay,
                     "AdamW decoupled weight decay (not on 1-D params)");
      app.add_option("--clip-grad", a.options.clip_grad, "global gradient-norm clip (0: off)");
      app.add_option("--adam-beta1", a.options.adam_beta1, "AdamW beta1");
      app.add_option("--adam-beta2", a.options.adam_beta2, "AdamW beta2");
      app.add_option("--adam-eps", a.options.adam_eps, "AdamW epsilon");
      app.add_option("--init-method-std", a.options.init_method_std, "std of the normal initialization");
      app.add_option("--norm-epsilon", a.options.norm_epsilon, "LayerNorm / RMSNorm epsilon");
      app.add_option("--rotary-base", a.options.rotary_base, "RoPE theta (10000; Llama 3: 500000)");
      app.add_option("--moe-router-score-function", a.options.moe_router_score_function,
                     "MoE router scores: softmax | sigmoid");
      app.add_flag("--moe-router-pre-softmax", a.options.moe_router_pre_softmax,
                   "MoE: softmax over all experts before the top-k");
      app.add_option("--moe-router-load-balancing-type", a.options.moe_router_load_balancing_type,
                     "MoE load-balancing loss: aux_loss | seq_aux_loss | none");
      app.add_option("--moe-aux-loss-coeff", a.options.moe_aux_loss_coeff,
                     "MoE load-balancing loss coefficient (default 0)");
      app.add_flag("--moe-router-enable-expert-bias", a.options.moe_router_enable_expert_bias,
                   "MoE: DeepSeek-V3's aux-loss-free balancing bias (sigmoid routing)");
      app.add_option("--moe-router-bias-update-rate", a.options.moe_router_bias_update_rate,
                     "MoE: the expert bias's step per iteration (default 1e-3)");
      app.add_option("--moe-router-topk-scaling-factor", a.options.moe_router_topk_scaling_factor,
                     "MoE: the chosen experts' probabilities times this (DeepSeek-V3: 2.5; default none)")
          ->check(CLI::NonNegativeNumber);
      app.add_option(
             "--moe-router-num-groups", a.options.moe_router_num_groups,
             "MoE: expert groups for group-limited routing (DeepSeek-V3: 8, with --moe-router-group-topk)")
          ->check(integer_at_least(1));
      app.add_option("--moe-router-group-topk", a.options.moe_router_group_topk,
                     "MoE: groups each token's experts come from (DeepSeek-V3: 4)")
          ->check(integer_at_least(1));
      app.add_option("--moe-z-loss-coeff", a.options.moe_z_loss_coeff,
                     "MoE: router z-loss coefficient (ST-MoE's; default none)")
          ->check(CLI::NonNegativeNumber);
      app.add_option("--mtp-loss-scaling-factor", a.options.mtp_loss_scaling_factor,
                     "Multi-token prediction: the MTP losses' weight, averaged over the MTP layers (0.1)");
      add_fp8_flags(app, a.options.fp8);
      app.add_option("--moe-expert-capacity-factor", a.options.moe_expert_capacity_factor,
                     "MoE expert capacity factor: tokens over capacity are dropped (default: dropless)");
      app.add_flag("--moe-pad-expert-input-to-capacity", a.options.moe_pad_expert_input_to_capacity,
                   "MoE: pad every expert's input to its capacity (needs --moe-expert-capacity-factor)");
      app.add_option("--train-iters", a.options.train_iters, "iterations to train (default 100)");
      const auto samples = [&](const char* name, std::optional<std::int64_t>& target, const char* help) {
        app.add_option_function<std::int64_t>(
               name, [&target](const std::int64_t& v) { target = v; }, help)
            ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 50));
      };
      samples("--train-samples", a.options.train_samples,
              "samples to train (Megatron's sample schedule: --train-iters = samples / global batch)");
      app.add_option_function<std::vector<std::int64_t>>(
             "--rampup-batch-size",
             [&a](const std::vector<std::int64_t>& v) {
               a.options.rampup_batch_size = BatchSizeRampup{v.at(0), v.at(1), v.at(2)};
             },
             "Megatron's batch-size ramp-up: <start global batch> <increment> <ramp-up samples>; the global "
             "batch grows by the increment over the ramp-up samples to --global-batch-size (with "
             "--train-samples)")
          ->expected(3);
      samples("--lr-warmup-samples", a.options.lr_warmup_samples,
              "warm-up in samples (with --train-samples)");
      samples("--lr-decay-samples", a.options.lr_decay_samples,
              "decay in samples (with --train-samples; default --train-samples)");
      samples("--lr-wsd-decay-samples", a.options.lr_wsd_decay_samples,
              "WSD: the final anneal in samples (with --train-samples)");
      app.add_option("--exit-interval", a.options.exit_interval,
                     "save (with --save) and stop after an iteration this divides, as Megatron")
          ->check(integer_at_least(1));
      app.add_option(
             "--exit-duration-in-mins", a.options.exit_duration_in_mins,
             "save (with --save) and stop after the first iteration that ends this many minutes after "
             "the start")
          ->check(CLI::PositiveNumber);
      app.add_flag("--finetune", a.options.finetune,
                   "take only the weights from --load: iteration, data position and optimizer start anew, "
                   "saved as a new run");
      app.add_flag("--no-load-optim", a.options.no_load_optim,
                   "resume --load without its optimizer state (the moments start at zero)");
      app.add_option("--save", a.options.save, "checkpoint directory to save into");
      app.add_option("--load", a.options.load, "checkpoint directory to resume from (its latest iteration)");
      app.add_flag("--overwrite-checkpoints", a.options.overwrite_checkpoints,
                   "let --save replace the checkpoints of another run in that directory");
      app.add_option("--save-interval", a.options.save_interval, "save every N iterations (0: at the end)");
      app.add_option("--data-path", a.options.data_path,
                     "indexed dataset prefix, or W1 PREFIX1 W2 PREFIX2 ...");
      app.add_option("--split", a.options.split, "train,valid,test weights");
      app.add_flag("--mock-data", a.options.mock_data, "Megatron-style synthetic data");
      app.add_flag(
          "--eod-mask-loss", a.options.eod_mask_loss,
          "no loss on positions whose input is the EOD token (the tokenizer's: see --tokenizer-type)");
      add_tokenizer_flags(app, a.tokenizer, false);
      app.add_option("--seed", a.options.seed, "initialization and data-order seed");
      app.add_flag("--check-for-nan-in-loss-and-grad,!--no-check-for-nan-in-loss-and-grad",
                   a.options.check_for_nan_in_loss_and_grad,
                   "stop at a non-finite loss or gradient norm (default, as Megatron); --no-...: skip the "
                   "update instead");
      app.add_option("--log-interval", a.options.log_interval, "log every N iterations (default 10)");
      app.add_option("--eval-interval", a.options.eval_interval,
                     "validation loss every N iterations (default 1000), and once after training")
          ->check(integer_at_least(1));
      app.add_option("--eval-iters", a.options.eval_iters,
                     "global batches per validation / test evaluation (default 0: none; Megatron's is 100)")
          ->check(integer_at_least(0));
      app.add_option("--nproc", a.nproc,
                     "ranks on this host, and the world size unless --world-size is given (the data-parallel "
                     "size follows, as under torchrun): threads with --device cpu, "
                     "one process per GPU with --device cuda (last rank's output shown, errors as [rank K])")
          ->check(integer_between(1, 4096));
      app.add_option("--distributed-timeout-minutes", a.options.distributed_timeout_minutes,
                     "minutes the ranks' rendezvous, NCCL setup or one collective may take before the job "
                     "ends (default 10, Megatron's)");
      app.add_option("--device", a.device, "cuda | cpu (default: cuda when a GPU is present)")
          ->check(CLI::IsMember({"cuda", "cpu"}));
      app.add_flag("--ranks-on-one-gpu", a.ranks_on_one_gpu,
                   "with --device cuda: every rank of the layout as a thread on GPU 0, collectives staged "
                   "through the host (checks a parallel layout on the CUDA kernels with one GPU; not fast)");
      app.add_flag("--bf16", a.options.bf16, "bf16 weights and activations (always on with --device cuda)");
      app.add_option("--ops-out", a.ops_out,
                     "write the ops the first iteration issued (layouts::Op text, one a line) to FILE");
      app.add_option(
          "--tensorboard-dir", a.options.tensorboard_dir,
          "write Megatron's TensorBoard scalars (lm loss, learning rate, grad norm, throughput, MFU, "
          "validation loss, MoE and MTP losses) as event files into DIR");
      app.add_option("--tensorboard-log-interval", a.options.tensorboard_log_interval,
                     "iterations between TensorBoard scalars (default 1)")
          ->check(integer_at_least(1));
      app.add_option("--trace-dir", a.options.trace.dir,
                     "trace a window of iterations into DIR (per-op times joined to the step program, step "
                     "time, arena): DIR/run.json + DIR/rank_<r>.ops.jsonl, read by megatune compare");
      app.add_option("--trace-iterations", a.trace_iterations,
                     "START:COUNT: the iterations --trace-dir times (default 2:3, after the first)");
      app.add_flag(
          "--dry-run", a.dry_run,
          "print each pipeline stage's arena breakdown (the executor's own sizing) and exit: no GPU, "
          "no data, nothing trained");
      add_megatron_compat_flags(app, a.compat);
      a.app = &app;
      return [args]() { return run_train(*args); };
    },
});

}  // namespace
}  // namespace megatune::tools
