// RecordingPause: op recording and op timing off (restored at scope exit) for bookkeeping work the step
// program does not hold.
#pragma once
#include "executor/backend/backend.h"

namespace megatune::executor {

// Recording and op timing off for bookkeeping collectives the step program does not hold (the logged loss).
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

 private:
  Backend& backend_;
  bool was_, timing_;
};

}  // namespace megatune::executor
