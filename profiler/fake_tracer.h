// FakeTracer: a Tracer test double. Nothing runs; callers "launch" kernels of a given duration on a stream
// and a fake device clock advances, so timing code above the Tracer interface can be tested on a CPU.
// Records are held back until flush(), as with a real asynchronous device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "profiler/tracer.h"

namespace megatune::profiler {

class FakeTracer : public Tracer {
 public:
  // `launch_gap_ns`: idle device time before each launch (launch latency), `start_ns`: clock at creation.
  explicit FakeTracer(std::uint64_t launch_gap_ns = 2000, std::uint64_t start_ns = 1'000'000);

  void begin_range(std::uint64_t external_id) override;
  void end_range() override;
  std::vector<TraceRecord> flush() override;
  std::uint64_t dropped_records() const override { return 0; }

  // One kernel (or memcpy/memset) of `duration_ns` on `stream`: it starts after the gap, in the innermost
  // open range.
  void launch(const std::string& name, std::uint64_t duration_ns, std::uint32_t stream = 7,
              ActivityKind kind = ActivityKind::kKernel);
  // Advances the clock without device work (host-side delays).
  void advance(std::uint64_t ns) { now_ns_ += ns; }
  std::uint64_t now_ns() const { return now_ns_; }
  int open_ranges() const { return static_cast<int>(ranges_.size()); }

 private:
  std::uint64_t launch_gap_ns_;
  std::uint64_t now_ns_;
  std::uint32_t next_correlation_ = 1;
  std::vector<std::uint64_t> ranges_;
  std::vector<TraceRecord> pending_;
};

}  // namespace megatune::profiler
