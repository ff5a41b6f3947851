// CUPTI tracer on a GPU: records carry kernel names, device timestamps, stream and the op range they were
// launched in (external correlation); memsets are recorded; the kernel runner's GEMM and attention times
// agree with FLOP counts. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "profiler/cuda/cuda_kernel_runner.h"
#include "profiler/cuda/cupti_tracer.h"
#include "profiler/trace_timing.h"

namespace megatune::profiler::cuda {
namespace {

bool have_gpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

TEST(CuptiTracerGpu, RecordsCarryRangesNamesAndDeviceTimes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  CuptiTracer tracer;
  CudaKernelRunner runner(tracer);
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 64 << 20), cudaSuccess);
  {
    TraceRange range(tracer, 41);
    ASSERT_EQ(cudaMemsetAsync(buffer, 1, 64 << 20, nullptr), cudaSuccess);
  }
  const std::vector<TraceRecord> records = tracer.flush();
  cudaFree(buffer);
  bool memset_seen = false;
  for (const TraceRecord& record : records) {
    if (record.kind == ActivityKind::kMemset && record.external_id == 41) {
      memset_seen = true;
      EXPECT_GT(record.end_ns, record.start_ns);
    }
  }
  EXPECT_TRUE(memset_seen);
  EXPECT_EQ(tracer.dropped_records(), 0u);

  // GEMM through the executor's GemmRunner: one nvjet/cutlass kernel per repeat, each in its range.
  const RepeatPolicy policy{2, 5};
  const auto gemm = runner.time_gemm({4096, 4096, 4096}, policy);
  ASSERT_TRUE(gemm.has_value());
  ASSERT_EQ(gemm->size(), 5u);
  const TimingSummary summary = summarize(*gemm);
  const double tflops = 2.0 * 4096.0 * 4096.0 * 4096.0 / summary.median_s / 1e12;
  EXPECT_GT(tflops, 300.0);
  EXPECT_LT(tflops, 1000.0);  // below the dense bf16 peak: a real device time, not a launch time

  // Unsupported head dim: no executor kernel.
  AttentionItem odd;
  odd.shape = {1, 8, 8, 512, 512, 96, true};
  EXPECT_FALSE(runner.time_attention(odd, policy).has_value());
}

TEST(CuptiTracerGpu, EveryKernelKindOfTheSweepRuns) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU";
  CuptiTracer tracer;
  CudaKernelRunner runner(tracer);
  const RepeatPolicy policy{1, 3};
  for (const GemmVariant variant :
       {GemmVariant::kForward, GemmVariant::kBackwardData, GemmVariant::kBackwardWeight}) {
    GemmItem item{2048, 1024, 512, variant};
    EXPECT_TRUE(runner.time_gemm(item, policy).has_value()) << gemm_variant_name(variant);
  }
  GemmItem fused{2048, 4096, 1024, GemmVariant::kForward, GemmFusion::kGeluAuxBias};
  EXPECT_TRUE(runner.time_gemm(fused, policy).has_value());
  for (const bool backward : {false, true}) {
    AttentionItem item;
    item.backward = backward;
    item.shape = {2, 16, 4, 1024, 1024, 128, true};
    const auto samples = runner.time_attention(item, policy);
    ASSERT_TRUE(samples.has_value());
    EXPECT_GT(summarize(*samples).median_s, 0.0);
  }
  using layouts::OpKind;
  for (const OpKind kind :
       {OpKind::kNorm, OpKind::kNormBackward, OpKind::kActivation, OpKind::kActivationBackward,
        OpKind::kElementwise, OpKind::kRope, OpKind::kRopeBackward, OpKind::kCrossEntropy, OpKind::kEmbedding,
        OpKind::kOptimizer, OpKind::kGradNorm}) {
    MemoryBoundItem item{kind, 16 << 20,
                         kind == OpKind::kCrossEntropy                            ? 32768
                         : kind == OpKind::kRope || kind == OpKind::kRopeBackward ? 128
                                                                                  : 4096};
    const auto samples = runner.time_memory_bound(item, policy);
    ASSERT_TRUE(samples.has_value()) << layouts::op_kind_name(kind);
    // 16 MiB at most ~4.8 TB/s takes >= 3.5 us.
    EXPECT_GT(summarize(*samples).median_s, 3e-6) << layouts::op_kind_name(kind);
  }
}

}  // namespace
}  // namespace megatune::profiler::cuda
