// InterruptGuard: a handler that only records the signal, installed for SIGINT, SIGTERM and SIGHUP.
#include "executor/parallel/interrupt_guard.h"

#include <cstring>

namespace megatune::executor {
namespace {

constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
volatile sig_atomic_t noted_signal = 0;

void note_signal(int signal) { noted_signal = signal; }

}  // namespace

InterruptGuard::InterruptGuard() {
  noted_signal = 0;
  struct sigaction action {};
  action.sa_handler = note_signal;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &action, &previous_[i]);
}

InterruptGuard::~InterruptGuard() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &previous_[i], nullptr);
}

int InterruptGuard::signal() const { return noted_signal; }

Interrupted::Interrupted(int signal, const std::string& what_was_done)
    : UserError(std::string("interrupted by signal ") + strsignal(signal) + ": " + what_was_done),
      signal_(signal) {}

}  // namespace megatune::executor
