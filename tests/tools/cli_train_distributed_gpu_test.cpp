// `megatune train --device cuda` as one rank of a multi-process job whose other ranks never come: the
// rendezvous ends at --distributed-timeout-minutes with one line naming the missing peer. A tp2 layout with
// --ranks-on-one-gpu trains its two ranks as threads on GPU 0 and learns.
#include <gtest/gtest.h>

#include "executor/cuda/cuda_backend.h"
#include "executor/parallel/tcp_rendezvous.h"
#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

TEST(CliTrainDistributed, TheRendezvousEndsAtTheDistributedTimeout) {
  if (executor::CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string port = "MASTER_PORT=" + std::to_string(executor::free_local_port());
  const CliResult r =
      run_megatune({"train", "--model", "tiny", "--device", "cuda", "--mock-data", "--train-iters", "1",
                    "--distributed-timeout-minutes", "0.02"},
                   60, "", {"env", "RANK=1", "LOCAL_RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.error_lines(), 1) << r.err;
  EXPECT_NE(r.err.find("could not reach rank 0 within 1.2 s"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 30.0);
}

TEST(CliTrainDistributed, RanksOnOneGpuTrainATensorParallelLayout) {
  if (executor::CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const CliResult r = run_megatune({"train",
                                    "--model",
                                    "tiny",
                                    "--hidden-size",
                                    "256",
                                    "--num-attention-heads",
                                    "4",
                                    "--seq-length",
                                    "64",
                                    "--max-position-embeddings",
                                    "64",
                                    "--device",
                                    "cuda",
                                    "--mock-data",
                                    "--tp",
                                    "2",
                                    "--sequence-parallel",
                                    "--world-size",
                                    "2",
                                    "--gbs",
                                    "8",
                                    "--mbs",
                                    "2",
                                    "--train-iters",
                                    "20",
                                    "--log-interval",
                                    "10",
                                    "--lr",
                                    "3e-3",
                                    "--ranks-on-one-gpu"},
                                   300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 ranks as threads on GPU 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("iteration       20/      20"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace megatune::tests
