// Trace timing: op-range busy times from records (overlaps, gaps, several kernels), summaries, and the
// FakeTracer's range attribution.
#include "profiler/trace_timing.h"

#include <gtest/gtest.h>

#include "profiler/fake_tracer.h"

namespace megatune::profiler {
namespace {

TraceRecord record(std::uint64_t id, std::uint64_t start, std::uint64_t end) {
  TraceRecord r;
  r.name = "k";
  r.start_ns = start;
  r.end_ns = end;
  r.external_id = id;
  return r;
}

TEST(TraceTiming, BusyTimeIsTheUnionOfIntervals) {
  // Range 5: [100, 200) and [150, 300) overlap -> 200 busy; then a gap; [400, 450) -> 50 more.
  const std::vector<TraceRecord> records = {record(5, 150, 300), record(5, 100, 200), record(5, 400, 450),
                                            record(6, 1000, 1010), record(kNoExternalId, 0, 5000)};
  const auto timings = time_ranges(records);
  ASSERT_EQ(timings.size(), 2u);
  EXPECT_EQ(timings.at(5).busy_ns, 250u);
  EXPECT_EQ(timings.at(5).span_ns, 350u);
  EXPECT_EQ(timings.at(5).activities, 3);
  EXPECT_EQ(timings.at(6).busy_ns, 10u);
  const std::vector<double> seconds = range_busy_seconds(records, {6, 5});
  ASSERT_EQ(seconds.size(), 2u);
  EXPECT_DOUBLE_EQ(seconds[0], 10e-9);
  EXPECT_DOUBLE_EQ(seconds[1], 250e-9);
}

TEST(TraceTiming, MissingRangeIsAnError) {
  const std::vector<TraceRecord> records = {record(1, 0, 10)};
  EXPECT_THROW(range_busy_seconds(records, {1, 2}), std::runtime_error);
}

TEST(TraceTiming, SummaryMedianMinMax) {
  const TimingSummary odd = summarize({3.0, 1.0, 2.0});
  EXPECT_DOUBLE_EQ(odd.median_s, 2.0);
  EXPECT_DOUBLE_EQ(odd.min_s, 1.0);
  EXPECT_DOUBLE_EQ(odd.max_s, 3.0);
  EXPECT_EQ(odd.repeats, 3);
  const TimingSummary even = summarize({4.0, 1.0, 2.0, 100.0});
  EXPECT_DOUBLE_EQ(even.median_s, 3.0);
  EXPECT_DOUBLE_EQ(even.mean_s, 26.75);
  EXPECT_THROW(summarize({}), std::invalid_argument);
}

TEST(FakeTracer, AttributesLaunchesToTheInnermostRangeAndHoldsThemUntilFlush) {
  FakeTracer tracer(/*launch_gap_ns=*/100, /*start_ns=*/0);
  tracer.launch("outside", 50);
  {
    TraceRange outer(tracer, 10);
    tracer.launch("a", 1000);
    {
      TraceRange inner(tracer, 11);
      tracer.launch("b", 500);
    }
    tracer.launch("c", 200);
  }
  EXPECT_EQ(tracer.open_ranges(), 0);
  const std::vector<TraceRecord> records = tracer.flush();
  ASSERT_EQ(records.size(), 4u);
  EXPECT_EQ(records[0].external_id, kNoExternalId);
  EXPECT_EQ(records[1].external_id, 10u);
  EXPECT_EQ(records[2].external_id, 11u);
  EXPECT_EQ(records[3].external_id, 10u);
  EXPECT_EQ(records[1].duration_ns(), 1000u);
  EXPECT_LT(records[1].correlation_id, records[2].correlation_id);
  EXPECT_TRUE(tracer.flush().empty());
  // Range 10 spans a, (gap), b, (gap), c but is busy only during a and c: b belongs to range 11.
  const auto timings = time_ranges(records);
  EXPECT_EQ(timings.at(10).busy_ns, 1200u);
  EXPECT_EQ(timings.at(11).busy_ns, 500u);
  EXPECT_THROW(tracer.begin_range(kNoExternalId), std::invalid_argument);
  EXPECT_THROW(tracer.end_range(), std::logic_error);
}

}  // namespace
}  // namespace megatune::profiler
