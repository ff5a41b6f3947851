// LearningRateSchedule: Megatron's OptimizerParamScheduler learning rate, counted in samples (warm-up, then
// constant, linear, cosine, inverse-square-root or WSD decay).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace megatune::executor {

enum class LrDecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot, kWSD };
enum class WsdDecayStyle { kExponential, kLinear, kCosine, kMinusSqrt };
LrDecayStyle parse_lr_decay_style(const std::string& text);    // UserError naming --lr-decay-style
WsdDecayStyle parse_wsd_decay_style(const std::string& text);  // UserError naming --lr-wsd-decay-style
const char* to_string(LrDecayStyle style);

struct LrScheduleConfig {
  double max_lr = 1e-4;                // --lr
  double min_lr = 0.0;                 // --min-lr
  double init_lr = 0.0;                // --lr-warmup-init
  std::int64_t warmup_samples = 0;     // --lr-warmup-iters * GBS, or fraction * decay samples
  std::int64_t decay_samples = 0;      // --lr-decay-iters (default --train-iters) * GBS
  std::int64_t wsd_decay_samples = 0;  // --lr-wsd-decay-iters * GBS
  LrDecayStyle style = LrDecayStyle::kLinear;
  WsdDecayStyle wsd_style = WsdDecayStyle::kExponential;
  // Megatron's --decoupled-lr / --decoupled-min-lr: the peak and floor of the input embedding's and the
  // output layer's rate under the same warm-up and decay (init_lr included); unset: max_lr and min_lr.
  std::optional<double> decoupled_max_lr, decoupled_min_lr;
};

class LearningRateSchedule {
 public:
  explicit LearningRateSchedule(const LrScheduleConfig& config);  // UserError on inconsistent values
  // Learning rate after `samples` samples were consumed (Megatron's get_lr with num_steps = samples).
  double lr(std::int64_t samples) const;
  // The rate of the decoupled group (the word embeddings and the output layer) after `samples` samples:
  // Megatron's get_lr of that parameter group (its max_lr and min_lr); lr(samples) without --decoupled-lr.
  double decoupled_lr(std::int64_t samples) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  double lr_between(std::int64_t samples, double max_lr, double min_lr) const;
  LrScheduleConfig config_;
};

}  // namespace megatune::executor
