// LearningRateSchedule: Megatron's get_lr formulas (optimizer_param_scheduler.py), over consumed samples.
#include "executor/training/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/user_error.h"

namespace megatune::executor {

LrDecayStyle parse_lr_decay_style(const std::string& text) {
  if (text == "constant") return LrDecayStyle::kConstant;
  if (text == "linear") return LrDecayStyle::kLinear;
  if (text == "cosine") return LrDecayStyle::kCosine;
  if (text == "inverse-square-root") return LrDecayStyle::kInverseSquareRoot;
  if (text == "WSD" || text == "wsd") return LrDecayStyle::kWSD;
  throw UserError("--lr-decay-style '" + text +
                  "' is unknown; use constant, linear, cosine, inverse-square-root or WSD");
}

WsdDecayStyle parse_wsd_decay_style(const std::string& text) {
  if (text == "exponential") return WsdDecayStyle::kExponential;
  if (text == "linear") return WsdDecayStyle::kLinear;
  if (text == "cosine") return WsdDecayStyle::kCosine;
  if (text == "minus_sqrt") return WsdDecayStyle::kMinusSqrt;
  throw UserError("--lr-wsd-decay-style '" + text +
                  "' is unknown; use exponential, linear, cosine or minus_sqrt");
}

const char* to_string(LrDecayStyle style) {
  switch (style) {
    case LrDecayStyle::kConstant:
      return "constant";
    case LrDecayStyle::kLinear:
      return "linear";
    case LrDecayStyle::kCosine:
      return "cosine";
    case LrDecayStyle::kInverseSquareRoot:
      return "inverse-square-root";
    case LrDecayStyle::kWSD:
      return "WSD";
  }
  return "?";
}

LearningRateSchedule::LearningRateSchedule(const LrScheduleConfig& c) : config_(c) {
  if (c.max_lr < 0 || c.min_lr < 0 || c.min_lr > c.max_lr)
    throw UserError("--min-lr must lie in [0, --lr] (got --lr " + std::to_string(c.max_lr) + ", --min-lr " +
                    std::to_string(c.min_lr) + ")");
  if (c.warmup_samples < 0 || c.decay_samples < 0)
    throw UserError("--lr-warmup-iters and --lr-decay-iters must be >= 0");
  if (c.style != LrDecayStyle::kConstant && c.style != LrDecayStyle::kInverseSquareRoot &&
      c.decay_samples <= c.warmup_samples && c.decay_samples > 0)
    throw UserError(
        "--lr-decay-iters must exceed the warm-up iterations (--lr-warmup-iters / --lr-warmup-fraction)");
  if (c.decoupled_max_lr && (*c.decoupled_max_lr < 0 || c.decoupled_min_lr.value_or(0) < 0 ||
                             c.decoupled_min_lr.value_or(0) > *c.decoupled_max_lr))
    throw UserError("--decoupled-min-lr must lie in [0, --decoupled-lr] (got --decoupled-lr " +
                    std::to_string(*c.decoupled_max_lr) + ", --decoupled-min-lr " +
                    std::to_string(c.decoupled_min_lr.value_or(0)) + ")");
  if (c.style == LrDecayStyle::kWSD && (c.wsd_decay_samples <= 0 || c.wsd_decay_samples > c.decay_samples))
    throw UserError("--lr-decay-style WSD needs --lr-wsd-decay-iters in (0, --lr-decay-iters]");
}

double LearningRateSchedule::lr(std::int64_t samples) const {
  return lr_between(samples, config_.max_lr, config_.min_lr);
}

double LearningRateSchedule::decoupled_lr(std::int64_t samples) const {
  // As Megatron's decoupled parameter group: --decoupled-min-lr only with --decoupled-lr, else --min-lr.
  if (!config_.decoupled_max_lr) return lr(samples);
  return lr_between(samples, *config_.decoupled_max_lr, config_.decoupled_min_lr.value_or(config_.min_lr));
}

double LearningRateSchedule::lr_between(std::int64_t n, double max_lr, double min_lr) const {
  const LrScheduleConfig& c = config_;
  if (c.warmup_samples > 0 && n <= c.warmup_samples)
    return c.init_lr + (max_lr - c.init_lr) * static_cast<double>(n) / static_cast<double>(c.warmup_samples);
  if (c.style == LrDecayStyle::kConstant) return max_lr;
  if (n > c.decay_samples) return min_lr;
  if (c.style == LrDecayStyle::kInverseSquareRoot) {
    const double warmup = std::max<std::int64_t>(c.warmup_samples, 1);
    const double steps = std::max<std::int64_t>(n, 1);
    return std::max(min_lr, max_lr * std::sqrt(warmup) / std::sqrt(steps));
  }
  const double ratio =
      static_cast<double>(n - c.warmup_samples) / static_cast<double>(c.decay_samples - c.warmup_samples);
  double coeff = 0.0;
  switch (c.style) {
    case LrDecayStyle::kLinear:
      coeff = 1.0 - ratio;
      break;
    case LrDecayStyle::kCosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
      break;
    case LrDecayStyle::kWSD: {
      const std::int64_t anneal_start = c.decay_samples - c.wsd_decay_samples;
      if (n <= anneal_start) {
        coeff = 1.0;
      } else {
        const double r = static_cast<double>(n - anneal_start) / static_cast<double>(c.wsd_decay_samples);
        switch (c.wsd_style) {
          case WsdDecayStyle::kExponential:
            coeff = 2.0 * std::pow(0.5, r) - 1.0;
            break;
          case WsdDecayStyle::kLinear:
            coeff = 1.0 - r;
            break;
          case WsdDecayStyle::kCosine:
            coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
            break;
          case WsdDecayStyle::kMinusSqrt:
            coeff = 1.0 - std::sqrt(r);
            break;
        }
      }
      break;
    }
    default:
      break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace megatune::executor
