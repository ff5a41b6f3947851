// LearningRateSchedule against Megatron's get_lr formulas (warm-up, linear, cosine, inverse-square-root,
// WSD, constant), counted in samples, the decoupled group's rate (--decoupled-lr / --decoupled-min-lr under
// the same schedule), and its input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "base/user_error.h"
#include "executor/training/lr_schedule.h"

namespace megatune::executor {
namespace {

LrScheduleConfig base(LrDecayStyle style) {
  LrScheduleConfig c;
  c.max_lr = 1e-3;
  c.min_lr = 1e-5;
  c.warmup_samples = 100;
  c.decay_samples = 1100;
  c.style = style;
  return c;
}

TEST(LrSchedule, WarmupIsLinearFromInit) {
  LrScheduleConfig c = base(LrDecayStyle::kCosine);
  c.init_lr = 1e-4;
  LearningRateSchedule s(c);
  EXPECT_DOUBLE_EQ(s.lr(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.lr(50), 1e-4 + (1e-3 - 1e-4) * 0.5);
  EXPECT_DOUBLE_EQ(s.lr(100), 1e-3);
}

TEST(LrSchedule, LinearAndCosineDecay) {
  LearningRateSchedule linear(base(LrDecayStyle::kLinear));
  LearningRateSchedule cosine(base(LrDecayStyle::kCosine));
  // n = 350: ratio (350 - 100) / 1000 = 0.25.
  EXPECT_DOUBLE_EQ(linear.lr(350), 1e-5 + 0.75 * (1e-3 - 1e-5));
  EXPECT_DOUBLE_EQ(cosine.lr(350), 1e-5 + 0.5 * (std::cos(std::numbers::pi * 0.25) + 1) * (1e-3 - 1e-5));
  EXPECT_NEAR(linear.lr(1100), 1e-5, 1e-18);
  EXPECT_NEAR(cosine.lr(1100), 1e-5, 1e-18);
  EXPECT_DOUBLE_EQ(linear.lr(5000), 1e-5);  // past decay: min
}

TEST(LrSchedule, InverseSquareRootAndConstant) {
  LearningRateSchedule isr(base(LrDecayStyle::kInverseSquareRoot));
  EXPECT_DOUBLE_EQ(isr.lr(400), 1e-3 * std::sqrt(100.0) / std::sqrt(400.0));
  LearningRateSchedule constant(base(LrDecayStyle::kConstant));
  EXPECT_DOUBLE_EQ(constant.lr(50), 0.5e-3);  // warm-up still applies
  EXPECT_DOUBLE_EQ(constant.lr(100000), 1e-3);
}

TEST(LrSchedule, WsdHoldsThenAnneals) {
  LrScheduleConfig c = base(LrDecayStyle::kWSD);
  c.wsd_decay_samples = 200;  // anneal over [900, 1100]
  for (WsdDecayStyle style : {WsdDecayStyle::kExponential, WsdDecayStyle::kLinear, WsdDecayStyle::kCosine,
                              WsdDecayStyle::kMinusSqrt}) {
    c.wsd_style = style;
    LearningRateSchedule s(c);
    EXPECT_DOUBLE_EQ(s.lr(500), 1e-3);
    EXPECT_DOUBLE_EQ(s.lr(900), 1e-3);
    const double r = 0.5;  // n = 1000
    double coeff = 0;
    switch (style) {
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
    EXPECT_DOUBLE_EQ(s.lr(1000), 1e-5 + coeff * (1e-3 - 1e-5));
  }
}

// Megatron's get_lr for the group with max_lr = --decoupled-lr and min_lr = --decoupled-min-lr (else
// --min-lr): warm-up from the same init, decay over the same samples.
TEST(LrSchedule, DecoupledGroupFollowsTheScheduleBetweenItsOwnPeakAndFloor) {
  LrScheduleConfig c = base(LrDecayStyle::kCosine);
  c.init_lr = 1e-4;
  EXPECT_DOUBLE_EQ(LearningRateSchedule(c).decoupled_lr(350), LearningRateSchedule(c).lr(350));
  c.decoupled_max_lr = 5e-3;
  c.decoupled_min_lr = 4e-4;
  LearningRateSchedule s(c);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(0), 1e-4);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(50), 1e-4 + (5e-3 - 1e-4) * 0.5);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(100), 5e-3);
  EXPECT_DOUBLE_EQ(s.decoupled_lr(350), 4e-4 + 0.5 * (std::cos(std::numbers::pi * 0.25) + 1) * (5e-3 - 4e-4));
  EXPECT_DOUBLE_EQ(s.decoupled_lr(5000), 4e-4);
  EXPECT_DOUBLE_EQ(s.lr(350), 1e-5 + 0.5 * (std::cos(std::numbers::pi * 0.25) + 1) * (1e-3 - 1e-5));
  c.decoupled_min_lr.reset();  // the floor is --min-lr
  EXPECT_DOUBLE_EQ(LearningRateSchedule(c).decoupled_lr(5000), 1e-5);
  c.style = LrDecayStyle::kConstant;
  EXPECT_DOUBLE_EQ(LearningRateSchedule(c).decoupled_lr(5000), 5e-3);
}

TEST(LrSchedule, BadInputIsAUserError) {
  LrScheduleConfig decoupled = base(LrDecayStyle::kLinear);
  decoupled.decoupled_max_lr = 1e-4;
  decoupled.decoupled_min_lr = 1e-3;
  EXPECT_THROW(LearningRateSchedule{decoupled}, UserError);
  LrScheduleConfig c = base(LrDecayStyle::kLinear);
  c.min_lr = 1e-2;
  EXPECT_THROW(LearningRateSchedule{c}, UserError);
  c = base(LrDecayStyle::kWSD);
  EXPECT_THROW(LearningRateSchedule{c}, UserError);  // no WSD anneal length
  EXPECT_THROW(parse_lr_decay_style("cosin"), UserError);
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LrDecayStyle::kInverseSquareRoot);
}

}  // namespace
}  // namespace megatune::executor
