// OpRangeObserver: one tracer range per backend op, and the ops' device times from the trace records.
#include "profiler/op_range_observer.h"

#include <stdexcept>
#include <string>

#include "profiler/trace_timing.h"

namespace megatune::profiler {

void OpRangeObserver::op_begin(std::size_t op_index, const layouts::Op& op) {
  if (open_)
    throw std::logic_error("OpRangeObserver: op_begin while op " + std::to_string(ops_.size()) + " is open");
  if (op_index != ops_.size())
    throw std::logic_error("OpRangeObserver: op index " + std::to_string(op_index) + " after " +
                           std::to_string(ops_.size()) + " ops (observer attached to two backends?)");
  ops_.push_back(op);
  tracer_.begin_range(external_id(op_index));
  open_ = true;
}

void OpRangeObserver::op_end() {
  if (!open_) throw std::logic_error("OpRangeObserver: op_end without op_begin");
  tracer_.end_range();
  open_ = false;
}

OpSlice last_iteration(const std::vector<layouts::Op>& ops) {
  std::size_t end_of_previous = 0;  // one past the previous iteration's grad-norm (and AdamW) op
  bool seen_last_norm = false;
  for (std::size_t i = ops.size(); i-- > 0;) {
    if (ops[i].kind != layouts::OpKind::kGradNorm) continue;
    if (seen_last_norm) {
      end_of_previous = i + 1;
      if (end_of_previous < ops.size() && ops[end_of_previous].kind == layouts::OpKind::kOptimizer)
        ++end_of_previous;  // that iteration's AdamW step
      break;
    }
    seen_last_norm = true;
  }
  return {end_of_previous, ops.size() - end_of_previous};
}

AttributedOps attribute_records(const OpRangeObserver& observer, const std::vector<TraceRecord>& records,
                                std::size_t first, std::size_t count) {
  const std::vector<layouts::Op>& ops = observer.ops();
  if (first > ops.size() || count > ops.size() - first)
    throw std::out_of_range("attribute_records: ops [" + std::to_string(first) + ", " +
                            std::to_string(first + count) + ") of " + std::to_string(ops.size()) +
                            " observed");
  std::vector<TraceRecord> outside;
  for (const TraceRecord& record : records)
    if (record.external_id == kNoExternalId) outside.push_back(record);
  for (TraceRecord& record : outside) record.external_id = 1;  // one range: the union of their intervals
  AttributedOps result;
  const auto unattributed = time_ranges(outside);
  if (!unattributed.empty())
    result.unattributed_s = static_cast<double>(unattributed.begin()->second.busy_ns) * 1e-9;

  const std::map<std::uint64_t, RangeTiming> timings = time_ranges(records);
  result.ops.reserve(count);
  for (std::size_t i = first; i < first + count; ++i) {
    MeasuredOp measured;
    measured.op = ops[i];
    const auto found = timings.find(OpRangeObserver::external_id(i));
    if (found == timings.end() || found->second.activities == 0) {
      ++result.ops_without_activity;
    } else {
      measured.measured_s = static_cast<double>(found->second.busy_ns) * 1e-9;
    }
    result.attributed_s += measured.measured_s;
    result.ops.push_back(std::move(measured));
  }
  return result;
}

}  // namespace megatune::profiler
