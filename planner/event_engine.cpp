// Discrete-event replay: ranks advance until they block; group instances and p2p channels release them.
#include "planner/event_engine.h"

#include <algorithm>
#include <deque>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

namespace megatune::planner {
namespace {

struct Arrival {
  int rank;
  double issue_s;
  std::size_t pc;  // the task's index in the rank's program
};

// One occurrence of a collective on a group: the k-th collective each member issues on the group.
struct Instance {
  std::vector<Arrival> arrivals;
  double duration_s = 0.0;
  bool async = false;
  bool resolved = false;
  double end_s = 0.0;
};

enum class Block : std::uint8_t { kNone, kCollective, kRecv, kWaitComm, kDone };

// One communication stream of a rank: its unresolved async collectives (group, seq) in issue order, and
// when its last resolved one ends.
struct CommStream {
  std::deque<std::pair<int, int>> queue;
  double free_s = 0.0;
};

struct RankState {
  std::size_t pc = 0;
  double now_s = 0.0;  // compute stream time
  double p2p_free_s = 0.0;
  Block block = Block::kNone;
  long blocked_group = -1, blocked_seq = -1;
  std::int64_t blocked_key_hash = 0;
  std::vector<CommStream> streams;  // by SimTask::stream
  std::vector<int> next_seq;        // per group: sequence number of the next collective
  CommStream& stream(int id) {
    if (id < 0) throw std::runtime_error("simulation: async collective on stream " + std::to_string(id));
    if (static_cast<int>(streams.size()) <= id) streams.resize(static_cast<std::size_t>(id) + 1);
    return streams[static_cast<std::size_t>(id)];
  }
  std::size_t async_pending() const {
    std::size_t n = 0;
    for (const CommStream& c : streams) n += c.queue.size();
    return n;
  }
  double comm_free_s() const {
    double t = 0.0;
    for (const CommStream& c : streams) t = std::max(t, c.free_s);
    return t;
  }
};

struct ChannelKey {
  int src, dst;
  std::int64_t tag;
  bool operator==(const ChannelKey&) const = default;
};
struct ChannelKeyHash {
  std::size_t operator()(const ChannelKey& k) const {
    std::size_t h = std::hash<std::int64_t>()(k.tag);
    h ^= (static_cast<std::size_t>(k.src) * 0x9E3779B97F4A7C15ull) + (h << 6) + (h >> 2);
    h ^= (static_cast<std::size_t>(k.dst) * 0xC2B2AE3D27D4EB4Full) + (h << 6) + (h >> 2);
    return h;
  }
};
struct SendRecord {
  double arrive_s;  // transfer end
  double duration_s;
};

class Replayer {
 public:
  explicit Replayer(const EngineInput& input) : in_(input), states_(input.programs.size()) {
    for (RankState& s : states_) s.next_seq.assign(input.group_member_count.size(), 0);
    result_.ranks.resize(input.programs.size());
    groups_.resize(input.group_member_count.size());
    if (input.record_timeline) {
      for (std::size_t r = 0; r < input.programs.size(); ++r)
        result_.ranks[r].timeline.resize(input.programs[r].size());
    }
  }

  EngineResult run() {
    std::vector<int> runnable;
    for (int r = static_cast<int>(states_.size()) - 1; r >= 0; --r) runnable.push_back(r);
    while (!runnable.empty()) {
      int r = runnable.back();
      runnable.pop_back();
      advance(r, runnable);
    }
    std::ostringstream stuck;
    int stuck_count = 0;
    for (std::size_t r = 0; r < states_.size(); ++r) {
      if (states_[r].block != Block::kDone) {
        if (stuck_count++ < 8) describe_stuck(static_cast<int>(r), stuck);
      }
    }
    if (stuck_count > 0) {
      throw std::runtime_error("simulation deadlock: " + std::to_string(stuck_count) + " rank(s) stuck; " +
                               stuck.str());
    }
    for (std::size_t r = 0; r < states_.size(); ++r) {
      RankReplay& rr = result_.ranks[r];
      rr.finish_s = std::max({states_[r].now_s, states_[r].comm_free_s(), states_[r].p2p_free_s});
      result_.step_time_s = std::max(result_.step_time_s, rr.finish_s);
    }
    return std::move(result_);
  }

 private:
  void describe_stuck(int r, std::ostringstream& out) {
    const RankState& s = states_[r];
    out << "rank " << r << " at task " << s.pc;
    switch (s.block) {
      case Block::kCollective:
        out << " (collective on group " << s.blocked_group << " #" << s.blocked_seq << ")";
        break;
      case Block::kRecv:
        out << " (recv from " << in_.programs[r][s.pc].peer << " tag " << in_.programs[r][s.pc].tag << ")";
        break;
      case Block::kWaitComm:
        out << " (waiting for " << s.async_pending() << " async collectives)";
        break;
      default:
        break;
    }
    out << "; ";
  }

  Instance& instance(int group, int seq) {
    if (group < 0 || group >= static_cast<int>(groups_.size())) {
      throw std::runtime_error("simulation: task names group " + std::to_string(group) + " outside 0.." +
                               std::to_string(groups_.size()));
    }
    auto& list = groups_[group];
    if (static_cast<int>(list.size()) <= seq) list.resize(seq + 1);
    return list[seq];
  }

  static void expose(RankReplay& rr, CommCategory category, double seconds) {
    rr.exposed_comm_s += seconds;
    rr.exposed_by_category[static_cast<int>(category)] += seconds;
  }

  void record(int r, std::size_t pc, double start, double end) {
    if (in_.record_timeline) result_.ranks[r].timeline[pc] = {start, end};
  }

  // Runs rank r until it blocks or finishes; wakes ranks that its progress releases.
  void advance(int r, std::vector<int>& runnable) {
    RankState& s = states_[r];
    const auto& program = in_.programs[r];
    RankReplay& rr = result_.ranks[r];
    if (s.block == Block::kDone) return;
    s.block = Block::kNone;
    while (s.pc < program.size()) {
      const SimTask& t = program[s.pc];
      switch (t.kind) {
        case TaskKind::kCompute:
          record(r, s.pc, s.now_s, s.now_s + t.duration_s);
          s.now_s += t.duration_s;
          rr.compute_busy_s += t.duration_s;
          break;
        case TaskKind::kCollective:
        case TaskKind::kAsyncCollective: {
          const bool async = t.kind == TaskKind::kAsyncCollective;
          if (!async && t.group >= 0 && t.group < static_cast<int>(in_.group_member_count.size()) &&
              in_.group_member_count[t.group] == 1) {
            // A group of one simulated rank: no one to wait for.
            record(r, s.pc, s.now_s, s.now_s + t.duration_s);
            s.now_s += t.duration_s;
            expose(rr, t.category, t.duration_s);
            break;
          }
          if (t.group < 0 || t.group >= static_cast<int>(s.next_seq.size())) {
            throw std::runtime_error("simulation: task names group " + std::to_string(t.group) +
                                     " outside 0.." + std::to_string(s.next_seq.size()));
          }
          int seq = s.next_seq[t.group]++;
          Instance& inst = instance(t.group, seq);
          inst.async = async;
          inst.duration_s = std::max(inst.duration_s, t.duration_s);
          inst.arrivals.push_back({r, s.now_s, s.pc});
          if (async) s.stream(t.stream).queue.push_back({t.group, seq});
          if (static_cast<int>(inst.arrivals.size()) > in_.group_member_count[t.group]) {
            throw std::runtime_error("simulation: group " + std::to_string(t.group) +
                                     " got more members than " +
                                     std::to_string(in_.group_member_count[t.group]));
          }
          if (!async) {
            if (static_cast<int>(inst.arrivals.size()) == in_.group_member_count[t.group]) {
              resolve_blocking(t.group, seq, runnable, r);
            } else {
              s.block = Block::kCollective;
              s.blocked_group = t.group;
              s.blocked_seq = seq;
              return;
            }
          } else {
            record(r, s.pc, s.now_s, s.now_s);  // overwritten when resolved
            try_resolve_async(t.group, seq, runnable);
          }
          break;
        }
        case TaskKind::kSend: {
          double start = std::max(s.now_s, s.p2p_free_s);
          double end = start + t.duration_s;
          s.p2p_free_s = end;
          record(r, s.pc, start, end);
          ChannelKey key{r, t.peer, t.tag};
          if (!sends_.emplace(key, SendRecord{end, t.duration_s}).second) {
            throw std::runtime_error("simulation: rank " + std::to_string(r) + " sends tag " +
                                     std::to_string(t.tag) + " to rank " + std::to_string(t.peer) + " twice");
          }
          if (t.peer >= 0 && t.peer < static_cast<int>(states_.size())) {
            RankState& d = states_[t.peer];
            if (d.block == Block::kRecv) {
              const SimTask& pending = in_.programs[t.peer][d.pc];
              if (pending.peer == r && pending.tag == t.tag) {
                d.block = Block::kNone;
                runnable.push_back(t.peer);
              }
            }
          }
          break;
        }
        case TaskKind::kRecv: {
          auto it = sends_.find(ChannelKey{t.peer, r, t.tag});
          if (it == sends_.end()) {
            s.block = Block::kRecv;
            return;
          }
          double wait = std::max(0.0, it->second.arrive_s - s.now_s);
          double comm_part = std::min(wait, it->second.duration_s);
          expose(rr, CommCategory::kPipeline, comm_part);
          rr.pipeline_wait_s += wait - comm_part;
          record(r, s.pc, s.now_s, s.now_s + wait);
          s.now_s += wait;
          sends_.erase(it);
          break;
        }
        case TaskKind::kWaitComm: {
          if (s.async_pending() > 0) {
            s.block = Block::kWaitComm;
            return;
          }
          double wait = std::max(0.0, s.comm_free_s() - s.now_s);
          expose(rr, CommCategory::kData, wait);  // the overlapped gradient reductions and gathers
          record(r, s.pc, s.now_s, s.now_s + wait);
          s.now_s += wait;
          break;
        }
      }
      ++s.pc;
    }
    if (s.async_pending() > 0) {
      s.block = Block::kWaitComm;  // finished its program; async work still to resolve
      return;
    }
    s.block = Block::kDone;
  }

  void resolve_blocking(int group, int seq, std::vector<int>& runnable, int current) {
    Instance& inst = instance(group, seq);
    double start = 0.0;
    for (const Arrival& a : inst.arrivals) start = std::max(start, a.issue_s);
    double end = start + inst.duration_s;
    inst.resolved = true;
    inst.end_s = end;
    for (const Arrival& a : inst.arrivals) {
      RankState& m = states_[a.rank];
      RankReplay& rr = result_.ranks[a.rank];
      expose(rr, in_.programs[a.rank][a.pc].category, inst.duration_s);
      rr.pipeline_wait_s += start - a.issue_s;
      record(a.rank, a.pc, start, end);
      m.now_s = end;
      if (a.rank != current) {
        ++m.pc;  // the blocked member moves past its collective
        m.block = Block::kNone;
        runnable.push_back(a.rank);
      }
    }
  }

  // The stream member `a` queued its async collective on.
  CommStream& stream_of(const Arrival& a) {
    return states_[a.rank].stream(in_.programs[a.rank][a.pc].stream);
  }

  // Resolves async instances that are full and at the head of every member's queue of its stream.
  void try_resolve_async(int group, int seq, std::vector<int>& runnable) {
    std::vector<std::pair<int, int>> work{{group, seq}};
    while (!work.empty()) {
      auto [g, q] = work.back();
      work.pop_back();
      Instance& inst = instance(g, q);
      if (inst.resolved || static_cast<int>(inst.arrivals.size()) < in_.group_member_count[g]) continue;
      bool at_head = true;
      for (const Arrival& a : inst.arrivals) {
        const auto& queue = stream_of(a).queue;
        if (queue.empty() || queue.front() != std::make_pair(g, q)) at_head = false;
      }
      if (!at_head) continue;
      double start = 0.0;
      for (const Arrival& a : inst.arrivals) start = std::max({start, a.issue_s, stream_of(a).free_s});
      double end = start + inst.duration_s;
      inst.resolved = true;
      inst.end_s = end;
      for (const Arrival& a : inst.arrivals) {
        RankState& m = states_[a.rank];
        CommStream& c = stream_of(a);
        c.free_s = end;
        result_.ranks[a.rank].async_comm_busy_s += inst.duration_s;
        c.queue.pop_front();
        record(a.rank, a.pc, start, end);
        if (!c.queue.empty()) work.push_back(c.queue.front());
        if (m.block == Block::kWaitComm && m.async_pending() == 0) {
          m.block = Block::kNone;
          runnable.push_back(a.rank);
        }
      }
    }
  }

  const EngineInput& in_;
  std::vector<RankState> states_;
  std::vector<std::vector<Instance>> groups_;
  std::unordered_map<ChannelKey, SendRecord, ChannelKeyHash> sends_;
  EngineResult result_;
};

}  // namespace

EngineResult replay(const EngineInput& input) { return Replayer(input).run(); }

const char* comm_category_name(CommCategory category) {
  switch (category) {
    case CommCategory::kTensor:
      return "TP";
    case CommCategory::kContext:
      return "CP";
    case CommCategory::kExpert:
      return "EP";
    case CommCategory::kPipeline:
      return "PP";
    case CommCategory::kData:
      return "DP";
    case CommCategory::kOther:
      return "other";
  }
  return "other";
}

}  // namespace megatune::planner
