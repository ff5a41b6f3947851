// Tests of the discrete-event replay: streams, group synchronization, p2p matching, deadlock detection.
#include "planner/event_engine.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace megatune::planner {
namespace {

SimTask compute(double s) { return SimTask{TaskKind::kCompute, s}; }
SimTask collective(int group, double s, bool async = false) {
  SimTask t{async ? TaskKind::kAsyncCollective : TaskKind::kCollective, s};
  t.group = group;
  return t;
}
SimTask send(int peer, std::int64_t tag, double s) {
  SimTask t{TaskKind::kSend, s};
  t.peer = peer;
  t.tag = tag;
  return t;
}
SimTask recv(int peer, std::int64_t tag) {
  SimTask t{TaskKind::kRecv, 0.0};
  t.peer = peer;
  t.tag = tag;
  return t;
}

TEST(EventEngine, CollectiveStartsWhenTheLastMemberArrives) {
  EngineInput in;
  in.programs = {{compute(1.0), collective(0, 0.5), compute(1.0)}, {compute(3.0), collective(0, 0.5)}};
  in.group_member_count = {2};
  in.record_timeline = true;
  EngineResult r = replay(in);
  EXPECT_DOUBLE_EQ(r.ranks[0].timeline[1].start_s, 3.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].timeline[1].end_s, 3.5);
  EXPECT_DOUBLE_EQ(r.ranks[0].finish_s, 4.5);
  EXPECT_DOUBLE_EQ(r.ranks[1].finish_s, 3.5);
  EXPECT_DOUBLE_EQ(r.step_time_s, 4.5);
  EXPECT_DOUBLE_EQ(r.ranks[0].pipeline_wait_s, 2.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].exposed_comm_s, 0.5);
}

TEST(EventEngine, RecvCompletesAfterTheMatchingSend) {
  EngineInput in;
  // Rank 1 posts its recv early; the send (tag 7) leaves rank 0 at t=2 and takes 0.25 s.
  in.programs = {{compute(2.0), send(1, 7, 0.25)}, {recv(0, 7), compute(1.0)}};
  in.record_timeline = true;
  EngineResult r = replay(in);
  EXPECT_DOUBLE_EQ(r.ranks[1].timeline[1].start_s, 2.25);
  EXPECT_DOUBLE_EQ(r.ranks[1].finish_s, 3.25);
  EXPECT_DOUBLE_EQ(r.ranks[1].exposed_comm_s, 0.25);
  EXPECT_DOUBLE_EQ(r.ranks[1].pipeline_wait_s, 2.0);
}

TEST(EventEngine, TagsMatchOutOfOrderTransfers) {
  EngineInput in;
  in.programs = {{send(1, 1, 0.0), compute(1.0), send(1, 2, 0.0)}, {recv(0, 2), recv(0, 1)}};
  EngineResult r = replay(in);
  EXPECT_DOUBLE_EQ(r.ranks[1].finish_s, 1.0);
}

TEST(EventEngine, AsyncCollectivesOverlapComputeAndQueueOnTheCommStream) {
  EngineInput in;
  SimTask wait{TaskKind::kWaitComm};
  in.programs = {{collective(0, 2.0, true), collective(0, 2.0, true), compute(1.0), wait}};
  in.group_member_count = {1};
  in.record_timeline = true;
  EngineResult r = replay(in);
  EXPECT_DOUBLE_EQ(r.ranks[0].timeline[1].start_s, 2.0);  // second waits for the first on the comm stream
  EXPECT_DOUBLE_EQ(r.step_time_s, 4.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].exposed_comm_s, 3.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].async_comm_busy_s, 4.0);
}

TEST(EventEngine, AsyncCollectivesOfDifferentStreamsOverlapEachOther) {
  // Two groups' buckets, each on its own stream: the second does not queue behind the first; two buckets
  // of one stream still do.
  EngineInput in;
  SimTask wait{TaskKind::kWaitComm};
  SimTask other = collective(1, 2.0, true);
  other.stream = 3;
  in.programs = {{collective(0, 2.0, true), other, collective(0, 1.0, true), compute(1.0), wait}};
  in.group_member_count = {1, 1};
  in.record_timeline = true;
  EngineResult r = replay(in);
  EXPECT_DOUBLE_EQ(r.ranks[0].timeline[1].start_s, 0.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].timeline[2].start_s, 2.0);  // behind the first, on stream 0
  EXPECT_DOUBLE_EQ(r.ranks[0].timeline[4].end_s, 3.0);    // the wait covers both streams
  EXPECT_DOUBLE_EQ(r.step_time_s, 3.0);
  EXPECT_DOUBLE_EQ(r.ranks[0].async_comm_busy_s, 5.0);
}

TEST(EventEngine, MissingSendIsReportedAsDeadlock) {
  EngineInput in;
  in.programs = {{compute(1.0)}, {recv(0, 3)}};
  try {
    replay(in);
    FAIL() << "expected a deadlock error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

TEST(EventEngine, InconsistentCollectiveOrderDeadlocks) {
  EngineInput in;
  in.programs = {{collective(0, 1.0), collective(1, 1.0)}, {collective(1, 1.0), collective(0, 1.0)}};
  in.group_member_count = {2, 2};
  EXPECT_THROW(replay(in), std::runtime_error);
}

}  // namespace
}  // namespace megatune::planner
