// ThreadCommunicator and run_thread_ranks: every collective over the groups of a tp2 pp2 dp2 rank grid (both
// rank orders) checked exactly, bit-reproducible reductions, bf16 rounding of results, recorded ops,
// batched p2p that would deadlock unbuffered, and failures (a throwing rank, a missing rank, mismatched
// collectives, abort) that end every rank with one clear error within the timeout.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "executor/kernels/reference_elementwise.h"
#include "layouts/rank_grid.h"
#include "tests/executor/thread_rank_test_util.h"

namespace megatune::executor {
namespace {

using layouts::OpKind;
using layouts::OpPhase;
using layouts::RankGrid;
using layouts::RankOrder;
using std::chrono::milliseconds;

RankGrid grid_tp2_pp2_dp2(RankOrder order) { return RankGrid(8, 2, 1, 1, 2, 2, order); }

using Rank = TestRank;

// Value i of global rank r's contribution: distinct and exactly representable.
float value(int rank, std::int64_t i) { return static_cast<float>(rank * 1000 + i) * 0.25f; }
std::vector<float> values(int rank, std::int64_t n, std::int64_t first = 0) {
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = value(rank, first + i);
  return v;
}

const OpTag kTag{"test", -1, OpPhase::kForward};
constexpr CommGroup kGroups[] = {CommGroup::kTensor, CommGroup::kData, CommGroup::kDataContext,
                                 CommGroup::kPipeline, CommGroup::kWorld};

TEST(ProcessGroups, MembersAndIndicesFollowTheRankGrid) {
  for (RankOrder order : {RankOrder::kTpCpEpDpPp, RankOrder::kTpCpEpPpDp}) {
    const RankGrid grid = grid_tp2_pp2_dp2(order);
    for (int r = 0; r < 8; ++r) {
      const ProcessGroups groups(grid, r);
      EXPECT_EQ(groups.world_rank(), r);
      EXPECT_EQ(groups.size(CommGroup::kWorld), 8);
      EXPECT_EQ(groups.size(CommGroup::kNone), 1);
      for (CommGroup g : kGroups) {
        EXPECT_EQ(groups.members(g), grid.comm_group_members(r, g));
        EXPECT_EQ(groups.global_rank(g, groups.rank_in(g)), r);
      }
    }
  }
  const ProcessGroups groups(grid_tp2_pp2_dp2(RankOrder::kTpCpEpDpPp), 5);
  EXPECT_EQ(groups.members(CommGroup::kTensor), (std::vector<int>{4, 5}));
  EXPECT_EQ(groups.members(CommGroup::kData), (std::vector<int>{5, 7}));
  EXPECT_EQ(groups.members(CommGroup::kPipeline), (std::vector<int>{1, 5}));
  EXPECT_EQ(groups.index_of(CommGroup::kTensor, 0), -1);
  EXPECT_THROW(groups.global_rank(CommGroup::kTensor, 2), std::out_of_range);
  EXPECT_THROW(ProcessGroups(grid_tp2_pp2_dp2(RankOrder::kTpCpEpDpPp), 8), std::out_of_range);
}

// Runs body(rank) on the 8 ranks of grid, each with its Rank.
void run_grid(const RankGrid& grid, const std::function<void(Rank&)>& body, bool bf16 = false,
              milliseconds timeout = milliseconds(20'000)) {
  run_thread_ranks(
      grid.world_size(),
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world, bf16);
        body(rank);
      },
      timeout);
}

class EveryGroup : public ::testing::TestWithParam<RankOrder> {};

TEST_P(EveryGroup, CollectivesMoveTheExpectedData) {
  const RankGrid grid = grid_tp2_pp2_dp2(GetParam());
  constexpr std::int64_t kCols = 6;
  run_grid(grid, [&](Rank& rank) {
    const int me = rank.comm.world_rank();
    for (CommGroup g : kGroups) {
      SCOPED_TRACE(layouts::comm_group_name(g));
      const std::vector<int>& members = rank.comm.groups().members(g);
      const int n = static_cast<int>(members.size());
      const int index = rank.comm.rank(g);
      // all_reduce sum and max
      Tensor t = rank.make(2, kCols, values(me, 2 * kCols));
      rank.comm.all_reduce(g, t, ReduceOp::kSum, kTag);
      std::vector<float> sum(2 * kCols, 0.0f), max(2 * kCols, -1e30f);
      for (int m : members)
        for (std::int64_t i = 0; i < 2 * kCols; ++i) {
          sum[i] += value(m, i);
          max[i] = std::max(max[i], value(m, i));
        }
      EXPECT_EQ(rank.read(t), sum);
      rank.comm.all_reduce(g, t = rank.make(2, kCols, values(me, 2 * kCols)), ReduceOp::kMax, kTag);
      EXPECT_EQ(rank.read(t), max);
      // all_gather (out of place, then in place: the input is this member's block of the output)
      Tensor gathered = rank.make(n, kCols, {});
      rank.comm.all_gather(g, rank.make(1, kCols, values(me, kCols)), gathered, kTag);
      std::vector<float> expected;
      for (int m : members)
        for (float v : values(m, kCols)) expected.push_back(v);
      EXPECT_EQ(rank.read(gathered), expected);
      Tensor in_place = rank.make(n, kCols, std::vector<float>(n * kCols, -1.0f));
      Tensor block = in_place;
      block.data = static_cast<float*>(in_place.data) + index * kCols;
      block.rows = 1;
      rank.backend.upload(block, values(me, kCols).data());
      rank.comm.all_gather(g, block, in_place, kTag);
      EXPECT_EQ(rank.read(in_place), expected);
      // reduce_scatter: this member's row block of the sum
      Tensor scattered = rank.make(1, kCols, {});
      rank.comm.reduce_scatter(g, rank.make(n, kCols, values(me, n * kCols)), scattered, kTag);
      std::vector<float> slice(kCols, 0.0f);
      for (int m : members)
        for (std::int64_t i = 0; i < kCols; ++i) slice[i] += value(m, index * kCols + i);
      EXPECT_EQ(rank.read(scattered), slice);
      // broadcast from member n - 1
      Tensor b = rank.make(1, kCols, values(me, kCols));
      rank.comm.broadcast(g, b, n - 1, kTag);
      EXPECT_EQ(rank.read(b), values(members.back(), kCols));
      // all_to_all: block j of the output is member j's block `index`
      Tensor a2a = rank.make(n, kCols, {});
      rank.comm.all_to_all(g, rank.make(n, kCols, values(me, n * kCols)), a2a, kTag);
      expected.clear();
      for (int m : members)
        for (float v : values(m, kCols, index * kCols)) expected.push_back(v);
      EXPECT_EQ(rank.read(a2a), expected);
    }
  });
}

// The variable-split all-to-all (the MoE dispatch's): member i sends member j (i + 2 * j) % 3 rows, each
// block arrives whole and in member order, and the recorded bytes are the rows sent, not a padded block.
TEST(ThreadCommunicator, AllToAllWithSplitsMovesAndRecordsEachPairsRows) {
  const RankGrid grid = grid_tp2_pp2_dp2(RankOrder::kTpCpEpDpPp);
  run_grid(grid, [&](Rank& rank) {
    const CommGroup g = CommGroup::kWorld;
    const int n = rank.comm.size(g), me = rank.comm.rank(g);
    constexpr std::int64_t kCols = 3;
    auto rows = [](int from, int to) { return std::int64_t{(from + 2 * to) % 3}; };
    std::vector<std::int64_t> send(n), receive(n);
    std::vector<float> input, expected;
    for (int j = 0; j < n; ++j) {
      send[j] = rows(me, j);
      receive[j] = rows(j, me);
      // Row r of the block for j: values (me, j, r) distinct over the world.
      for (std::int64_t r = 0; r < send[j] * kCols; ++r) input.push_back(value(me, 100 * j + r));
      for (std::int64_t r = 0; r < receive[j] * kCols; ++r) expected.push_back(value(j, 100 * me + r));
    }
    // Larger tensors than the counts: only the counted rows move.
    Tensor in = rank.make(2 * n, kCols, {}),
           out = rank.make(2 * n, kCols, std::vector<float>(2 * n * kCols, -1.0f));
    in.rows = static_cast<std::int64_t>(input.size()) / kCols;
    rank.backend.upload(in, input.data());
    in.rows = 2 * n;
    rank.backend.recorder().set_enabled(true);
    rank.comm.all_to_all(g, in, send, out, receive, {"dispatch_a2a", 0, OpPhase::kForward});
    std::vector<float> got = rank.read(out);
    const std::size_t received = expected.size();
    EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + received), expected);
    for (std::size_t i = received; i < got.size(); ++i) ASSERT_EQ(got[i], -1.0f) << "row past the counts";
    const std::vector<layouts::Op>& ops = rank.backend.recorder().ops();
    ASSERT_EQ(ops.size(), 1u);
    EXPECT_EQ(ops[0].kind, OpKind::kAllToAll);
    EXPECT_EQ(ops[0].bytes, static_cast<std::int64_t>(input.size()) * 4);  // the rows sent, fp32
    EXPECT_THROW(rank.comm.all_to_all(g, in, std::vector<std::int64_t>(n, 3), out, receive, kTag),
                 std::logic_error);  // more rows than the input holds
  });
}

INSTANTIATE_TEST_SUITE_P(BothRankOrders, EveryGroup,
                         ::testing::Values(RankOrder::kTpCpEpDpPp, RankOrder::kTpCpEpPpDp));

std::vector<float> random_values(int rank, std::int64_t n) {
  std::mt19937 rng(100 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng) * std::exp2(static_cast<float>(rng() % 20) - 10.0f);
  return v;
}

TEST(ThreadCommunicator, SumsInGroupRankOrderBitForBit) {
  const RankGrid grid = grid_tp2_pp2_dp2(RankOrder::kTpCpEpDpPp);
  constexpr std::int64_t kN = 4096;
  std::vector<float> expected(kN, 0.0f);  // ((r0 + r1) + r2) + ... in float
  for (int r = 0; r < 8; ++r) {
    const std::vector<float> v = random_values(r, kN);
    for (std::int64_t i = 0; i < kN; ++i) expected[i] = r == 0 ? v[i] : expected[i] + v[i];
  }
  for (int repeat = 0; repeat < 5; ++repeat) {
    std::mutex mutex;
    std::vector<std::vector<float>> results(8);
    run_grid(grid, [&](Rank& rank) {
      if (rank.comm.world_rank() % 3 == 0) std::this_thread::sleep_for(milliseconds(repeat));
      Tensor t = rank.make(1, kN, random_values(rank.comm.world_rank(), kN));
      rank.comm.all_reduce(CommGroup::kWorld, t, ReduceOp::kSum, kTag);
      std::lock_guard<std::mutex> lock(mutex);
      results[rank.comm.world_rank()] = rank.read(t);
    });
    for (const std::vector<float>& r : results)
      ASSERT_EQ(std::memcmp(r.data(), expected.data(), sizeof(float) * kN), 0);
  }
}

TEST(ThreadCommunicator, Bf16ResultsAreRoundedLikeKernelOutputs) {
  const RankGrid grid(4, 1, 1, 1, 1, 1);
  run_grid(
      grid,
      [&](Rank& rank) {
        const int me = rank.comm.world_rank();
        std::vector<float> mine(64), sum(64, 0.0f);
        for (int i = 0; i < 64; ++i) mine[i] = 1.0f + (me + 1) * i * 1e-3f;
        Tensor t = rank.make(1, 64, mine, DType::kBF16);
        for (int r = 0; r < 4; ++r)
          for (int i = 0; i < 64; ++i) sum[i] += reference::round_to_bf16(1.0f + (r + 1) * i * 1e-3f);
        reference::round_to_bf16_inplace(sum.data(), 64);
        rank.comm.all_reduce(CommGroup::kWorld, t, ReduceOp::kSum, kTag);
        EXPECT_EQ(rank.read(t), sum);
        Tensor f = rank.make(1, 64, mine);  // fp32 tensors are not rounded
        rank.comm.broadcast(CommGroup::kWorld, f, 1, kTag);
        for (int i = 0; i < 64; ++i) EXPECT_EQ(rank.read(f)[i], 1.0f + 2 * i * 1e-3f);
      },
      /*bf16=*/true);
}

TEST(ThreadCommunicator, RecordsIssuedCollectivesWithNcclTestsBytes) {
  const RankGrid grid = grid_tp2_pp2_dp2(RankOrder::kTpCpEpDpPp);
  run_grid(grid, [&](Rank& rank) {
    rank.backend.recorder().set_enabled(true);
    rank.backend.recorder().set_position(3, 0);
    const int me = rank.comm.world_rank();
    const int next = rank.comm.global_rank(CommGroup::kPipeline, 1 - rank.comm.rank(CommGroup::kPipeline));
    rank.comm.all_reduce(CommGroup::kTensor, rank.make(4, 8, {}, DType::kBF16), ReduceOp::kSum,
                         {"proj", 2, OpPhase::kForward});
    rank.comm.all_gather(CommGroup::kData, rank.make(1, 16, {}), rank.make(2, 16, {}),
                         {"param_ag", -1, OpPhase::kOptimizer});
    rank.comm.reduce_scatter(CommGroup::kDataContext, rank.make(2, 16, {}), rank.make(1, 16, {}),
                             {"grad_bucket", -1, OpPhase::kGradSync});
    rank.comm.all_reduce(CommGroup::kNone, rank.make(1, 8, {}), ReduceOp::kSum, kTag);  // size 1: nothing
    Tensor out = rank.make(1, 10, std::vector<float>(10, static_cast<float>(me)), DType::kBF16);
    Tensor in = rank.make(1, 10, {}, DType::kBF16);
    rank.comm.batch_p2p(CommGroup::kPipeline,
                        {{false, in, next, {"p2p_activation", -1, OpPhase::kForward}, 1, 0},
                         {true, out, next, {"p2p_activation", -1, OpPhase::kForward}, 2, 0}});
    EXPECT_EQ(rank.read(in), std::vector<float>(10, static_cast<float>(next)));
    const std::vector<layouts::Op>& ops = rank.backend.recorder().ops();
    ASSERT_EQ(ops.size(), 5u);
    EXPECT_EQ(ops[0].kind, OpKind::kAllReduce);
    EXPECT_EQ(ops[0].group, CommGroup::kTensor);
    EXPECT_EQ(ops[0].group_size, 2);
    EXPECT_EQ(ops[0].bytes, 4 * 8 * 2);  // per-rank input, bf16
    EXPECT_EQ(ops[0].label, "proj");
    EXPECT_EQ(ops[0].layer, 2);
    EXPECT_EQ(ops[0].microbatch, 3);
    EXPECT_EQ(ops[1].kind, OpKind::kAllGather);
    EXPECT_EQ(ops[1].bytes, 2 * 16 * 4);  // total output
    EXPECT_EQ(ops[1].phase, OpPhase::kOptimizer);
    EXPECT_EQ(ops[2].kind, OpKind::kReduceScatter);
    EXPECT_EQ(ops[2].group, CommGroup::kDataContext);
    EXPECT_EQ(ops[2].bytes, 2 * 16 * 4);    // total input
    EXPECT_EQ(ops[3].kind, OpKind::kSend);  // sends recorded first
    EXPECT_EQ(ops[3].peer_rank, next);
    EXPECT_EQ(ops[3].microbatch, 2);
    EXPECT_EQ(ops[3].bytes, 10 * 2);
    EXPECT_EQ(ops[4].kind, OpKind::kRecv);
    EXPECT_EQ(ops[4].peer_rank, next);
    EXPECT_EQ(ops[4].microbatch, 1);
    EXPECT_EQ(ops[4].group, CommGroup::kPipeline);
    EXPECT_EQ(ops[4].group_size, 2);
  });
}

TEST(ThreadCommunicator, BufferedSendsNeverDeadlock) {
  // A ring over the world where every rank lists its receive before its send (unbuffered: a deadlock), and
  // several messages between one pair, matched in issue order.
  const RankGrid grid(4, 1, 1, 1, 1, 1);
  run_grid(grid, [&](Rank& rank) {
    const int me = rank.comm.world_rank();
    const int next = (me + 1) % 4, previous = (me + 3) % 4;
    Tensor from_previous = rank.make(1, 8, {});
    rank.comm.batch_p2p(CommGroup::kWorld, {{false, from_previous, previous, kTag},
                                            {true, rank.make(1, 8, values(me, 8)), next, kTag}});
    EXPECT_EQ(rank.read(from_previous), values(previous, 8));
    std::vector<P2pTransferArgs> batch;
    std::vector<Tensor> received;
    for (int k = 0; k < 3; ++k) {
      received.push_back(rank.make(1, 4, {}));
      batch.push_back({false, received.back(), next, kTag});
    }
    for (int k = 0; k < 3; ++k)
      batch.push_back({true, rank.make(1, 4, values(me, 4, 10 * k)), previous, kTag});
    rank.comm.batch_p2p(CommGroup::kWorld, batch);
    for (int k = 0; k < 3; ++k) EXPECT_EQ(rank.read(received[k]), values(next, 4, 10 * k));
  });
}

// Runs a failing scenario and returns the one error message; checks it came well within `bound`.
std::string failure_of(const std::function<void(int, ThreadWorld&)>& body, int world = 4,
                       milliseconds timeout = milliseconds(300)) {
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    run_thread_ranks(world, body, timeout);
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, timeout + milliseconds(5000));
  return message;
}

void expect_failure_naming(const std::string& expected, const std::function<void(int, ThreadWorld&)>& body,
                           int world, milliseconds timeout = milliseconds(300)) {
  const std::string message = failure_of(body, world, timeout);
  EXPECT_NE(message.find(expected), std::string::npos) << message;
}

// A rank stuck elsewhere until the world ends.
void stall_until_aborted(const ThreadWorld& world) {
  while (!world.aborted()) std::this_thread::sleep_for(milliseconds(5));
}

TEST(ThreadCommunicator, AThrowingRankEndsEveryRankWithItsMessage) {
  const RankGrid grid(4, 1, 1, 1, 1, 1);
  std::atomic<int> ended_with_message{0};
  const std::string message = failure_of(
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        if (r == 3) throw std::invalid_argument("boom");
        try {
          rank.comm.all_reduce(CommGroup::kWorld, rank.make(1, 4, {}), ReduceOp::kSum, kTag);
        } catch (const std::runtime_error& e) {
          if (std::string(e.what()) == "rank 3: boom") ++ended_with_message;
          throw;
        }
      },
      4, milliseconds(60'000));  // the abort, not the timeout, ends the wait
  EXPECT_EQ(message, "rank 3: boom");
  EXPECT_EQ(ended_with_message.load(), 3);
}

TEST(ThreadCommunicator, AMissingRankTimesOutNamingIt) {
  const RankGrid grid = grid_tp2_pp2_dp2(RankOrder::kTpCpEpDpPp);
  expect_failure_naming(
      "timed out after 0.3 s in all_reduce sum over group dp-cp (ranks 4 6): rank 6 did not arrive",
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        if (r == 6) return stall_until_aborted(world);
        rank.comm.all_reduce(CommGroup::kDataContext, rank.make(1, 4, {}), ReduceOp::kSum, kTag);
      },
      8);
}

TEST(ThreadCommunicator, ARankThatReturnsEarlyFailsTheOthersAtOnce) {
  const RankGrid grid(4, 1, 1, 1, 1, 1);
  expect_failure_naming(
      "rank 2 finished without joining all_gather over group world (ranks 0 1 2 3)",
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        if (r == 2) return;
        rank.comm.all_gather(CommGroup::kWorld, rank.make(1, 4, {}), rank.make(4, 4, {}), kTag);
      },
      4, milliseconds(60'000));
}

TEST(ThreadCommunicator, AReceiveWithoutASenderTimesOut) {
  const RankGrid grid(2, 1, 1, 1, 1, 1);
  expect_failure_naming(
      "timed out after 0.3 s: rank 0 waiting in batch_p2p over group world for a message from rank 1 that "
      "never came",
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        if (r == 1) return stall_until_aborted(world);
        rank.comm.batch_p2p(CommGroup::kWorld, {{false, rank.make(1, 4, {}), 1, kTag}});
      },
      2);
}

TEST(ThreadCommunicator, MismatchedCollectivesAndSizesAreNamed) {
  const RankGrid grid(2, 1, 1, 1, 1, 1);
  std::string message = failure_of(
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        rank.comm.all_reduce(CommGroup::kWorld, rank.make(1, r == 0 ? 4 : 8, {}), ReduceOp::kSum, kTag);
      },
      2);
  EXPECT_EQ(
      message,
      "group world (ranks 0 1): rank 0 issued all_reduce sum of 4 elements, rank 1 issued all_reduce sum of "
      "8 elements");
  message = failure_of(
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        rank.comm.batch_p2p(CommGroup::kWorld, {{r == 0, rank.make(1, r == 0 ? 4 : 6, {}), 1 - r, kTag}});
      },
      2);
  EXPECT_EQ(message, "rank 1: batch_p2p over group world received 4 elements from rank 0 into a tensor of 6");
  expect_failure_naming(
      ": batch_p2p peer 3 is not in its group tp",
      [&](int r, ThreadWorld& world) {
        Rank rank(RankGrid(4, 2, 1, 1, 2, 1), r, world);
        if (r != 1) return stall_until_aborted(world);
        rank.comm.batch_p2p(CommGroup::kTensor, {{true, rank.make(1, 4, {}), 3, kTag}});
      },
      4);
}

TEST(ThreadCommunicator, AbortWakesBlockedRanksAndLaterCallsThrow) {
  const RankGrid grid(4, 1, 1, 1, 1, 1);
  std::atomic<int> later_calls_threw{0};
  const std::string message = failure_of(
      [&](int r, ThreadWorld& world) {
        Rank rank(grid, r, world);
        if (r == 0) {
          std::this_thread::sleep_for(milliseconds(20));
          rank.comm.abort("stopped by rank 0");
        } else {
          EXPECT_THROW(rank.comm.all_reduce(CommGroup::kWorld, rank.make(1, 4, {}), ReduceOp::kSum, kTag),
                       std::runtime_error);
        }
        try {
          rank.comm.broadcast(CommGroup::kWorld, rank.make(1, 4, {}), 0, kTag);
        } catch (const std::runtime_error& e) {
          if (std::string(e.what()) == "stopped by rank 0") ++later_calls_threw;
        }
      },
      4, milliseconds(60'000));
  EXPECT_EQ(message, "stopped by rank 0");
  EXPECT_EQ(later_calls_threw.load(), 4);
}

}  // namespace
}  // namespace megatune::executor
