// Plausible ranges of hardware figures and the check against them.
#include "cost_models/plausible_ranges.h"

#include <cmath>
#include <cstdio>

#include "base/user_error.h"

namespace megatune::cost_models {
namespace {

std::string number_text(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::optional<PlausibleRange> plausible_range(const std::string& name) {
  if (name == "memory_bytes") return PlausibleRange{1e6, 1.2e15, "bytes (1 MB to 1.2 PB)"};
  if (ends_with(name, "_tflops")) return PlausibleRange{1e-3, 1e6, "TFLOP/s"};
  if (ends_with(name, "bytes_per_s")) return PlausibleRange{1e3, 1e15, "bytes/s (1 KB/s to 1 PB/s)"};
  if (name == "latency_s") return PlausibleRange{1e-10, 10.0, "seconds"};
  if (name == "domain_size") return PlausibleRange{1, 1 << 20, "GPUs"};
  return std::nullopt;
}

void check_plausible(const std::string& name, double value, const std::string& where, bool zero_allowed) {
  const auto range = plausible_range(name);
  if (!range) return;
  if (zero_allowed && value == 0) return;
  if (!std::isfinite(value) || value < range->low || value > range->high) {
    throw UserError(where + ": \"" + name + "\" " + number_text(value) + " is outside " +
                    number_text(range->low) + " to " + number_text(range->high) + " " + range->unit +
                    "; check the value and its unit");
  }
}

}  // namespace megatune::cost_models
