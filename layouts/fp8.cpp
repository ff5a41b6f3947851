// FP8 encodings, rounding, scales and the bytes of a cast (layouts/fp8.h).
#include "layouts/fp8.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "layouts/rank_shape.h"

namespace megatune::layouts {
namespace {

struct Encoding {
  int mantissa_bits;
  int min_normal_exponent;  // of the smallest normal value, 2^min_normal_exponent
  float max;
};

Encoding encoding_of(Fp8Encoding e) {
  return e == Fp8Encoding::kE4M3 ? Encoding{3, -6, 448.0f} : Encoding{2, -14, 57344.0f};
}

}  // namespace

double fp8_max(Fp8Encoding encoding) { return encoding_of(encoding).max; }

float round_to_fp8(float x, Fp8Encoding encoding) {
  if (std::isnan(x)) return x;
  const Encoding e = encoding_of(encoding);
  const float magnitude = std::fabs(x);
  if (magnitude == 0.0f) return x;
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  // The spacing of representable values around x: 2^(floor(log2 |x|) - mantissa_bits), and the subnormal
  // spacing below the smallest normal value.
  const int unit_exponent = std::max(exponent - 1, e.min_normal_exponent) - e.mantissa_bits;
  const float unit = std::ldexp(1.0f, unit_exponent);
  float rounded = std::nearbyint(magnitude / unit) * unit;  // the default rounding: to nearest even
  rounded = std::min(rounded, e.max);
  return std::copysign(rounded, x);
}

float fp8_scale_for_amax(float amax, Fp8Encoding encoding, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  return static_cast<float>(fp8_max(encoding) / amax / std::ldexp(1.0, margin));
}

std::int64_t fp8_cast_bytes(std::int64_t elements, int outputs, bool current_scaling) {
  return elements * 2 * (current_scaling ? 2 : 1) + elements * outputs;
}

std::int64_t fp8_state_elements(const Fp8Settings& settings) {
  const std::int64_t fields = kFp8History + std::max(settings.amax_history_len, 1);
  return (fields + 15) / 16 * 16;
}

std::string fp8_shape_problem(const RankShape& s) {
  std::vector<std::pair<const char*, std::int64_t>> sizes = {
      {"the micro-batch's tokens per rank (micro-batch x sequence / context-parallel size)", s.tokens},
      {"the hidden size", s.hidden}};
  if (!s.mla)
    sizes.insert(sizes.end(), {{"the qkv projection's output features per rank", s.qkv_width()},
                               {"the attention output's features per rank", s.attention_width()}});
  if (s.ffn > 0)
    sizes.push_back({"the MLP's features per rank (ffn / tensor-parallel size)", s.ffn_per_rank()});
  for (const auto& [what, size] : sizes)
    if (size % 16 != 0) return std::string(what) + " is " + std::to_string(size);
  return "";
}

std::string describe(const Fp8Settings& s) {
  if (!s.enabled()) return "bf16";
  std::string text = std::string("fp8 ") + fp8_format_name(s.format) + " " + fp8_recipe_name(s.recipe) + " (";
  if (s.recipe == Fp8Recipe::kDelayed)
    text += "amax history " + std::to_string(s.amax_history_len) + ", " +
            (s.amax_max ? "max" : "most_recent") + ", ";
  return text + "margin " + std::to_string(s.margin) + ")";
}

const char* fp8_format_name(Fp8Format format) {
  switch (format) {
    case Fp8Format::kE4M3:
      return "e4m3";
    case Fp8Format::kHybrid:
      return "hybrid";
    case Fp8Format::kNone:
      break;
  }
  return "none";
}

const char* fp8_recipe_name(Fp8Recipe recipe) {
  return recipe == Fp8Recipe::kTensorwise ? "tensorwise" : "delayed";
}

}  // namespace megatune::layouts
