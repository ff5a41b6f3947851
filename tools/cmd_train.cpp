// `megatune train`: trains a model with Megatron's flags on the CUDA or the CPU backend, printing Megatron's
// log lines, saving and resuming checkpoints.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "executor/cpu/cpu_backend.h"
#include "executor/parallel/communicator.h"
#include "executor/training/training_run.h"
#include "layouts/flops.h"
#include "layouts/user_error.h"
#include "tools/command_registry.h"
#include "tools/megatron_args.h"
#ifdef MEGATUNE_HAVE_CUDA
#include "executor/cuda/cuda_backend.h"
#endif

namespace megatune::tools {
namespace {

using namespace megatune::executor;

struct TrainArgs {
  MegatronArgs megatron;
  double lr = 1e-4;
  double min_lr = 0.0;
  double lr_warmup_init = 0.0;
  std::string lr_decay_style = "linear";
  std::optional<std::int64_t> lr_warmup_iters, lr_decay_iters, lr_wsd_decay_iters;
  std::optional<double> lr_warmup_fraction;
  std::string lr_wsd_decay_style = "exponential";
  double weight_decay = 0.01, clip_grad = 1.0, adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double init_method_std = 0.02, norm_epsilon = 1e-5, rotary_base = 10000.0;
  std::int64_t train_iters = 100;
  std::string save, load;
  std::int64_t save_interval = 0;
  std::vector<std::string> data_path;
  std::string split = "969,30,1";
  bool mock_data = false;
  bool eod_mask_loss = false;
  std::uint32_t seed = 1234;
  std::int64_t log_interval = 10;
  std::string device;
  bool bf16 = false;
  std::string ops_out;
};

std::unique_ptr<Backend> make_backend(const std::string& device, bool bf16, double* peak_tflops) {
  if (device == "cpu") {
    *peak_tflops = 0.0;
    return std::make_unique<CpuBackend>(/*emulate_bf16=*/bf16);
  }
#ifdef MEGATUNE_HAVE_CUDA
  auto backend = std::make_unique<CudaBackend>(0);
  try {
    *peak_tflops = layouts::peak_dense_tflops(backend->device_name());
  } catch (const UserError&) {
    *peak_tflops = 0.0;  // unknown GPU: no MFU column
  }
  return backend;
#else
  throw UserError("--device cuda: this megatune was built without CUDA; use --device cpu");
#endif
}

std::string default_device() {
#ifdef MEGATUNE_HAVE_CUDA
  return CudaBackend::device_count() > 0 ? "cuda" : "cpu";
#else
  return "cpu";
#endif
}

int run_train(TrainArgs& a) {
  const layouts::ModelSpec spec = resolve_model(a.megatron);
  layouts::ParallelConfig parallel = resolve_parallel(a.megatron);
  parallel.validate(spec);
  if (parallel.world_size != 1)
    throw UserError("--world-size " + std::to_string(parallel.world_size) +
                    ": the executor trains on one GPU so far; plan larger layouts with `megatune plan`");
  if (a.device.empty()) a.device = default_device();
  if (a.device != "cpu" && a.device != "cuda") throw UserError("--device must be cuda or cpu");
  if (a.mock_data == !a.data_path.empty())
    throw UserError("give exactly one of --data-path PREFIX and --mock-data");

  RunConfig run;
  TrainerConfig& t = run.trainer;
  t.model =
      transformer_config_from(spec, 1, static_cast<float>(a.rotary_base), static_cast<float>(a.norm_epsilon),
                              static_cast<float>(a.init_method_std));
  t.batch.micro_batch = parallel.micro_batch_size;
  t.batch.seq = spec.seq_length;
  t.batch.num_microbatches = parallel.num_microbatches();
  t.recompute = parallel.recompute_granularity;
  const bool bf16 = a.bf16 || a.device == "cuda";  // the CUDA backend computes in bf16
  t.compute_dtype = bf16 ? DType::kBF16 : DType::kFP32;
  t.optimizer = {a.weight_decay, a.adam_beta1, a.adam_beta2, a.adam_eps, a.clip_grad};
  t.seed = a.seed;
  const std::int64_t gbs = t.global_batch_size();
  LrScheduleConfig& lr = t.lr;
  lr.max_lr = a.lr;
  lr.min_lr = a.min_lr;
  lr.init_lr = a.lr_warmup_init;
  lr.style = parse_lr_decay_style(a.lr_decay_style);
  lr.wsd_style = parse_wsd_decay_style(a.lr_wsd_decay_style);
  lr.decay_samples = a.lr_decay_iters.value_or(a.train_iters) * gbs;
  if (a.lr_warmup_iters && a.lr_warmup_fraction)
    throw UserError("give only one of --lr-warmup-iters and --lr-warmup-fraction");
  if (a.lr_warmup_fraction) {
    if (*a.lr_warmup_fraction < 0 || *a.lr_warmup_fraction > 1)
      throw UserError("--lr-warmup-fraction must lie in [0, 1]");
    lr.warmup_samples =
        static_cast<std::int64_t>(*a.lr_warmup_fraction * static_cast<double>(lr.decay_samples));
  } else {
    lr.warmup_samples = a.lr_warmup_iters.value_or(0) * gbs;
  }
  lr.wsd_decay_samples = a.lr_wsd_decay_iters.value_or(0) * gbs;

  run.train_iters = a.train_iters;
  run.data.data_path = a.data_path;
  run.data.mock_data = a.mock_data;
  run.data.split = a.split;
  run.data.gpt.random_seed = a.seed;
  run.data.gpt.vocab_size = spec.vocab_size;
  run.data.gpt.eod_mask_loss = a.eod_mask_loss;
  run.data.gpt.eod_token = spec.vocab_size > 256 ? 256 : 0;  // byte tokenizer's EOD when it fits
  run.data.mock.vocab_size = spec.vocab_size;
  run.data.mock.eod_token = run.data.gpt.eod_token;
  run.save = a.save;
  run.load = a.load;
  run.save_interval = a.save_interval;
  run.log_interval = a.log_interval;
  run.flops_per_iteration = layouts::model_flops_per_iteration(spec, gbs, 1);
  run.record_first_iteration = !a.ops_out.empty();

  std::unique_ptr<Backend> backend = make_backend(a.device, bf16, &run.peak_tflops);
  SingleRankCommunicator communicator(*backend);
  std::cout << "megatune train: " << spec.name << " (" << t.model.describe() << "), "
            << layouts::ModelSpec(spec).total_parameters() << " parameters, seq " << t.batch.seq
            << ", micro-batch " << t.batch.micro_batch << " x " << t.batch.num_microbatches << ", recompute "
            << layouts::to_string(t.recompute) << ", backend " << backend->name() << std::endl;
  TrainingRun training(run, *backend, communicator, std::cout);
  std::cout << "memory: arena " << backend->arena_capacity_bytes() / (1 << 20) << " MiB" << std::endl;
  training.run();
  if (!a.ops_out.empty()) {
    std::ofstream out(a.ops_out);
    if (!out) throw UserError("--ops-out " + a.ops_out + ": cannot write the file; check the directory");
    for (const layouts::Op& op : backend->recorder().ops()) out << layouts::to_string(op) << "\n";
  }
  return 0;
}

const Registrar registrar({
    "train",
    "train a model with Megatron's flags on one GPU (or the CPU backend) and log Megatron-style lines",
    40,
    [](CLI::App& app) -> std::function<int()> {
      auto args = std::make_shared<TrainArgs>();
      TrainArgs& a = *args;
      add_model_flags(app, a.megatron);
      add_parallel_flags(app, a.megatron);
      add_batch_flags(app, a.megatron);
      app.add_option("--lr", a.lr, "peak learning rate (Megatron requires it; megatune default 1e-4)");
      app.add_option("--min-lr", a.min_lr, "learning rate floor of the decay");
      app.add_option("--lr-warmup-init", a.lr_warmup_init, "learning rate at the start of warm-up");
      app.add_option("--lr-decay-style", a.lr_decay_style,
                     "constant | linear | cosine | inverse-square-root | WSD");
      app.add_option("--lr-warmup-iters", a.lr_warmup_iters, "warm-up iterations");
      app.add_option("--lr-warmup-fraction", a.lr_warmup_fraction, "warm-up as a fraction of the decay");
      app.add_option("--lr-decay-iters", a.lr_decay_iters, "iterations of the decay (default --train-iters)");
      app.add_option("--lr-wsd-decay-iters", a.lr_wsd_decay_iters, "WSD: iterations of the final anneal");
      app.add_option("--lr-wsd-decay-style", a.lr_wsd_decay_style,
                     "WSD anneal: exponential | linear | cosine | minus_sqrt");
      app.add_option("--weight-decay", a.weight_decay, "AdamW decoupled weight decay (not on 1-D params)");
      app.add_option("--clip-grad", a.clip_grad, "global gradient-norm clip (0: off)");
      app.add_option("--adam-beta1", a.adam_beta1, "AdamW beta1");
      app.add_option("--adam-beta2", a.adam_beta2, "AdamW beta2");
      app.add_option("--adam-eps", a.adam_eps, "AdamW epsilon");
      app.add_option("--init-method-std", a.init_method_std, "std of the normal initialization");
      app.add_option("--norm-epsilon", a.norm_epsilon, "LayerNorm / RMSNorm epsilon");
      app.add_option("--rotary-base", a.rotary_base, "RoPE theta (10000; Llama 3: 500000)");
      app.add_option("--train-iters", a.train_iters, "iterations to train (default 100)");
      app.add_option("--save", a.save, "checkpoint directory to save into");
      app.add_option("--load", a.load, "checkpoint directory to resume from (its latest iteration)");
      app.add_option("--save-interval", a.save_interval, "save every N iterations (0: at the end)");
      app.add_option("--data-path", a.data_path, "indexed dataset prefix, or W1 PREFIX1 W2 PREFIX2 ...");
      app.add_option("--split", a.split, "train,valid,test weights");
      app.add_flag("--mock-data", a.mock_data, "Megatron-style synthetic data");
      app.add_flag("--eod-mask-loss", a.eod_mask_loss, "no loss on positions whose input is the EOD token");
      app.add_option("--seed", a.seed, "initialization and data-order seed");
      app.add_option("--log-interval", a.log_interval, "log every N iterations (default 10)");
      app.add_option("--device", a.device, "cuda | cpu (default: cuda when a GPU is present)");
      app.add_flag("--bf16", a.bf16, "bf16 weights and activations (always on with --device cuda)");
      app.add_option("--ops-out", a.ops_out,
                     "write the ops the first iteration issued (layouts::Op text, one a line) to FILE");
      return [args]() { return run_train(*args); };
    },
});

}  // namespace
}  // namespace megatune::tools
