// Pricing a GPU without measurements from the shipped H200 profile: identity on the profiled GPU, FLOP/s
// scaling of large GEMMs, low efficiency of small ones, bandwidth scaling of memory-bound kernels, and the
// ridge point of the target deciding what is memory-bound.
#include "cost_models/gpu_transfer.h"

#include <gtest/gtest.h>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "cost_models/gemm_cost_model.h"
#include "cost_models/hardware_catalog.h"

namespace megatune::cost_models {
namespace {

using layouts::DType;
using layouts::OpKind;

constexpr double kLaunchLatencyS = 3e-6;

const GpuModel& h200() { return HardwareCatalog::embedded().gpu("H200"); }

std::unique_ptr<CostModel> embedded_model(const std::string& cluster) {
  return CostModel::from_embedded(parse_cluster_spec(cluster));
}

double gemm_efficiency(const CostModel& model, std::int64_t m, std::int64_t n, std::int64_t k) {
  return GemmCostModel::flops(m, n, k) / (model.gemm(m, n, k).time_s * model.peak_flops_per_s(DType::kBF16));
}

// Llama-3-8B attention at seq 4096, micro-batch 2.
layouts::AttentionShape attention_shape() {
  return {
      .batch = 2, .heads = 32, .kv_heads = 8, .seq_q = 4096, .seq_kv = 4096, .head_dim = 128, .causal = true};
}

TEST(GpuTransfer, ToTheProfiledGpuItselfKeepsItsPrices) {
  const GpuTransfer same(h200(), h200(), kLaunchLatencyS);
  for (const double time_s : {1e-6, 2e-5, 3e-3}) {
    EXPECT_DOUBLE_EQ(same.gemm_time_s(time_s, 4096, 4096, 4096, DType::kBF16), time_s);
    EXPECT_DOUBLE_EQ(same.gemm_time_s(time_s, 1, 8192, 8192, DType::kBF16), time_s);
    EXPECT_DOUBLE_EQ(same.memory_bound_time_s(time_s), time_s);
    EXPECT_DOUBLE_EQ(
        same.attention_time_s(time_s, AttentionDirection::kBackward, attention_shape(), DType::kBF16),
        time_s);
  }
}

TEST(GpuTransfer, AnUnprofiledGpuIsPricedFromTheShippedProfile) {
  const auto a100 = embedded_model("1x8xA100 80GB");
  EXPECT_EQ(a100->sources().kernels_transferred_from, "H200 SXM");
  EXPECT_EQ(a100->gemm(4096, 4096, 4096).provenance, Provenance::kTransferred);
  EXPECT_EQ(a100->attention_forward(attention_shape()).provenance, Provenance::kTransferred);
  EXPECT_EQ(a100->memory_bound(OpKind::kNorm, 1 << 26).provenance, Provenance::kTransferred);
  // The profiled GPU itself is priced from its own measurements.
  const auto h200_model = embedded_model("1x8xH200");
  EXPECT_EQ(h200_model->sources().kernels_transferred_from, "");
  EXPECT_NE(h200_model->gemm(4096, 4096, 4096).provenance, Provenance::kTransferred);
}

TEST(GpuTransfer, LargeComputeBoundGemmScalesWithPeakFlops) {
  const auto h200_model = embedded_model("1x8xH200");
  const auto a100 = embedded_model("1x8xA100 80GB");
  const double ratio = a100->gemm(8192, 8192, 8192).time_s / h200_model->gemm(8192, 8192, 8192).time_s;
  EXPECT_NEAR(ratio, 989.4 / 312.0, 0.01 * 989.4 / 312.0);
  // The same efficiency of peak on both GPUs, not the fixed analytic 0.75.
  EXPECT_NEAR(gemm_efficiency(*a100, 8192, 8192, 8192), gemm_efficiency(*h200_model, 8192, 8192, 8192), 0.01);
}

TEST(GpuTransfer, SmallAndSkinnyGemmsKeepALowerEfficiency) {
  const auto a100 = embedded_model("1x8xA100 80GB");
  const double large = gemm_efficiency(*a100, 8192, 8192, 8192);
  EXPECT_LT(gemm_efficiency(*a100, 256, 1024, 256), 0.5 * large);
  EXPECT_LT(gemm_efficiency(*a100, 16384, 256, 1024), large);
}

TEST(GpuTransfer, MemoryBoundKernelsScaleWithBandwidth) {
  const auto h200_model = embedded_model("1x8xH200");
  const auto a100 = embedded_model("1x8xA100 80GB");
  const double bytes = 1 << 28;
  const double h200_s = h200_model->memory_bound(OpKind::kNorm, bytes).time_s;
  const double a100_s = a100->memory_bound(OpKind::kNorm, bytes).time_s;
  EXPECT_NEAR(a100_s, kLaunchLatencyS + (h200_s - kLaunchLatencyS) * 4.8e12 / 2.039e12, 1e-12);
  const GpuTransfer to_a100(h200(), HardwareCatalog::embedded().gpu("A100 80GB"), kLaunchLatencyS);
  EXPECT_DOUBLE_EQ(to_a100.memory_bound_time_s(2e-6), 2e-6);  // below the launch floor: not scaled
}

TEST(GpuTransfer, TheTargetsRidgePointDecidesWhatIsMemoryBound) {
  GpuModel narrow = h200();  // the same FLOP/s over a quarter of the bandwidth: ridge 824 FLOP/byte
  narrow.name = "narrow";
  narrow.hbm_bandwidth_bytes_per_s /= 4;
  const GpuTransfer transfer(h200(), narrow, kLaunchLatencyS);
  // 8192^3: 2731 FLOP/byte, compute-bound on both: unchanged.
  EXPECT_DOUBLE_EQ(transfer.gemm_time_s(2e-3, 8192, 8192, 8192, DType::kBF16), 2e-3);
  // 2048^3: 683 FLOP/byte, compute-bound on the H200 (ridge 206), memory-bound on the target.
  const double profiled_s = 30e-6;
  const double expected_s =
      kLaunchLatencyS + (profiled_s - kLaunchLatencyS) * (824.5 / 682.7);  // ridge / intensity
  EXPECT_NEAR(transfer.gemm_time_s(profiled_s, 2048, 2048, 2048, DType::kBF16), expected_s,
              0.002 * expected_s);
}

}  // namespace
}  // namespace megatune::cost_models
