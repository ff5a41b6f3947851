// RoPE frequency scaling: YaRN as Megatron's YarnRotaryEmbedding applies it (the rope type of multi-latent
// attention, driven by --rotary-scaling-factor, --mscale and --mscale-all-dim): each rotation pair's inverse
// frequency blends the plain one with the one divided by the factor over a ramp of pair indices, cos and sin
// are multiplied by a concentration factor, and the attention's softmax scale by mscale^2. The per-pair
// formula is shared by the CPU reference and the CUDA kernels.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MEGATUNE_ROPE_HD __host__ __device__
#else
#define MEGATUNE_ROPE_HD
#endif

namespace megatune::executor {

// Megatron's YaRN settings (MLATransformerConfig's defaults); factor 1 is plain RoPE.
struct YarnSettings {
  double factor = 1.0;                          // --rotary-scaling-factor
  double mscale = 1.0;                          // --mscale
  double mscale_all_dim = 0.0;                  // --mscale-all-dim
  std::int64_t original_max_positions = 4096;   // original_max_position_embeddings
  double beta_fast = 32.0, beta_slow = 1.0;     // the correction range's rotation counts
  bool scaled() const { return factor > 1.0; }  // Megatron's _yarn_get_mscale treats factor <= 1 as none
};

// What the rotation kernels take: the blend of the inverse frequencies and the factor on cos and sin.
struct RopeScaling {
  float factor = 1.0f;                      // 1: plain RoPE (no blend)
  float ramp_low = 0.0f, ramp_high = 1.0f;  // pair indices where the ramp from plain to scaled runs
  float concentration = 1.0f;               // multiplies cos and sin
};

// The kernels' scaling for a rotary head dimension `rotary_dim` at RoPE base `theta`: Megatron's
// _yarn_find_correction_range (rounded to whole pairs), the ramp's singularity guard, and
// _yarn_get_concentration_factor.
RopeScaling yarn_rope_scaling(const YarnSettings& yarn, std::int64_t rotary_dim, double theta);
// Megatron's _yarn_get_mscale(factor, mscale_all_dim): the softmax scale of multi-latent attention is
// this squared over sqrt(q head dim).
double yarn_attention_mscale(const YarnSettings& yarn);

// Inverse frequency of rotation pair i (0 <= i < head_dim / 2) in float, as Megatron computes it in fp32:
// extra = 1 / theta^(2i/d), inter = 1 / (factor * theta^(2i/d)), ramp = clamp((i - low) / (high - low), 0,
// 1), inv_freq = inter * ramp + extra * (1 - ramp). Plain RoPE (factor 1) is extra alone.
MEGATUNE_ROPE_HD inline float rope_inv_freq(std::int64_t i, std::int64_t head_dim, float theta,
                                            const RopeScaling& scaling) {
  const float power = powf(theta, float(2 * i) / float(head_dim));
  const float extra = 1.0f / power;
  if (scaling.factor == 1.0f) return extra;
  const float inter = 1.0f / (scaling.factor * power);
  float ramp = (float(i) - scaling.ramp_low) / (scaling.ramp_high - scaling.ramp_low);
  ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
  const float mask = 1.0f - ramp;
  return inter * (1.0f - mask) + extra * mask;
}

}  // namespace megatune::executor
