// FakeTracer: fake-clock Tracer for tests.
#include "profiler/fake_tracer.h"

#include <algorithm>
#include <stdexcept>

namespace megatune::profiler {

FakeTracer::FakeTracer(std::uint64_t launch_gap_ns, std::uint64_t start_ns)
    : launch_gap_ns_(launch_gap_ns), now_ns_(start_ns) {}

void FakeTracer::begin_range(std::uint64_t external_id) {
  if (external_id == kNoExternalId) throw std::invalid_argument("FakeTracer: external id 0 is reserved");
  ranges_.push_back(external_id);
}

void FakeTracer::end_range() {
  if (ranges_.empty()) throw std::logic_error("FakeTracer: end_range without begin_range");
  ranges_.pop_back();
}

void FakeTracer::launch(const std::string& name, std::uint64_t duration_ns, std::uint32_t stream,
                        ActivityKind kind) {
  TraceRecord record;
  record.kind = kind;
  record.name = name;
  now_ns_ += launch_gap_ns_;
  record.start_ns = now_ns_;
  now_ns_ += duration_ns;
  record.end_ns = now_ns_;
  record.stream = stream;
  record.correlation_id = next_correlation_++;
  record.external_id = ranges_.empty() ? kNoExternalId : ranges_.back();
  pending_.push_back(std::move(record));
}

std::vector<TraceRecord> FakeTracer::flush() {
  std::vector<TraceRecord> out;
  out.swap(pending_);
  std::stable_sort(out.begin(), out.end(),
                   [](const TraceRecord& a, const TraceRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

}  // namespace megatune::profiler
