// NcclCommunicator on GPUs: a world of one (every group of size 1, nothing issued, copies where input and
// output differ) on any GPU, and two ranks as two threads of this process on two GPUs (skipped with fewer):
// all-reduce (sum, max; fp32, bf16), all-gather, reduce-scatter, broadcast, all-to-all, batched p2p and an
// async all-reduce, each checked exactly, and the ops recorded. Then the whole launch path with two
// processes (this binary re-run by run_local_launch): environment, rendezvous, NCCL id, an all-reduce, and
// one rank's abort reaching the other through the control channel while it waits on a collective.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "executor/cuda/cuda_backend.h"
#include "executor/cuda/nccl_communicator.h"
#include "executor/parallel/local_launcher.h"
#include "layouts/rank_grid.h"
#include "tests/executor/kernel_gpu_test_util.h"

namespace megatune::executor {
namespace {

using layouts::OpKind;
using test::DeviceBuffer;

// Device tensors of one rank, filled from and read back to host floats.
class RankTensors {
 public:
  Tensor fp32(std::int64_t rows, std::int64_t cols, const std::vector<float>& values = {}) {
    auto& b = fp32_.emplace_back(std::make_unique<DeviceBuffer<float>>(std::size_t(rows * cols)));
    if (values.empty())
      b->poison();
    else
      test::upload(*b, values);
    return Tensor{b->get(), DType::kFP32, false, rows, cols, cols};
  }
  Tensor bf16(std::int64_t rows, std::int64_t cols, const std::vector<float>& values = {}) {
    auto& b = bf16_.emplace_back(std::make_unique<DeviceBuffer<__nv_bfloat16>>(std::size_t(rows * cols)));
    if (values.empty())
      b->poison();
    else
      test::upload_bf16(*b, values);
    return Tensor{b->get(), DType::kBF16, false, rows, cols, cols};
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> host(std::size_t(t.numel()));
    if (t.dtype == DType::kFP32) {
      MEGATUNE_CUDA_CHECK(cudaMemcpy(host.data(), t.data, host.size() * 4, cudaMemcpyDeviceToHost));
      return host;
    }
    std::vector<__nv_bfloat16> raw(host.size());
    MEGATUNE_CUDA_CHECK(cudaMemcpy(raw.data(), t.data, raw.size() * 2, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < raw.size(); ++i) host[i] = __bfloat162float(raw[i]);
    return host;
  }

 private:
  std::vector<std::unique_ptr<DeviceBuffer<float>>> fp32_;
  std::vector<std::unique_ptr<DeviceBuffer<__nv_bfloat16>>> bf16_;
};

std::vector<float> iota(std::size_t n, float start, float step = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + step * float(i);
  return v;
}

int count(const std::vector<layouts::Op>& ops, OpKind kind) {
  int n = 0;
  for (const layouts::Op& op : ops) n += op.kind == kind ? 1 : 0;
  return n;
}

TEST(NcclCommunicator, WorldOfOneIssuesNothing) {
  if (CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  CudaBackend backend(0);
  backend.recorder().set_enabled(true);
  const layouts::RankGrid grid(1, 1, 1, 1, 1, 1);
  NcclCommunicator comm(backend, grid, 0, /*unique_id=*/"");
  for (CommGroup g : {CommGroup::kTensor, CommGroup::kData, CommGroup::kPipeline, CommGroup::kWorld}) {
    EXPECT_EQ(comm.size(g), 1);
    EXPECT_EQ(comm.rank(g), 0);
    EXPECT_EQ(comm.global_rank(g, 0), 0);
    EXPECT_EQ(comm.nccl_comm(g), nullptr);
  }
  RankTensors t;
  const Tensor x = t.fp32(2, 3, iota(6, 1));
  comm.all_reduce(CommGroup::kData, x, ReduceOp::kSum, {});
  const Tensor gathered = t.fp32(2, 3);
  comm.all_gather(CommGroup::kTensor, x, gathered, {});
  const Tensor scattered = t.fp32(2, 3);
  comm.reduce_scatter(CommGroup::kTensor, x, scattered, {});
  comm.broadcast(CommGroup::kWorld, x, 0, {});
  comm.synchronize();
  backend.synchronize();
  EXPECT_EQ(t.read(x), iota(6, 1));
  EXPECT_EQ(t.read(gathered), iota(6, 1));
  EXPECT_EQ(t.read(scattered), iota(6, 1));
  EXPECT_TRUE(backend.recorder().ops().empty());
  EXPECT_EQ(comm.failure(), std::nullopt);
}

// Every collective on rank `r` of two (tp = 2: the tensor group is the world).
void exercise_two_ranks(int r, const std::string& id) {
  CudaBackend backend(r);
  backend.recorder().set_enabled(true);
  const layouts::RankGrid grid(2, /*tp=*/2, 1, 1, 1, /*pp=*/1);
  NcclOptions options;
  options.collective_timeout_s = 60;
  NcclCommunicator comm(backend, grid, r, id, nullptr, options);
  EXPECT_EQ(comm.size(CommGroup::kTensor), 2);
  EXPECT_EQ(comm.rank(CommGroup::kTensor), r);
  EXPECT_EQ(comm.size(CommGroup::kData), 1);
  EXPECT_NE(comm.nccl_comm(CommGroup::kTensor), nullptr);
  RankTensors t;
  const CommGroup tp = CommGroup::kTensor;
  const float fr = float(r);

  const Tensor sum32 = t.fp32(4, 8, iota(32, 100 * fr));  // rank 0: 0..31, rank 1: 100..131
  comm.all_reduce(tp, sum32, ReduceOp::kSum, {});
  const Tensor sum16 = t.bf16(2, 8, iota(16, fr + 1, 1));  // small integers: exact in bf16
  comm.all_reduce(tp, sum16, ReduceOp::kSum, {});
  const Tensor max32 = t.fp32(1, 4, {r == 0 ? 5.0f : 1.0f, r == 0 ? -1.0f : 2.0f, 3.0f, -7.0f + fr});
  comm.all_reduce(tp, max32, ReduceOp::kMax, {});
  const Tensor piece = t.bf16(2, 3, iota(6, 10 * fr)), gathered = t.bf16(4, 3);
  comm.all_gather(tp, piece, gathered, {});
  const Tensor full = t.fp32(4, 3, iota(12, fr)), slice = t.fp32(2, 3);
  comm.reduce_scatter(tp, full, slice, {});
  const Tensor rooted = t.fp32(3, 2, iota(6, 1000 * (fr + 1)));
  comm.broadcast(tp, rooted, /*root_in_group=*/1, {});
  const Tensor a2a_in = t.fp32(4, 2, iota(8, 10 * fr)), a2a_out = t.fp32(4, 2);
  comm.all_to_all(tp, a2a_in, a2a_out, {});
  const Tensor mine = t.bf16(2, 4, iota(8, 50 * fr)), theirs = t.bf16(2, 4);
  comm.batch_p2p(tp, {{true, mine, 1 - r, {}}, {false, theirs, 1 - r, {}}});
  const Tensor later = t.fp32(1, 16, iota(16, fr));
  CommHandle handle = comm.all_reduce_async(tp, later, ReduceOp::kSum, {});
  handle->wait();
  comm.synchronize();
  backend.synchronize();

  std::vector<float> want(32);
  for (int i = 0; i < 32; ++i) want[i] = float(i) + float(100 + i);
  EXPECT_EQ(t.read(sum32), want);
  want.assign(16, 0);
  for (int i = 0; i < 16; ++i) want[i] = float(1 + i) + float(2 + i);
  EXPECT_EQ(t.read(sum16), want);
  EXPECT_EQ(t.read(max32), (std::vector<float>{5, 2, 3, -6}));
  want = iota(6, 0);
  for (float v : iota(6, 10)) want.push_back(v);
  EXPECT_EQ(t.read(gathered), want);
  want.assign(6, 0);
  for (int i = 0; i < 6; ++i) want[i] = float(6 * r + i) + float(6 * r + i + 1);  // row slice r of the sum
  EXPECT_EQ(t.read(slice), want);
  EXPECT_EQ(t.read(rooted), iota(6, 2000));
  // all-to-all: block i of the output is block r of rank i's input.
  want.clear();
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) want.push_back(float(10 * i + 4 * r + j));
  EXPECT_EQ(t.read(a2a_out), want);
  EXPECT_EQ(t.read(theirs), iota(8, 50 * float(1 - r)));
  want.assign(16, 0);
  for (int i = 0; i < 16; ++i) want[i] = float(2 * i + 1);
  EXPECT_EQ(t.read(later), want);

  const std::vector<layouts::Op>& ops = backend.recorder().ops();
  EXPECT_EQ(count(ops, OpKind::kAllReduce), 4);
  EXPECT_EQ(count(ops, OpKind::kAllGather), 1);
  EXPECT_EQ(count(ops, OpKind::kReduceScatter), 1);
  EXPECT_EQ(count(ops, OpKind::kBroadcast), 1);
  EXPECT_EQ(count(ops, OpKind::kAllToAll), 1);
  EXPECT_EQ(count(ops, OpKind::kSend), 1);
  EXPECT_EQ(count(ops, OpKind::kRecv), 1);
  EXPECT_EQ(comm.failure(), std::nullopt);
}

TEST(NcclCommunicator, TwoRanksOnTwoGpusExact) {
  if (CudaBackend::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const std::string id = cuda::new_nccl_unique_id();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        exercise_two_ranks(r, id);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// An abort on one rank reaches the other's later calls (no control channel: each rank aborts itself; the
// message is what the next call throws).
TEST(NcclCommunicator, AbortMakesLaterCallsThrow) {
  if (CudaBackend::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const std::string id = cuda::new_nccl_unique_id();
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      CudaBackend backend(r);
      NcclCommunicator comm(backend, layouts::RankGrid(2, 2, 1, 1, 1, 1), r, id);
      comm.abort("rank " + std::to_string(r) + " failed: test");
      RankTensors t;
      try {
        comm.all_reduce(CommGroup::kTensor, t.fp32(1, 4, iota(4, 0)), ReduceOp::kSum, {});
      } catch (const std::runtime_error& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(errors[0], "rank 0 failed: test");
  EXPECT_EQ(errors[1], "rank 1 failed: test");
}

// The child side of the two-process tests: skipped unless started by them.
TEST(NcclCommunicator, ChildRank) {
  const char* mode = std::getenv("MEGATUNE_NCCL_TEST_CHILD");
  if (mode == nullptr) GTEST_SKIP() << "run by the two-process tests";
  const LaunchEnvironment launch = read_launch_environment();
  CudaBackend backend(launch.local_rank);
  RendezvousOptions rendezvous;
  rendezvous.timeout_s = 60;
  rendezvous.fingerprint = "parallel_nccl_gpu_test";
  std::unique_ptr<NcclCommunicator> comm =
      NcclCommunicator::connect(backend, layouts::RankGrid(2, 2, 1, 1, 1, 1), launch, rendezvous);
  RankTensors t;
  const Tensor x = t.fp32(1, 4, iota(4, float(launch.rank)));
  comm->all_reduce(CommGroup::kTensor, x, ReduceOp::kSum, {});
  comm->synchronize();
  EXPECT_EQ(t.read(x), (std::vector<float>{1, 3, 5, 7}));
  if (std::string(mode) != "abort") return;
  if (launch.rank == 1) {
    comm->abort("rank 1 failed: injected");
    std::this_thread::sleep_for(std::chrono::seconds(3));  // rank 0 reports before the launcher stops it
    std::_Exit(1);
  }
  try {  // rank 0: a collective rank 1 never joins
    comm->all_reduce(CommGroup::kTensor, x, ReduceOp::kSum, {});
    comm->synchronize();
    std::cerr << "not aborted" << std::endl;
  } catch (const std::runtime_error& e) {
    std::cerr << "observed: " << e.what() << std::endl;
  }
}

LaunchOutcome launch_children(const std::string& mode, std::string* err_text) {
  LocalLaunch launch;
  launch.program = "/proc/self/exe";
  launch.argv = {"parallel_nccl_gpu_test", "--gtest_filter=NcclCommunicator.ChildRank"};
  launch.nproc = 2;
  launch.extra_env = {{"MEGATUNE_NCCL_TEST_CHILD", mode}};
  std::ostringstream out, err;
  const LaunchOutcome outcome = run_local_launch(launch, out, err);
  *err_text = err.str();
  std::cout << out.str() << err.str();
  return outcome;
}

TEST(NcclCommunicator, TwoProcessesThroughTheLauncher) {
  if (CudaBackend::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  std::string err;
  const LaunchOutcome outcome = launch_children("run", &err);
  EXPECT_EQ(outcome.exit_code, 0) << outcome.failure;
}

TEST(NcclCommunicator, AbortReachesTheOtherProcess) {
  if (CudaBackend::device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  std::string err;
  const LaunchOutcome outcome = launch_children("abort", &err);
  EXPECT_EQ(outcome.failed_rank, 1) << outcome.failure;
  EXPECT_NE(err.find("[rank 0] observed: rank 1 failed: injected"), std::string::npos) << err;
}

}  // namespace
}  // namespace megatune::executor
