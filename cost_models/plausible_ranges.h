// Physically plausible ranges of hardware figures (GPU memory, TFLOP/s, bandwidths, latencies, NVLink
// domain sizes): one home for the bounds that cluster files and imported gpu_models / interconnects rows
// are checked against, so that a value off by a unit (1e300 bytes, 1e-300 B/s) is refused with one line
// instead of printing negative capacities or "inf s".
#pragma once
#include <optional>
#include <string>

namespace megatune::cost_models {

struct PlausibleRange {
  double low, high;
  const char* unit;  // "bytes (1 MB to 1.2 PB)", ...
};

// The range of a figure by its column / key name (memory_bytes, peak_*_tflops, *_bytes_per_s, latency_s,
// domain_size); nullopt for names without one.
std::optional<PlausibleRange> plausible_range(const std::string& name);

// Throws UserError "<where>: "<name>" <value> is outside <low> to <high> <unit>; check the value and its
// unit" when `value` is non-finite or outside plausible_range(name). Zero is allowed where `zero_allowed`
// (a catalog's "not supported", e.g. peak_fp8_tflops 0, or domain_size 0 for a network).
void check_plausible(const std::string& name, double value, const std::string& where,
                     bool zero_allowed = false);

}  // namespace megatune::cost_models
