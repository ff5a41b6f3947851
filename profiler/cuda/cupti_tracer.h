// CuptiTracer: the Tracer over CUPTI's Activity API. It records concurrent kernels, memcpys and memsets
// with device timestamps, and attributes each to the op range open when it was launched through CUPTI
// external correlation ids (CUSTOM0). Buffers are handed to CUPTI on request and parsed on completion
// (CUPTI's thread); flush() synchronizes the device and forces CUPTI to deliver everything.
// One CuptiTracer may exist at a time in a process (CUPTI's callbacks are process-wide).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "profiler/tracer.h"

namespace megatune::profiler::cuda {

class CuptiTracer : public Tracer {
 public:
  // Enables the activity kinds; throws std::runtime_error (file:line, CUPTI's message) when CUPTI is
  // unavailable or another CuptiTracer is alive.
  CuptiTracer();
  ~CuptiTracer() override;
  CuptiTracer(const CuptiTracer&) = delete;
  CuptiTracer& operator=(const CuptiTracer&) = delete;

  void begin_range(std::uint64_t external_id) override;
  void end_range() override;
  std::vector<TraceRecord> flush() override;
  std::uint64_t dropped_records() const override;

  struct State;  // shared with CUPTI's callbacks (cupti_tracer.cpp)

 private:
  std::unique_ptr<State> state_;
};

}  // namespace megatune::profiler::cuda
