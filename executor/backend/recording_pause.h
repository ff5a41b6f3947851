// RecordingPause: op recording and per-op timing off for a scope, for work the step program does not hold
// (bookkeeping reductions of the logged loss, evaluation passes).
#pragma once
#include "executor/backend/backend.h"

namespace megatune::executor {

class RecordingPause {
 public:
  explicit RecordingPause(Backend& backend)
      : backend_(backend), was_(backend.recorder().enabled()), timing_(backend.op_timing()) {
    backend_.recorder().set_enabled(false);
    backend_.set_op_timing(false);
  }
  ~RecordingPause() {
    backend_.recorder().set_enabled(was_);
    backend_.set_op_timing(timing_);
  }
  RecordingPause(const RecordingPause&) = delete;
  RecordingPause& operator=(const RecordingPause&) = delete;

 private:
  Backend& backend_;
  bool was_, timing_;
};

}  // namespace megatune::executor
