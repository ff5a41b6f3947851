// The table of Megatron-LM flags `train` takes from a pasted script without an option of its own, and the
// one-line refusal or report of what it was given.
#include "tools/megatron_compat_flags.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "base/user_error.h"

namespace megatune::tools {

enum class Treatment {
  kImplementation,  // picks Megatron's kernels, loader, checkpoint format, logging or profiling: accepted
  kOnlyValue,       // accepted at `accepted` (the value megatune runs), refused at any other
  kRefused,         // changes the model or the run in a way megatune does not run
};

struct CompatFlag {
  const char* name;
  int values;  // 0: a flag; 1: one value; -1: one or more
  Treatment treatment;
  // kImplementation: what the flag means for a megatune run ("" for a plain implementation pick);
  // kOnlyValue: why only `accepted` is taken, and what to do; kRefused: why, and what to do.
  const char* note;
  const char* accepted = nullptr;  // kOnlyValue: compared as numbers when both sides are numbers
};

namespace {

constexpr const char* kFp16 =
    "fp16 with loss scaling is not run by megatune: train in bf16 (--bf16 on the CPU backend; the CUDA "
    "backend "
    "always is) and drop the fp16 and loss-scale flags";
constexpr const char* kFp8ParamGather =
    "FP8 parameter all-gathers are not run by megatune: drop --fp8-param-gather (parameters are gathered in "
    "bf16 and cast to FP8 at their first use in the iteration)";
constexpr const char* kFp8Attention =
    "FP8 attention is not run by megatune (attention stays bf16 under --fp8-format): drop the flag";
constexpr const char* kWandb =
    "Weights & Biases logging is not in megatune: drop the --wandb-* flags (the log lines carry the metrics)";
constexpr const char* kStepBatchSchedule =
    "step batch-size schedules are not run by megatune: use --rampup-batch-size <start> <increment> "
    "<ramp-up samples> with --global-batch-size, or drop the flag";
constexpr const char* kDropout =
    "megatune trains without dropout: pass 0.0 (as most pre-training scripts do) or drop the flag";
constexpr const char* kFsdpDtype =
    "Megatron FSDP keeps and reduces gradients in fp32 in megatune: drop the flag or pass fp32";
constexpr const char* kLogging = "not logged by megatune (its log line is Megatron's default one)";

const std::vector<CompatFlag>& table() {
  using T = Treatment;
  static const std::vector<CompatFlag> flags = {
      // Implementation picks: megatune runs its own kernels, data loader and checkpoint format.
      {"--use-mcore-models", 0, T::kImplementation, ""},
      {"--transformer-impl", 1, T::kImplementation, ""},
      {"--attention-backend", 1, T::kImplementation, ""},
      {"--use-flash-attn", 0, T::kImplementation, ""},
      {"--moe-grouped-gemm", 0, T::kImplementation, ""},
      {"--moe-permute-fusion", 0, T::kImplementation, ""},
      {"--moe-use-legacy-grouped-gemm", 0, T::kImplementation, ""},
      {"--cross-entropy-loss-fusion", 0, T::kImplementation, ""},
      {"--cross-entropy-fusion-impl", 1, T::kImplementation, ""},
      {"--no-masked-softmax-fusion", 0, T::kImplementation, ""},
      {"--no-bias-gelu-fusion", 0, T::kImplementation, ""},
      {"--no-bias-swiglu-fusion", 0, T::kImplementation, ""},
      {"--no-bias-dropout-fusion", 0, T::kImplementation, ""},
      {"--no-rope-fusion", 0, T::kImplementation, ""},
      {"--no-gradient-accumulation-fusion", 0, T::kImplementation, ""},
      {"--no-gradient-reduce-div-fusion", 0, T::kImplementation, ""},
      {"--no-persist-layer-norm", 0, T::kImplementation, ""},
      {"--no-async-tensor-model-parallel-allreduce", 0, T::kImplementation, ""},
      {"--no-create-attention-mask-in-dataloader", 0, T::kImplementation, ""},
      {"--no-mmap-bin-files", 0, T::kImplementation, ""},
      {"--num-workers", 1, T::kImplementation, ""},
      {"--data-cache-path", 1, T::kImplementation, ""},
      {"--manual-gc", 0, T::kImplementation, ""},
      {"--manual-gc-interval", 1, T::kImplementation, ""},
      {"--empty-unused-memory-level", 1, T::kImplementation, ""},
      {"--use-nccl-ub", 0, T::kImplementation, ""},
      {"--init-model-with-meta-device", 0, T::kImplementation, ""},
      {"--use-cpu-initialization", 0, T::kImplementation, ""},
      {"--distributed-backend", 1, T::kImplementation, ""},
      {"--enable-experimental", 0, T::kImplementation, ""},
      {"--fsdp-double-buffer", 0, T::kImplementation, ""},
      {"--ckpt-format", 1, T::kImplementation,
       "megatune writes its own checkpoint format (convert: to Hugging Face)"},
      {"--auto-detect-ckpt-format", 0, T::kImplementation, ""},
      {"--dist-ckpt-strictness", 1, T::kImplementation, ""},
      {"--async-save", 0, T::kImplementation, "checkpoints are saved synchronously"},
      {"--ckpt-fully-parallel-save", 0, T::kImplementation, ""},
      {"--ckpt-fully-parallel-load", 0, T::kImplementation, ""},
      {"--no-load-rng", 0, T::kImplementation, "megatune's checkpoints hold no RNG state (no dropout)"},
      {"--no-overlap-p2p-communication", 0, T::kImplementation, ""},
      {"--tp-comm-overlap", 0, T::kImplementation,
       "the executor issues the tensor-parallel collectives without overlap; plan and simulate price it"},
      {"--grad-reduce-in-bf16", 0, T::kImplementation,
       "gradients are reduced in fp32 by the executor (twice Megatron's bytes; plan and simulate price "
       "bf16)"},
      {"--apply-layernorm-1p", 0, T::kImplementation,
       "the same model: norm weights are trained as 1 + w would be (they take no weight decay, the master "
       "weights are fp32)"},
      {"--log-throughput", 0, T::kImplementation, "the log line always has TFLOP/s per GPU and MFU"},
      {"--log-params-norm", 0, T::kImplementation, kLogging},
      {"--log-num-zeros-in-grad", 0, T::kImplementation, kLogging},
      {"--log-memory-to-tensorboard", 0, T::kImplementation,
       "TensorBoard gets the arena's bytes (mem-arena-bytes), not the allocator's counters"},
      {"--log-timers-to-tensorboard", 0, T::kImplementation,
       "TensorBoard gets iteration-time, not Megatron's per-phase timers"},
      {"--log-validation-ppl-to-tensorboard", 0, T::kImplementation,
       "the validation perplexity is always among the TensorBoard scalars"},
      {"--logging-level", 1, T::kImplementation, ""},
      {"--timing-log-level", 1, T::kImplementation, ""},
      {"--profile", 0, T::kImplementation, "megatune's per-op trace is --trace-dir"},
      {"--profile-step-start", 1, T::kImplementation, ""},
      {"--profile-step-end", 1, T::kImplementation, ""},
      {"--profile-ranks", -1, T::kImplementation, ""},
      {"--no-position-embedding", 0, T::kImplementation, "positions come from --position-embedding-type"},
      {"--fp8-interval", 1, T::kImplementation,
       "deprecated and ignored by Megatron: delayed scaling updates at every use, as there"},
      {"--calculate-per-token-loss", 0, T::kImplementation,
       "every token counts here, so the loss over the global batch's tokens equals the mean of the "
       "micro-batches' means (refused with --eod-mask-loss, where they differ)"},
      // Accepted at the value megatune runs.
      {"--attention-dropout", 1, T::kOnlyValue, kDropout, "0"},
      {"--hidden-dropout", 1, T::kOnlyValue, kDropout, "0"},
      {"--rotary-percent", 1, T::kOnlyValue,
       "megatune rotates the whole head dimension: pass 1.0 or drop the flag", "1"},
      {"--moe-router-dtype", 1, T::kOnlyValue,
       "megatune's router computes in fp32: pass fp32 or drop the flag", "fp32"},
      {"--megatron-fsdp-grad-comm-dtype", 1, T::kOnlyValue, kFsdpDtype, "fp32"},
      {"--megatron-fsdp-main-grads-dtype", 1, T::kOnlyValue, kFsdpDtype, "fp32"},
      // Refused: the model or the run would differ from the script's.
      {"--fp16", 0, T::kRefused, kFp16},
      {"--loss-scale", 1, T::kRefused, kFp16},
      {"--initial-loss-scale", 1, T::kRefused, kFp16},
      {"--min-loss-scale", 1, T::kRefused, kFp16},
      {"--loss-scale-window", 1, T::kRefused, kFp16},
      {"--hysteresis", 1, T::kRefused, kFp16},
      {"--fp8-param-gather", 0, T::kRefused, kFp8ParamGather},
      {"--fp8-dot-product-attention", 0, T::kRefused, kFp8Attention},
      {"--fp8-multi-head-attention", 0, T::kRefused, kFp8Attention},
      {"--no-fp8-wgrad", 0, T::kRefused,
       "megatune's FP8 linears compute the weight gradient in FP8 too: drop --no-fp8-wgrad"},
      {"--window-size", 1, T::kRefused,
       "sliding-window attention is not run by megatune: drop --window-size (full causal attention)"},
      {"--moe-router-force-load-balancing", 0, T::kRefused,
       "forced balanced routing is Megatron's benchmarking aid, not training: drop it"},
      {"--moe-flex-dispatcher-backend", 1, T::kRefused,
       "the flex dispatcher (DeepEP / HybridEP) is not run by megatune: drop it and use "
       "--moe-token-dispatcher-type alltoall"},
      {"--tensorboard-queue-size", 1, T::kImplementation, ""},
      {"--wandb-project", 1, T::kRefused, kWandb},
      {"--wandb-exp-name", 1, T::kRefused, kWandb},
      {"--wandb-save-dir", 1, T::kRefused, kWandb},
      {"--wandb-entity", 1, T::kRefused, kWandb},
      {"--step-batch-size-schedule", 1, T::kRefused, kStepBatchSchedule},
      {"--use-legacy-models", 0, T::kRefused,
       "Megatron's legacy models are not a separate path in megatune: drop the flag (its models are Core's)"},
  };
  return flags;
}

bool parse_number(const std::string& text, double& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtod(text.c_str(), &end);
  return end != nullptr && *end == '\0';
}

bool is_accepted_value(const CompatFlag& flag, const std::vector<std::string>& values) {
  if (values.size() != 1) return false;
  double given = 0, accepted = 0;
  if (parse_number(values.front(), given) && parse_number(flag.accepted, accepted)) return given == accepted;
  return values.front() == flag.accepted;
}

std::string as_typed(const MegatronCompatFlags::Given& g) {
  std::string text = g.flag->name;
  for (const std::string& v : g.values) text += " " + v;
  return text;
}

}  // namespace

void add_megatron_compat_flags(CLI::App& app, MegatronCompatFlags& flags) {
  const std::string group = "Megatron compatibility";
  for (const CompatFlag& f : table()) {
    const CompatFlag* entry = &f;
    const std::string help = f.treatment == Treatment::kRefused ? std::string("refused: ") + f.note
                             : f.treatment == Treatment::kOnlyValue
                                 ? std::string("accepted at ") + f.accepted + " only"
                                 : std::string("accepted, changes nothing here") +
                                       (*f.note != '\0' ? std::string(": ") + f.note : "");
    if (f.values == 0) {
      CLI::Option* option = app.add_flag(f.name, help);
      option->group(group);
      option->each([&flags, entry, option](const std::string&) {
        flags.given.push_back({entry, {}, option});
      });
    } else {
      CLI::Option* option = app.add_option(f.name, help);
      option->group(group);
      option->each([&flags, entry, option](const std::string& v) {
        if (!flags.given.empty() && flags.given.back().option == option && entry->values < 0) {
          flags.given.back().values.push_back(v);  // --profile-ranks 0 1: one flag, its values
        } else {
          flags.given.push_back({entry, {v}, option});
        }
      });
      if (f.values < 0) {
        option->expected(1, 16);
      } else {
        option->expected(1);
      }
    }
  }
}

void order_as_given(MegatronCompatFlags& flags, const CLI::App& app) {
  const std::vector<CLI::Option*> order = app.parse_order();
  const auto position = [&](const CLI::Option* option) {
    for (std::size_t i = 0; i < order.size(); ++i)
      if (order[i] == option) return i;
    return order.size();
  };
  std::stable_sort(flags.given.begin(), flags.given.end(),
                   [&](const MegatronCompatFlags::Given& a, const MegatronCompatFlags::Given& b) {
                     return position(a.option) < position(b.option);
                   });
}

void check_megatron_compat_flags(const MegatronCompatFlags& flags) {
  std::vector<const MegatronCompatFlags::Given*> refused;
  for (const MegatronCompatFlags::Given& g : flags.given) {
    const bool bad = g.flag->treatment == Treatment::kRefused ||
                     (g.flag->treatment == Treatment::kOnlyValue && !is_accepted_value(*g.flag, g.values));
    if (bad) refused.push_back(&g);
  }
  if (refused.empty()) return;
  std::string message = as_typed(*refused.front()) + ": " + refused.front()->flag->note;
  if (refused.size() > 1) {
    message += " (also refused:";
    for (std::size_t i = 1; i < refused.size(); ++i)
      message += std::string(i == 1 ? " " : ", ") + as_typed(*refused[i]);
    message += ")";
  }
  throw UserError(message);
}

std::string accepted_compat_flags_line(const MegatronCompatFlags& flags) {
  std::string picks, notes;
  std::set<std::string> seen;
  for (const MegatronCompatFlags::Given& g : flags.given) {
    if (g.flag->treatment == Treatment::kRefused || !seen.insert(g.flag->name).second) continue;
    if (g.flag->treatment == Treatment::kOnlyValue) {
      picks += (picks.empty() ? "" : ", ") + as_typed(g);
    } else if (*g.flag->note == '\0') {
      picks += (picks.empty() ? "" : ", ") + as_typed(g);
    } else {
      notes += "; " + as_typed(g) + ": " + g.flag->note;
    }
  }
  if (picks.empty() && notes.empty()) return "";
  std::string line = "megatune train: Megatron flags taken as given";
  if (!picks.empty())
    line += ": " + picks +
            " (they pick Megatron's kernels, loader, checkpoints or logging; megatune runs its own)";
  return line + notes;
}

bool given(const MegatronCompatFlags& flags, const std::string& name) {
  for (const MegatronCompatFlags::Given& g : flags.given)
    if (name == g.flag->name) return true;
  return false;
}

std::vector<std::string> megatron_compat_flag_names() {
  std::vector<std::string> names;
  for (const CompatFlag& f : table()) names.emplace_back(f.name);
  return names;
}

}  // namespace megatune::tools
