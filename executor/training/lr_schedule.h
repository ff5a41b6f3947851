// LearningRateSchedule: Megatron's OptimizerParamScheduler learning rate, counted in samples (warm-up, then
// constant, linear, cosine, inverse-square-root or WSD decay).
#pragma once
#include <cstdint>
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
};

class LearningRateSchedule {
 public:
  explicit LearningRateSchedule(const LrScheduleConfig& config);  // UserError on inconsistent values
  // Learning rate after `samples` samples were consumed (Megatron's get_lr with num_steps = samples).
  double lr(std::int64_t samples) const;
  const LrScheduleConfig& config() const { return config_; }

 private:
  LrScheduleConfig config_;
};

}  // namespace megatune::executor
