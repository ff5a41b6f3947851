// OpRangeObserver: attributes a backend's device work to its ops through a Tracer. Attached to a Backend
// (Backend::set_op_observer), it opens one tracer range per issued op (external id = 1 + the op's index),
// so every kernel, memcpy and memset launched inside the op carries the op's id; after a flush, the
// records give each op's device busy time (trace_timing.h), i.e. timings from device timestamps only.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "profiler/run_join.h"
#include "profiler/tracer.h"

namespace megatune::profiler {

class OpRangeObserver : public executor::Backend::OpObserver {
 public:
  explicit OpRangeObserver(Tracer& tracer) : tracer_(tracer) {}
  OpRangeObserver(const OpRangeObserver&) = delete;
  OpRangeObserver& operator=(const OpRangeObserver&) = delete;

  void op_begin(std::size_t op_index, const layouts::Op& op) override;
  void op_end() override;

  // Every op observed so far, in issue order; op i was traced under external id external_id(i).
  const std::vector<layouts::Op>& ops() const { return ops_; }
  static std::uint64_t external_id(std::size_t op_index) { return static_cast<std::uint64_t>(op_index) + 1; }
  bool op_open() const { return open_; }

 private:
  Tracer& tracer_;
  std::vector<layouts::Op> ops_;
  bool open_ = false;
};

// The ops of the last training iteration among `ops` (issue order): those after the previous iteration's
// grad-norm op and its AdamW step (every iteration computes the norm; AdamW is skipped when the norm is not
// finite, so iterations may differ in length). {first, count}; {0, ops.size()} when only one iteration.
struct OpSlice {
  std::size_t first = 0, count = 0;
};
OpSlice last_iteration(const std::vector<layouts::Op>& ops);

struct AttributedOps {
  std::vector<MeasuredOp> ops;   // ops [first, first + count) with their device busy seconds
  int ops_without_activity = 0;  // ops whose range holds no record (measured 0)
  double unattributed_s = 0;     // busy time of records issued outside every op range
  double attributed_s = 0;       // sum of the ops' busy times
};

// Device busy time of observed ops [first, first + count) from `records` (one flush covering them; records
// of other ops are ignored, those outside any range are summed into unattributed_s). Throws
// std::out_of_range when the slice exceeds the observed ops.
AttributedOps attribute_records(const OpRangeObserver& observer, const std::vector<TraceRecord>& records,
                                std::size_t first, std::size_t count);

}  // namespace megatune::profiler
