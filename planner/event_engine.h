// Discrete-event replay of per-rank task lists: a compute stream, a communication stream per process group
// (asynchronous collectives queue on theirs, in issue order) and a p2p stream per rank; group collectives
// start when every member arrives, a recv completes after its send.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace megatune::planner {

enum class TaskKind : std::uint8_t {
  kCompute,          // runs on the compute stream for `duration_s`
  kCollective,       // blocking collective (TP/CP/EP, embedding): the compute stream waits for it
  kAsyncCollective,  // collective on the rank's `stream` (DP buckets): the compute stream goes on
  kSend,             // p2p send on the p2p stream; never blocks the compute stream
  kRecv,             // blocks the compute stream until the matching send (same src, dst, tag) arrived
  kWaitComm,  // blocks the compute stream until every async collective of this rank (any stream) finished
};

// What a communication task moves, for the breakdown of exposed communication: tensor (and expert tensor)
// parallel, context parallel, expert dispatch, pipeline p2p, data-parallel gradient reduction and parameter
// gathers, the rest (tied embedding, grad norm).
enum class CommCategory : std::uint8_t { kTensor, kContext, kExpert, kPipeline, kData, kOther };
inline constexpr int kCommCategoryCount = 6;
const char* comm_category_name(CommCategory category);  // "TP", "CP", "EP", "PP", "DP", "other"

struct SimTask {
  TaskKind kind = TaskKind::kCompute;
  double duration_s = 0.0;  // compute/collective time; for kSend the transfer time; unused for kRecv
  int group = -1;           // kCollective / kAsyncCollective: engine-wide group instance id
  // kAsyncCollective: the rank's communication stream it queues on (a small id, the same on every member:
  // the simulator's is the op's layouts::Op::stream); async collectives of one stream run one after another,
  // those of different streams overlap.
  int stream = 0;
  int peer = -1;         // kSend: destination rank index; kRecv: source rank index
  std::int64_t tag = 0;  // kSend / kRecv: identifies the transfer on the (src, dst) channel
  int op_index = -1;     // caller's annotation (index into its op list), carried into the timeline
  CommCategory category = CommCategory::kOther;  // collectives: what they move (recv: pipeline, waits: data)
};

struct EngineInput {
  std::vector<std::vector<SimTask>> programs;  // one ordered task list per simulated rank
  std::vector<int> group_member_count;         // per group id: how many simulated ranks take part
  bool record_timeline = false;
};

struct TaskTiming {
  double start_s = 0.0;
  double end_s = 0.0;
};

struct RankReplay {
  double finish_s = 0.0;        // when the rank's last task (any stream) finished
  double compute_busy_s = 0.0;  // sum of kCompute durations
  double exposed_comm_s = 0.0;  // compute stream stalled on communication itself
  std::array<double, kCommCategoryCount> exposed_by_category{};  // the same, by what it moved
  double pipeline_wait_s = 0.0;      // compute stream stalled on other ranks (bubble, skew)
  double async_comm_busy_s = 0.0;    // time the comm streams were busy (summed over streams)
  std::vector<TaskTiming> timeline;  // per task, when recorded
};

struct EngineResult {
  std::vector<RankReplay> ranks;
  double step_time_s = 0.0;  // max finish over ranks
};

// Replays the programs; throws std::runtime_error naming the stuck ranks when the programs deadlock
// (a recv without its send, collectives issued in inconsistent orders, a group that never fills).
EngineResult replay(const EngineInput& input);

}  // namespace megatune::planner
