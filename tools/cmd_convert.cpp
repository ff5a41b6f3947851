// `megatune convert`: Hugging Face model folders (config.json + safetensors) to megatune checkpoints
// (--from-hf DIR --save CKPT [layout flags]) and back (--to-hf DIR --load CKPT [--dtype bf16|fp32]).
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_format.h"
#include "executor/checkpoint/hf_model.h"
#include "executor/checkpoint/safetensors_folder.h"
#include "executor/training/hf_conversion.h"
#include "tools/command_registry.h"
#include "tools/megatron_args.h"

namespace megatune::tools {
namespace {

namespace fs = std::filesystem;
using namespace megatune::executor;

struct ConvertArgs {
  std::string from_hf, to_hf, save, load;
  std::string dtype = "fp32";
  std::string max_shard_size = "5GB";
  bool overwrite = false;
  MegatronArgs megatron;
  layouts::ModelNumerics numerics;
  const CLI::App* app = nullptr;
};

bool non_empty_directory(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error) && !fs::is_empty(path, error);
}

void refuse_overwrite(const std::string& flag, const std::string& path, bool overwrite) {
  if (!non_empty_directory(path)) {
    if (fs::exists(path) && !fs::is_directory(path))
      throw UserError(flag + " " + path + " is a file, not a folder; give a folder path");
    return;
  }
  if (!overwrite)
    throw UserError(flag + " " + path +
                    " is not empty; give a new or empty folder, or add --overwrite to "
                    "replace what it holds");
}

int from_hf(const ConvertArgs& a) {
  if (a.save.empty()) throw UserError("--from-hf needs --save CKPT_DIR (where the megatune checkpoint goes)");
  const std::vector<std::string> model_flags =
      given_model_flags(*a.app, {"--make-vocab-size-divisible-by", "--seq-length"});
  if (!model_flags.empty())
    throw UserError(model_flags.front() +
                    " with --from-hf: the model comes from config.json; only "
                    "--make-vocab-size-divisible-by and --seq-length may be given");
  refuse_overwrite("--save", a.save, a.overwrite);
  checkpoint::HfModel model =
      checkpoint::read_hf_config(a.from_hf, a.megatron.make_vocab_size_divisible_by.value_or(128));
  if (a.megatron.seq_length) {
    model.spec.seq_length = *a.megatron.seq_length;
    model.spec.validate();
  }
  layouts::ParallelConfig layout = resolve_parallel(a.megatron);
  layout.validate(model.spec);
  const int64_t padded = model.spec.padded_vocab_size(layout.tp());
  std::cout << "megatune convert: " << a.from_hf << " (" << checkpoint::to_string(model.architecture) << ", "
            << model.spec.num_layers << " layers, hidden " << model.spec.hidden_size << ", vocabulary "
            << model.spec.vocab_size << ")" << std::endl;
  if (padded != model.spec.vocab_size)
    std::cout << "padded the vocabulary " << model.spec.vocab_size << " -> " << padded
              << " with zero rows (--make-vocab-size-divisible-by " << model.spec.make_vocab_size_divisible_by
              << " x tp " << layout.tp() << "); the padded logits enter megatune's softmax as in Megatron: "
              << "--make-vocab-size-divisible-by 1 keeps the loss exactly HF's" << std::endl;
  const FullParameters parameters = read_hf_parameters(a.from_hf, model, padded);
  if (a.overwrite && non_empty_directory(a.save)) fs::remove_all(a.save);
  write_converted_checkpoint(a.save, model, parameters, layout.world_size > 1 ? &layout : nullptr,
                             fs::absolute(a.from_hf).string());
  std::cout << "wrote " << a.save << " (iteration 0, "
            << (layout.world_size > 1 ? std::to_string(layout.world_size) + " rank shards" : "one shard")
            << "); train it with: megatune train --load " << a.save << " ... (no model flags needed)"
            << std::endl;
  return 0;
}

int to_hf(ConvertArgs& a) {
  if (a.load.empty()) throw UserError("--to-hf needs --load CKPT_DIR (the megatune checkpoint to export)");
  if (a.dtype != "fp32" && a.dtype != "bf16") throw UserError("--dtype " + a.dtype + ": give fp32 or bf16");
  const int64_t max_shard_bytes = checkpoint::parse_byte_size(a.max_shard_size, "--max-shard-size");
  refuse_overwrite("--to-hf", a.to_hf, a.overwrite);
  const std::vector<std::string> recorded = checkpoint_model_args(a.load);
  const std::vector<std::string> given = given_model_flags(*a.app);
  if (recorded.empty() && given.empty())
    throw UserError("--load " + a.load +
                    " records no model flags (a save from before they were recorded); "
                    "give the model flags it was trained with (--model ... and its overrides)");
  if (given.empty()) {
    parse_recorded_model_flags(recorded, a.megatron, a.numerics, "--load " + a.load);
  } else {
    if (a.app->count("--rotary-base") == 0 || a.app->count("--norm-epsilon") == 0) {
      layouts::ModelNumerics recorded_numerics = a.numerics;
      MegatronArgs unused;
      if (!recorded.empty()) parse_recorded_model_flags(recorded, unused, recorded_numerics, a.load);
      if (a.app->count("--rotary-base") == 0) a.numerics.rotary_base = recorded_numerics.rotary_base;
      if (a.app->count("--norm-epsilon") == 0) a.numerics.norm_epsilon = recorded_numerics.norm_epsilon;
    }
  }
  const layouts::ModelSpec spec = resolve_model(a.megatron);
  const checkpoint::HfModel model = checkpoint::hf_model_of(spec, a.numerics);
  int64_t padded = 0;
  const FullParameters parameters = read_checkpoint_parameters(a.load, spec, a.numerics, &padded);
  if (a.overwrite && non_empty_directory(a.to_hf)) fs::remove_all(a.to_hf);
  const checkpoint::TensorDType dtype =
      a.dtype == "bf16" ? checkpoint::TensorDType::bf16 : checkpoint::TensorDType::fp32;
  const std::vector<std::string> files = write_hf_folder(a.to_hf, model, parameters, dtype, max_shard_bytes);
  std::cout << "wrote " << a.to_hf << " (" << checkpoint::to_string(model.architecture) << ", " << a.dtype
            << ", vocabulary " << spec.vocab_size
            << (padded != spec.vocab_size ? " trimmed from " + std::to_string(padded) : "") << "): ";
  for (size_t i = 0; i < files.size(); ++i) std::cout << (i ? ", " : "") << files[i];
  std::cout << std::endl;
  return 0;
}

int run_convert(ConvertArgs& a) {
  if (a.from_hf.empty() == a.to_hf.empty())
    throw UserError(
        "give exactly one of --from-hf DIR (with --save CKPT) and --to-hf DIR (with --load CKPT)");
  if (!a.from_hf.empty() && !a.load.empty())
    throw UserError("--load with --from-hf: the weights come from the HF folder; drop --load");
  if (!a.to_hf.empty() && !a.save.empty())
    throw UserError("--save with --to-hf: the output is the --to-hf folder; drop --save");
  return a.from_hf.empty() ? to_hf(a) : from_hf(a);
}

const Registrar kConvertCommand({
    "convert",
    "convert between Hugging Face model folders (config.json + safetensors) and megatune checkpoints",
    45,
    [](CLI::App& app) -> std::function<int()> {
      auto args = std::make_shared<ConvertArgs>();
      ConvertArgs& a = *args;
      app.add_option("--from-hf", a.from_hf,
                     "Hugging Face folder to import (GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, "
                     "MixtralForCausalLM, Qwen3ForCausalLM)");
      app.add_option("--save", a.save, "megatune checkpoint folder to write (with --from-hf)");
      app.add_option("--to-hf", a.to_hf, "Hugging Face folder to write (with --load)");
      app.add_option("--load", a.load, "megatune checkpoint to export, any layout (with --to-hf)");
      app.add_option("--dtype", a.dtype, "tensor dtype of the exported safetensors: fp32 (default) | bf16");
      app.add_option("--max-shard-size", a.max_shard_size,
                     "largest safetensors file before sharding with an index (default 5GB, as HF's)");
      app.add_flag("--overwrite", a.overwrite, "replace what a non-empty output folder holds");
      app.add_option("--rotary-base", a.numerics.rotary_base,
                     "RoPE theta of a checkpoint that records no model flags");
      app.add_option("--norm-epsilon", a.numerics.norm_epsilon,
                     "norm epsilon of a checkpoint that records no model flags");
      for (CLI::Option* option : app.get_options())
        if (option->get_group() == "Options") option->group("Convert");
      add_model_flags(app, a.megatron);
      add_parallel_flags(app, a.megatron);
      add_batch_flags(app, a.megatron);
      a.app = &app;
      return [args]() { return run_convert(*args); };
    },
});

}  // namespace
}  // namespace megatune::tools
