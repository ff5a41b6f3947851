// Worker threads that cannot take the process down: a requested thread count is resolved and capped, and
// a pool whose thread starts fail (too many threads, no memory) keeps the ones it started and joins them
// in its destructor, so an exception never unwinds a vector of joinable std::threads (std::terminate).
#pragma once
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace megatune {

// Most threads any megatune pool starts: a few per core is already past the point of speed-up.
int max_worker_threads();

// `requested` 0 means all cores; a negative count is a UserError naming `flag`; a count above
// max_worker_threads() is capped to it (*capped set true when given).
int resolve_thread_count(long long requested, const std::string& flag, bool* capped = nullptr);

// Runs `work` on up to `extra` additional threads (the caller usually runs it too). A thread that cannot
// be started ends the starting (the work must tolerate fewer workers, as work-stealing loops do).
class WorkerThreads {
 public:
  WorkerThreads(int extra, const std::function<void()>& work);
  ~WorkerThreads();  // joins
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;
  int started() const { return static_cast<int>(threads_.size()); }
  void join();

 private:
  std::vector<std::thread> threads_;
};

}  // namespace megatune
