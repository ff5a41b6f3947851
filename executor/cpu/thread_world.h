// ThreadWorld: the shared state of N ranks living as threads of one process (collective rendezvous per
// group, point-to-point mailboxes, abort, timeouts), and run_thread_ranks, which runs a body on N threads.
// ThreadCommunicator (thread_communicator.h) moves the data; this file only synchronizes.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "layouts/op.h"

namespace megatune::executor {

class ThreadWorld {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{300'000};
  // Every blocking wait (a collective's rendezvous, a receive) gives up after `timeout` and aborts the
  // world with a message naming the group and the ranks that did not arrive.
  explicit ThreadWorld(int world_size, std::chrono::milliseconds timeout = kDefaultTimeout);
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;
  ~ThreadWorld();

  int size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Ends the job: every rank blocked in a collective or receive, and every later call, throws
  // std::runtime_error(message). The first message wins; safe from any thread, more than once.
  void abort(const std::string& message);
  bool aborted() const;
  std::string abort_message() const;  // empty while not aborted
  // A rank's thread is done (returned or threw): a wait on it fails at once instead of timing out.
  void mark_finished(int rank);
  bool any_finished() const;

  // ---- for ThreadCommunicator.
  // One member's part in a collective: what it issued and where its input lives (float storage).
  struct Contribution {
    std::string op;                   // "all_reduce sum", "all_gather", ... (must agree across members)
    std::int64_t input_elements = 0;  // must agree across members
    int root = -1;                    // broadcast root (group rank)
    const float* input = nullptr;
  };
  struct Group;  // one communicator: a CommGroup's members, rendezvous state
  // The shared state of the group `members` (global ranks, group order) of kind `kind`; every member gets
  // the same object.
  Group& group(layouts::CommGroup kind, const std::vector<int>& members);
  // Publishes this member's contribution and blocks until every member has; checks that they issued the
  // same collective (else aborts naming both). The returned contributions stay valid until depart().
  const std::vector<Contribution>& arrive(Group& group, int member, Contribution mine);
  // Blocks until every member is done reading the others' inputs.
  void depart(Group& group, int member);
  // Point-to-point: FIFO mailboxes per (group, source, destination). post() never blocks; take() blocks
  // until the next message from `source` arrives.
  void post(layouts::CommGroup kind, int source, int destination, std::vector<float> data);
  std::vector<float> take(layouts::CommGroup kind, int source, int destination);
  // Aborts the world with `message` and throws it.
  [[noreturn]] void fail(const std::string& message);

 private:
  using Lock = std::unique_lock<std::mutex>;
  void barrier(Lock& lock, Group& group, int member);
  [[noreturn]] void fail_locked(Lock& lock, const std::string& message);
  void throw_if_aborted() const;  // caller holds the lock
  std::chrono::steady_clock::time_point deadline() const;
  std::string timeout_text() const;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;  // guards everything below; one condition variable wakes every waiter
  std::condition_variable changed_;
  bool aborted_ = false;
  std::string abort_message_;
  std::vector<char> finished_;
  std::map<std::pair<int, std::vector<int>>, std::unique_ptr<Group>> groups_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<float>>> mailboxes_;
};

// Runs body(rank, world) on world.size() threads and joins them all. When a rank throws, the world is
// aborted with "rank <r>: <what>" (so the others' waits end at once) and, after every thread has joined,
// one std::runtime_error carrying the abort message (the first failure) is thrown. A world serves one run.
void run_thread_ranks(ThreadWorld& world, const std::function<void(int rank, ThreadWorld& world)>& body);
void run_thread_ranks(int world_size, const std::function<void(int rank, ThreadWorld& world)>& body,
                      std::chrono::milliseconds timeout = ThreadWorld::kDefaultTimeout);

}  // namespace megatune::executor
