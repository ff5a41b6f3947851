// FP8 prices: GEMMs of dtype fp8 from the database's fp8 records when it has them, else transferred from the
// bf16 price by the stated rule (provenance transferred); the casts of FP8 linears priced by their bytes,
// from measured FP8 casts when there are some, else as the bf16 element-wise kernels; and fits that keep the
// two series apart.
#include <gtest/gtest.h>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/cost_model.h"
#include "cost_models/fitting.h"
#include "cost_models/hardware_catalog.h"
#include "cost_models/record_store.h"
#include "layouts/fp8.h"

namespace megatune::cost_models {
namespace {

using layouts::DType;
using layouts::OpKind;

const ClusterSpec& h200() {
  static const ClusterSpec cluster = parse_cluster_spec("1x1xH200");
  return cluster;
}

KernelTiming gemm_row(std::int64_t m, std::int64_t n, std::int64_t k, const char* dtype, double tflops) {
  KernelTiming row;
  row.op_kind = "gemm";
  row.m = m, row.n = n, row.k = k;
  row.dtype = dtype;
  row.gpu = "H200 SXM";
  row.median_s = 2.0 * m * n * k / (tflops * 1e12);
  row.min_s = row.max_s = row.median_s;
  row.repeats = 10;
  row.measured_at = "2026-12-03T10:00:00Z";
  return row;
}

KernelTiming elementwise_row(std::int64_t bytes, const char* dtype, double bandwidth) {
  KernelTiming row;
  row.op_kind = "elementwise";
  row.bytes = bytes;
  row.dtype = dtype;
  row.gpu = "H200 SXM";
  row.median_s = 3e-6 + static_cast<double>(bytes) / bandwidth;
  row.min_s = row.max_s = row.median_s;
  row.repeats = 10;
  row.measured_at = "2026-12-03T10:00:00Z";
  return row;
}

TEST(Fp8GemmCost, TransferredFromTheBf16PriceWithoutFp8Records) {
  Database database = open_in_memory_cost_database();
  upsert_kernel_timing(database, gemm_row(8192, 8192, 2048, "bf16", 700));
  const CostModel model(database, h200());
  const OpCost bf16 = model.gemm(8192, 8192, 2048, DType::kBF16);
  ASSERT_EQ(bf16.provenance, Provenance::kMeasured);
  const OpCost fp8 = model.gemm(8192, 8192, 2048, DType::kFP8);
  EXPECT_EQ(fp8.provenance, Provenance::kTransferred);
  // The rule: the time above the launch latency runs (FP8 peak / bf16 peak) x 0.952 faster: 1.90x on H200.
  const double speedup = peak_tflops(h200().gpu, DType::kFP8) / peak_tflops(h200().gpu, DType::kBF16) * 0.952;
  EXPECT_NEAR(model.gemm_model().fp8_speedup_over_bf16(), speedup, 1e-12);
  EXPECT_NEAR(speedup, 1.904, 0.001);
  const double latency_s = model.defaults().kernel_launch_latency_s;
  EXPECT_NEAR(fp8.time_s, latency_s + (bf16.time_s - latency_s) / speedup, 1e-12);
  // A skinny GEMM near the bf16 memory roofline is held at the FP8 roofline of its bytes (FP8 operands,
  // bf16 output), not sped up 1.9x.
  upsert_kernel_timing(database, gemm_row(16, 8192, 8192, "bf16", 65));
  const CostModel skinny_model(database, h200());
  const OpCost skinny = skinny_model.gemm(16, 8192, 8192, DType::kFP8);
  const double bytes = 16.0 * 8192 + 8192.0 * 8192 + 2.0 * 16 * 8192;
  EXPECT_NEAR(skinny.time_s,
              latency_s + bytes / (4.8e12 * skinny_model.defaults().memory_bandwidth_efficiency), 1e-12);
  EXPECT_GT(skinny.time_s, latency_s + (skinny_model.gemm(16, 8192, 8192).time_s - latency_s) / speedup);
}

TEST(Fp8GemmCost, Fp8RecordsAreUsedWhenPresent) {
  Database database = open_in_memory_cost_database();
  upsert_kernel_timing(database, gemm_row(8192, 8192, 2048, "bf16", 700));
  upsert_kernel_timing(database, gemm_row(8192, 8192, 2048, "fp8", 1250));
  const CostModel model(database, h200());
  EXPECT_TRUE(model.gemm_model().prices_fp8_from_records());
  const OpCost fp8 = model.gemm(8192, 8192, 2048, DType::kFP8);
  EXPECT_EQ(fp8.provenance, Provenance::kMeasured);
  EXPECT_NEAR(fp8.time_s, 2.0 * 8192 * 8192 * 2048 / 1250e12, 1e-12);
  // A neighbour of the fp8 record is interpolated from the fp8 records, not transferred from bf16.
  const OpCost near = model.gemm(8192, 8192, 3072, DType::kFP8);
  EXPECT_EQ(near.provenance, Provenance::kInterpolated);
  EXPECT_NEAR(near.time_s, 2.0 * 8192 * 8192 * 3072 / 1250e12, 1e-9);
  // The step-program op of dtype fp8 is priced through the same path.
  layouts::Op op;
  op.kind = OpKind::kGemm;
  op.dtype = DType::kFP8;
  op.m = 8192, op.n = 8192, op.k = 2048;
  EXPECT_EQ(model.price(op).time_s, fp8.time_s);
}

TEST(Fp8GemmCost, AGpuWithoutAnFp8PeakIsRefusedInOneLine) {
  Database database = open_in_memory_cost_database();
  const CostModel model(database, parse_cluster_spec("1x8xA100"));
  try {
    model.gemm(4096, 4096, 4096, DType::kFP8);
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no fp8 peak"), std::string::npos) << e.what();
  }
}

TEST(Fp8CastCost, PricedByBytesAsElementwiseUntilCastsAreMeasured) {
  // A cast of T x h bf16 values into FP8 and its transpose (delayed scaling): read 2 B, write 1 + 1 B.
  const std::int64_t elements = 8192LL * 2048;
  layouts::Op cast;
  cast.kind = OpKind::kElementwise;
  cast.dtype = DType::kFP8;
  cast.bytes = layouts::fp8_cast_bytes(elements, 2, false);
  ASSERT_EQ(cast.bytes, elements * 4);
  layouts::Op tensorwise = cast;  // current scaling reads the input once more for its amax
  tensorwise.bytes = layouts::fp8_cast_bytes(elements, 2, true);
  ASSERT_EQ(tensorwise.bytes, elements * 6);

  Database database = open_in_memory_cost_database();
  for (std::int64_t bytes = 1 << 20; bytes <= (1 << 30); bytes *= 4)
    upsert_kernel_timing(database, elementwise_row(bytes, "bf16", 3.6e12));
  const CostModel bf16_only(database, h200());
  const OpCost priced = bf16_only.price(cast);
  EXPECT_EQ(priced.time_s, bf16_only.memory_bound(OpKind::kElementwise, double(cast.bytes)).time_s);
  EXPECT_NEAR(priced.time_s, 3e-6 + double(cast.bytes) / 3.6e12, 0.05 * priced.time_s);
  EXPECT_GT(bf16_only.price(tensorwise).time_s, 1.4 * priced.time_s);

  // Measured FP8 casts (a slower kernel here) price the casts and leave the bf16 element-wise kernels alone.
  for (std::int64_t bytes = 1 << 20; bytes <= (1 << 30); bytes *= 4)
    upsert_kernel_timing(database, elementwise_row(bytes, "fp8", 2.4e12));
  const CostModel measured(database, h200());
  const OpCost measured_cast = measured.price(cast);
  EXPECT_NE(measured_cast.provenance, Provenance::kAnalytic);
  EXPECT_NEAR(measured_cast.time_s, 3e-6 + double(cast.bytes) / 2.4e12, 0.05 * measured_cast.time_s);
  layouts::Op add = cast;
  add.dtype = DType::kBF16;
  EXPECT_EQ(measured.price(add).time_s, bf16_only.price(add).time_s);
}

TEST(Fp8CastCost, FitsKeepTheCastSeriesApart) {
  std::vector<KernelTiming> rows;
  for (std::int64_t bytes = 1 << 20; bytes <= (1 << 30); bytes *= 4) {
    rows.push_back(elementwise_row(bytes, "bf16", 3.6e12));
    rows.push_back(elementwise_row(bytes, "fp8", 2.4e12));
  }
  const auto bf16 = fit_memory_bandwidth(rows, h200().gpu, "elementwise");
  const auto fp8 = fit_memory_bandwidth(rows, h200().gpu, "elementwise:fp8");
  ASSERT_TRUE(bf16 && fp8);
  EXPECT_EQ(fp8->variant, "elementwise:fp8");
  const LinearTimeModel bf16_line = LinearTimeModel::from_json(bf16->params_json);
  const LinearTimeModel fp8_line = LinearTimeModel::from_json(fp8->params_json);
  EXPECT_NEAR(bf16_line.time_s(1e9), 3e-6 + 1e9 / 3.6e12, 1e-6);
  EXPECT_NEAR(fp8_line.time_s(1e9), 3e-6 + 1e9 / 2.4e12, 1e-6);
}

}  // namespace
}  // namespace megatune::cost_models
