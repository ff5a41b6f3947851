// ThreadWorld: generation-counting barriers per group, FIFO mailboxes, abort and timeouts under one mutex;
// run_thread_ranks.
#include "executor/cpu/thread_world.h"

#include <exception>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace megatune::executor {

using layouts::CommGroup;

struct ThreadWorld::Group {
  CommGroup kind = CommGroup::kNone;
  std::vector<int> members;
  std::int64_t generation = 0;  // barriers passed
  int arrived_count = 0;
  std::vector<char> arrived;  // per member, in the current barrier
  std::vector<Contribution> slots;
  std::string phase;  // what the current barrier waits for (for messages)
};

namespace {

std::string spaced_rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : " ") + std::to_string(r);
  return s;
}

std::string group_text(const ThreadWorld::Group& g) {
  return std::string("group ") + layouts::comm_group_name(g.kind) + " (ranks " + spaced_rank_list(g.members) + ")";
}

std::string describe(const ThreadWorld::Contribution& c) {
  std::string s = c.op + " of " + std::to_string(c.input_elements) + " elements";
  if (c.root >= 0) s += " from member " + std::to_string(c.root);
  return s;
}

bool same_collective(const ThreadWorld::Contribution& a, const ThreadWorld::Contribution& b) {
  return a.op == b.op && a.input_elements == b.input_elements && a.root == b.root;
}

}  // namespace

ThreadWorld::ThreadWorld(int world_size, std::chrono::milliseconds timeout)
    : world_size_(world_size), timeout_(timeout), finished_(world_size > 0 ? world_size : 0, 0) {
  if (world_size < 1) throw std::invalid_argument("ThreadWorld: world size must be at least 1");
  if (timeout.count() <= 0) throw std::invalid_argument("ThreadWorld: timeout must be positive");
}

ThreadWorld::~ThreadWorld() = default;

void ThreadWorld::abort(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    abort_message_ = message.empty() ? "aborted" : message;
  }
  changed_.notify_all();
}

bool ThreadWorld::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

std::string ThreadWorld::abort_message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_message_;
}

void ThreadWorld::mark_finished(int rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_.at(rank) = 1;
  }
  changed_.notify_all();
}

bool ThreadWorld::any_finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (char f : finished_)
    if (f) return true;
  return false;
}

void ThreadWorld::throw_if_aborted() const {
  if (aborted_) throw std::runtime_error(abort_message_);
}

void ThreadWorld::fail(const std::string& message) {
  Lock lock(mutex_);
  fail_locked(lock, message);
}

void ThreadWorld::fail_locked(Lock& lock, const std::string& message) {
  if (!aborted_) {
    aborted_ = true;
    abort_message_ = message;
  }
  const std::string what = abort_message_;
  lock.unlock();
  changed_.notify_all();
  throw std::runtime_error(what);
}

std::chrono::steady_clock::time_point ThreadWorld::deadline() const {
  return std::chrono::steady_clock::now() + timeout_;
}

std::string ThreadWorld::timeout_text() const {
  std::ostringstream s;
  s << "timed out after " << std::chrono::duration<double>(timeout_).count() << " s";
  return s.str();
}

ThreadWorld::Group& ThreadWorld::group(CommGroup kind, const std::vector<int>& members) {
  Lock lock(mutex_);
  std::unique_ptr<Group>& g = groups_[{static_cast<int>(kind), members}];
  if (!g) {
    g = std::make_unique<Group>();
    g->kind = kind;
    g->members = members;
    g->arrived.assign(members.size(), 0);
    g->slots.resize(members.size());
  }
  return *g;
}

// Generation-counting barrier: the last member to arrive opens it; the others wait for the generation to
// move on, for an abort, for a member that finished without arriving, or for the timeout.
void ThreadWorld::barrier(Lock& lock, Group& g, int member) {
  throw_if_aborted();
  const std::int64_t generation = g.generation;
  g.arrived[member] = 1;
  if (++g.arrived_count == static_cast<int>(g.members.size())) {
    g.arrived_count = 0;
    g.arrived.assign(g.members.size(), 0);
    ++g.generation;
    changed_.notify_all();
    return;
  }
  const auto until = deadline();
  while (g.generation == generation) {
    throw_if_aborted();
    std::vector<int> missing, gone;
    for (std::size_t i = 0; i < g.members.size(); ++i)
      if (!g.arrived[i]) {
        missing.push_back(g.members[i]);
        if (finished_[g.members[i]]) gone.push_back(g.members[i]);
      }
    if (!gone.empty())
      fail_locked(lock, "rank " + spaced_rank_list(gone) + " finished without joining " + g.phase + " over " +
                            group_text(g));
    if (changed_.wait_until(lock, until) == std::cv_status::timeout && g.generation == generation)
      fail_locked(lock, timeout_text() + " in " + g.phase + " over " + group_text(g) + ": rank" +
                            (missing.size() > 1 ? "s " : " ") + spaced_rank_list(missing) + " did not arrive");
  }
}

const std::vector<ThreadWorld::Contribution>& ThreadWorld::arrive(Group& g, int member, Contribution mine) {
  Lock lock(mutex_);
  throw_if_aborted();
  if (g.arrived_count == 0) g.phase = mine.op;
  g.slots[member] = std::move(mine);
  barrier(lock, g, member);
  for (std::size_t i = 1; i < g.slots.size(); ++i)
    if (!same_collective(g.slots[0], g.slots[i]))
      fail_locked(lock, group_text(g) + ": rank " + std::to_string(g.members[0]) + " issued " +
                            describe(g.slots[0]) + ", rank " + std::to_string(g.members[i]) + " issued " +
                            describe(g.slots[i]));
  return g.slots;
}

void ThreadWorld::depart(Group& g, int member) {
  Lock lock(mutex_);
  barrier(lock, g, member);
}

void ThreadWorld::post(CommGroup kind, int source, int destination, std::vector<float> data) {
  {
    Lock lock(mutex_);
    throw_if_aborted();
    mailboxes_[{static_cast<int>(kind), source, destination}].push_back(std::move(data));
  }
  changed_.notify_all();
}

std::vector<float> ThreadWorld::take(CommGroup kind, int source, int destination) {
  Lock lock(mutex_);
  std::deque<std::vector<float>>& box = mailboxes_[{static_cast<int>(kind), source, destination}];
  const auto until = deadline();
  const std::string what = "rank " + std::to_string(destination) + " waiting in batch_p2p over group " +
                           layouts::comm_group_name(kind) + " for a message from rank " +
                           std::to_string(source);
  while (box.empty()) {
    throw_if_aborted();
    if (finished_.at(source)) fail_locked(lock, what + ": rank " + std::to_string(source) + " finished");
    if (changed_.wait_until(lock, until) == std::cv_status::timeout && box.empty())
      fail_locked(lock, timeout_text() + ": " + what + " that never came");
  }
  throw_if_aborted();
  std::vector<float> data = std::move(box.front());
  box.pop_front();
  return data;
}

void run_thread_ranks(ThreadWorld& world, const std::function<void(int, ThreadWorld&)>& body) {
  if (world.any_finished()) throw std::logic_error("run_thread_ranks: a ThreadWorld serves one run");
  std::vector<std::thread> threads;
  threads.reserve(world.size());
  auto run_rank = [&world, &body](int rank) {
    try {
      body(rank, world);
    } catch (const std::exception& e) {
      world.abort("rank " + std::to_string(rank) + ": " + e.what());
    } catch (...) {
      world.abort("rank " + std::to_string(rank) + ": unknown exception");
    }
    world.mark_finished(rank);
  };
  try {
    for (int r = 0; r < world.size(); ++r) threads.emplace_back(run_rank, r);
  } catch (const std::exception& e) {  // could not start a thread: end the ones that run
    world.abort(std::string("could not start the rank threads: ") + e.what());
  }
  for (std::thread& t : threads) t.join();
  if (world.aborted()) throw std::runtime_error(world.abort_message());
}

void run_thread_ranks(int world_size, const std::function<void(int, ThreadWorld&)>& body,
                      std::chrono::milliseconds timeout) {
  ThreadWorld world(world_size, timeout);
  run_thread_ranks(world, body);
}

}  // namespace megatune::executor
