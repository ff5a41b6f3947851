// Op-range device times from trace records, and their summary.
#include "profiler/trace_timing.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>

namespace megatune::profiler {

std::map<std::uint64_t, RangeTiming> time_ranges(const std::vector<TraceRecord>& records) {
  std::map<std::uint64_t, std::vector<std::pair<std::uint64_t, std::uint64_t>>> intervals;
  for (const TraceRecord& record : records) {
    if (record.external_id == kNoExternalId) continue;
    intervals[record.external_id].emplace_back(record.start_ns, std::max(record.start_ns, record.end_ns));
  }
  std::map<std::uint64_t, RangeTiming> out;
  for (auto& [id, list] : intervals) {
    std::sort(list.begin(), list.end());
    RangeTiming timing;
    timing.activities = static_cast<int>(list.size());
    std::uint64_t last_end = 0;
    std::uint64_t cover_start = list.front().first;
    std::uint64_t cover_end = list.front().first;
    for (const auto& [start, end] : list) {
      if (start > cover_end) {
        timing.busy_ns += cover_end - cover_start;
        cover_start = start;
        cover_end = end;
      } else {
        cover_end = std::max(cover_end, end);
      }
      last_end = std::max(last_end, end);
    }
    timing.busy_ns += cover_end - cover_start;
    timing.span_ns = last_end - list.front().first;
    out.emplace(id, timing);
  }
  return out;
}

std::vector<double> range_busy_seconds(const std::vector<TraceRecord>& records,
                                       const std::vector<std::uint64_t>& external_ids) {
  const auto timings = time_ranges(records);
  std::vector<double> out;
  out.reserve(external_ids.size());
  for (const std::uint64_t id : external_ids) {
    const auto found = timings.find(id);
    if (found == timings.end() || found->second.busy_ns == 0) {
      throw std::runtime_error("trace: no device activity recorded for op range " + std::to_string(id) +
                               " (nothing launched, or the tracer dropped records)");
    }
    out.push_back(static_cast<double>(found->second.busy_ns) * 1e-9);
  }
  return out;
}

TimingSummary summarize(std::vector<double> samples_s) {
  if (samples_s.empty()) throw std::invalid_argument("summarize: no samples");
  std::sort(samples_s.begin(), samples_s.end());
  TimingSummary summary;
  const std::size_t n = samples_s.size();
  summary.repeats = static_cast<int>(n);
  summary.min_s = samples_s.front();
  summary.max_s = samples_s.back();
  summary.median_s = n % 2 == 1 ? samples_s[n / 2] : 0.5 * (samples_s[n / 2 - 1] + samples_s[n / 2]);
  summary.mean_s = std::accumulate(samples_s.begin(), samples_s.end(), 0.0) / static_cast<double>(n);
  return summary;
}

}  // namespace megatune::profiler
