// YaRN's correction range and scale factors (Megatron's yarn_rotary_pos_embedding.py helpers).
#include "executor/kernels/rope_scaling.h"

#include <algorithm>
#include <numbers>

namespace megatune::executor {
namespace {

// _yarn_find_correction_dim: the pair index whose wavelength makes `rotations` turns over the original
// context.
double correction_dim(double rotations, std::int64_t dim, double theta, std::int64_t max_positions) {
  return static_cast<double>(dim) *
         std::log(static_cast<double>(max_positions) / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

}  // namespace

RopeScaling yarn_rope_scaling(const YarnSettings& yarn, std::int64_t rotary_dim, double theta) {
  RopeScaling s;
  if (!yarn.scaled()) return s;
  s.factor = static_cast<float>(yarn.factor);
  const double low =
      std::floor(correction_dim(yarn.beta_fast, rotary_dim, theta, yarn.original_max_positions));
  const double high =
      std::ceil(correction_dim(yarn.beta_slow, rotary_dim, theta, yarn.original_max_positions));
  s.ramp_low = static_cast<float>(std::max(low, 0.0));
  s.ramp_high = static_cast<float>(std::min(high, static_cast<double>(rotary_dim - 1)));
  if (s.ramp_low == s.ramp_high) s.ramp_high += 0.001f;  // _yarn_linear_ramp_mask's guard
  s.concentration = static_cast<float>(yarn_mscale(yarn.factor, yarn.mscale) /
                                       yarn_mscale(yarn.factor, yarn.mscale_all_dim));
  return s;
}

double yarn_attention_mscale(const YarnSettings& yarn) {
  return yarn_mscale(yarn.factor, yarn.mscale_all_dim);
}

}  // namespace megatune::executor
