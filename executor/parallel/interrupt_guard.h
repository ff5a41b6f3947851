// InterruptGuard: while it lives, SIGINT, SIGTERM and SIGHUP do not end the process but are noted, so that a
// process running children (the --nproc launcher, `plan --measure-top`) can end them before it ends itself;
// the previous dispositions come back at destruction. One guard at a time per process. Interrupted: the
// error such a process ends with once its children are gone (the CLI exits 128 + the signal).
#pragma once
#include <signal.h>

#include <string>

#include "base/user_error.h"

namespace megatune::executor {

class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  int signal() const;  // the signal that arrived last while the guard lived; 0 when none

 private:
  struct sigaction previous_[3] = {};
};

class Interrupted : public UserError {
 public:
  // "interrupted by signal Terminated: <what was done>"
  Interrupted(int signal, const std::string& what_was_done);
  int signal() const { return signal_; }

 private:
  int signal_;
};

}  // namespace megatune::executor
