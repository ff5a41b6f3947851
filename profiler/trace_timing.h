// From trace records to op times: the device time of each op range (union of its activities' intervals, so
// an op of several kernels counts its gaps-free busy time once) and the median/min/max summary of repeats.
// Every time the profiler stores comes from here, i.e. from device timestamps, never from host clocks.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "profiler/trace_record.h"

namespace megatune::profiler {

struct RangeTiming {
  std::uint64_t busy_ns = 0;  // union of the activity intervals of the range
  std::uint64_t span_ns = 0;  // first start to last end
  int activities = 0;
};

// Per external id (records outside any range are ignored).
std::map<std::uint64_t, RangeTiming> time_ranges(const std::vector<TraceRecord>& records);

// Busy seconds of each of `external_ids`, in that order. Throws std::runtime_error naming the id when a
// range has no record (the op launched nothing or the tracer lost it).
std::vector<double> range_busy_seconds(const std::vector<TraceRecord>& records,
                                       const std::vector<std::uint64_t>& external_ids);

struct TimingSummary {
  double median_s = 0, min_s = 0, max_s = 0, mean_s = 0;
  int repeats = 0;
};
// Median (mean of the two middle values for an even count), min, max, mean. Throws on an empty input.
TimingSummary summarize(std::vector<double> samples_s);

}  // namespace megatune::profiler
