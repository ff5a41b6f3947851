// Tracer: the interface through which the profiler sees GPU activity. Work issued between begin_range(id)
// and end_range() is attributed to `id`; flush() waits for the device and returns every record completed
// since the last flush. Implementations: CuptiTracer (profiler/cuda, CUPTI Activity API) and FakeTracer
// (a fake clock, for tests without a GPU).
#pragma once
#include <cstdint>
#include <vector>

#include "profiler/trace_record.h"

namespace megatune::profiler {

class Tracer {
 public:
  virtual ~Tracer() = default;
  // Ranges nest; a record belongs to the innermost open range when it was issued. `external_id` != 0.
  virtual void begin_range(std::uint64_t external_id) = 0;
  virtual void end_range() = 0;
  // Waits for outstanding work, then returns and forgets every record gathered since the last flush,
  // ordered by start time.
  virtual std::vector<TraceRecord> flush() = 0;
  // Records lost because the tracer's buffers overflowed since it started (0 when none).
  virtual std::uint64_t dropped_records() const = 0;
};

// Begins a range on construction and ends it on destruction.
class TraceRange {
 public:
  TraceRange(Tracer& tracer, std::uint64_t external_id) : tracer_(tracer) {
    tracer_.begin_range(external_id);
  }
  ~TraceRange() { tracer_.end_range(); }
  TraceRange(const TraceRange&) = delete;
  TraceRange& operator=(const TraceRange&) = delete;

 private:
  Tracer& tracer_;
};

}  // namespace megatune::profiler
