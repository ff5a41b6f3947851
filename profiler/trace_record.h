// TraceRecord: one GPU activity (kernel, memcpy or memset) as a tracer reports it, with the op range
// (external correlation id) it was issued in. Timestamps are the device's, in nanoseconds.
#pragma once
#include <cstdint>
#include <string>

namespace megatune::profiler {

enum class ActivityKind : std::uint8_t { kKernel, kMemcpy, kMemset };
const char* activity_kind_name(ActivityKind kind);  // "kernel" | "memcpy" | "memset"

// External id 0 means "issued outside any op range".
inline constexpr std::uint64_t kNoExternalId = 0;

struct TraceRecord {
  ActivityKind kind = ActivityKind::kKernel;
  std::string name;  // kernel name (demangled when the tracer can), "memcpy HtoD", "memset"
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
  std::uint32_t device = 0;
  std::uint32_t stream = 0;
  std::uint32_t correlation_id = 0;           // the tracer's own launch correlation
  std::uint64_t external_id = kNoExternalId;  // the op range (step-program op id, benchmark repeat)
  std::uint64_t duration_ns() const { return end_ns > start_ns ? end_ns - start_ns : 0; }
  bool operator==(const TraceRecord&) const = default;
};

}  // namespace megatune::profiler
