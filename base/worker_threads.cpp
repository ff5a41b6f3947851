// Capped thread counts and a pool that survives failed thread starts.
#include "base/worker_threads.h"

#include <algorithm>
#include <new>
#include <system_error>

#include "base/user_error.h"

namespace megatune {

int max_worker_threads() {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<int>(std::min(1024u, 4 * cores));
}

int resolve_thread_count(long long requested, const std::string& flag, bool* capped) {
  if (capped != nullptr) *capped = false;
  if (requested < 0) {
    throw UserError(flag + " " + std::to_string(requested) +
                    " is negative; give a thread count >= 1, or 0 "
                    "for all cores");
  }
  if (requested == 0) return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (requested > max_worker_threads()) {
    if (capped != nullptr) *capped = true;
    return max_worker_threads();
  }
  return static_cast<int>(requested);
}

WorkerThreads::WorkerThreads(int extra, const std::function<void()>& work) {
  threads_.reserve(static_cast<std::size_t>(std::clamp(extra, 0, max_worker_threads())));
  for (int t = 0; t < extra; ++t) {
    try {
      threads_.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // the ones started do the work
    } catch (const std::bad_alloc&) {
      break;
    }
  }
}

WorkerThreads::~WorkerThreads() { join(); }

void WorkerThreads::join() {
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

}  // namespace megatune
