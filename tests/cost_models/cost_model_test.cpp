// Op cost models: provenance transitions (measured -> interpolated -> fitted -> analytic), closed forms of
// the analytic models, monotonicity, fit quality on synthetic data, and the CostModel facade.
#include "cost_models/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/fitted_forms.h"
#include "cost_models/fitting.h"
#include "cost_models/record_store.h"

namespace megatune::cost_models {
namespace {

using layouts::DType;
using layouts::OpKind;

const ClusterSpec& h100_cluster() {
  static const ClusterSpec cluster = parse_cluster_spec("2x8xH100");
  return cluster;
}

// Prices from a database without measurements: every kernel is priced analytically.
std::unique_ptr<CostModel> analytic_h100_model() {
  Database empty = open_in_memory_cost_database();
  return std::make_unique<CostModel>(empty, h100_cluster());
}

// A made-up but smooth GEMM efficiency: small shapes are inefficient, large ones approach 0.8.
double synthetic_gemm_efficiency(double m, double n, double k) {
  const double x = 0.9 * std::log(m / 256) + 0.8 * std::log(n / 256) + 0.6 * std::log(k / 256) - 2.0;
  return 0.8 / (1.0 + std::exp(-x));
}

double synthetic_gemm_time_s(std::int64_t m, std::int64_t n, std::int64_t k) {
  return 2.0 * m * n * k / (989.4e12 * synthetic_gemm_efficiency(m, n, k));
}

KernelTiming gemm_row(std::int64_t m, std::int64_t n, std::int64_t k) {
  KernelTiming row;
  row.op_kind = "gemm";
  row.m = m;
  row.n = n;
  row.k = k;
  row.gpu = "H100 SXM";
  row.median_s = synthetic_gemm_time_s(m, n, k);
  row.min_s = row.max_s = row.median_s;
  row.repeats = 10;
  row.measured_at = "2026-11-29T20:00:00Z";
  return row;
}

void fill_gemm_grid(Database& database) {
  Transaction transaction(database);
  for (std::int64_t m = 256; m <= 8192; m *= 2) {
    for (std::int64_t n = 256; n <= 8192; n *= 2) {
      for (std::int64_t k = 256; k <= 8192; k *= 2) upsert_kernel_timing(database, gemm_row(m, n, k));
    }
  }
  transaction.commit();
}

TEST(GemmCost, EmptyDatabaseIsTheRoofline) {
  const auto model = analytic_h100_model();
  const OpCost big = model->gemm(8192, 8192, 8192);
  EXPECT_EQ(big.provenance, Provenance::kAnalytic);
  const AnalyticDefaults defaults;
  EXPECT_NEAR(big.time_s, 2.0 * 8192 * 8192 * 8192 / (989.4e12 * defaults.gemm_compute_efficiency) + 3e-6,
              1e-9);
  // A skinny GEMM is bound by memory: (m k + k n + m n) * 2 bytes over HBM.
  const OpCost skinny = model->gemm(1, 8192, 8192);
  const double bytes = (8192.0 + 8192.0 * 8192 + 8192.0) * 2;
  EXPECT_NEAR(skinny.time_s, bytes / (3.35e12 * defaults.memory_bandwidth_efficiency) + 3e-6, 1e-9);
  EXPECT_EQ(model->gemm(0, 10, 10).time_s, 0);
  // Monotone in every dimension.
  for (std::int64_t size = 64; size <= 65536; size *= 2) {
    EXPECT_LT(model->gemm(size, 4096, 4096).time_s, model->gemm(size * 2, 4096, 4096).time_s);
    EXPECT_LT(model->gemm(4096, size, 4096).time_s, model->gemm(4096, size * 2, 4096).time_s);
    EXPECT_LT(model->gemm(4096, 4096, size).time_s, model->gemm(4096, 4096, size * 2).time_s);
  }
  EXPECT_LT(model->gemm(8192, 8192, 8192, DType::kFP8).time_s, big.time_s);
}

TEST(GemmCost, ProvenanceFollowsTheMeasurements) {
  Database database = open_in_memory_cost_database();
  fill_gemm_grid(database);
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.sources().gemm_measurements, 216);
  EXPECT_EQ(model.sources().in_memory_fits, 1);

  const OpCost exact = model.gemm(2048, 4096, 1024);
  EXPECT_EQ(exact.provenance, Provenance::kMeasured);
  EXPECT_NEAR(exact.time_s, synthetic_gemm_time_s(2048, 4096, 1024), 1e-12);

  const OpCost nearby = model.gemm(3000, 5000, 1500);
  EXPECT_EQ(nearby.provenance, Provenance::kInterpolated);
  EXPECT_NEAR(nearby.time_s / synthetic_gemm_time_s(3000, 5000, 1500), 1.0, 0.10);
  EXPECT_EQ(model.gemm(3000, 5000, 1500).time_s, nearby.time_s);  // cached, same answer

  const OpCost far = model.gemm(65536, 65536, 65536);
  EXPECT_EQ(far.provenance, Provenance::kFitted);
  // Beyond the measured box the surface is flat: the efficiency of the largest measured shape.
  const double far_truth_at_edge =
      2.0 * 65536.0 * 65536 * 65536 / (989.4e12 * synthetic_gemm_efficiency(8192, 8192, 8192));
  EXPECT_NEAR(far.time_s / far_truth_at_edge, 1.0, 0.10);

  // Another dtype has no measurements: analytic (FP8 instead is transferred from bf16: fp8_cost_test.cpp).
  EXPECT_EQ(model.gemm(2048, 4096, 1024, DType::kFP16).provenance, Provenance::kAnalytic);
  // Monotone in m across the measured range and beyond.
  double previous = 0;
  for (std::int64_t m = 128; m <= 131072; m = m * 3 / 2) {
    const double time_s = model.gemm(m, 4096, 4096).time_s;
    EXPECT_GT(time_s, previous) << "m=" << m;
    previous = time_s;
  }
}

TEST(GemmCost, FewMeasurementsFarAwayFallBackToAnalytic) {
  Database database = open_in_memory_cost_database();
  upsert_kernel_timing(database, gemm_row(1024, 1024, 1024));
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.sources().in_memory_fits, 0);
  EXPECT_EQ(model.gemm(1024, 1024, 1024).provenance, Provenance::kMeasured);
  EXPECT_EQ(model.gemm(1500, 1024, 1024).provenance, Provenance::kInterpolated);
  EXPECT_EQ(model.gemm(16384, 16384, 16384).provenance, Provenance::kAnalytic);
}

TEST(GemmCost, NewestMeasurementOfAShapeWins) {
  Database database = open_in_memory_cost_database();
  KernelTiming old_row = gemm_row(1024, 1024, 1024);
  old_row.median_s = 1.0;
  old_row.measured_at = "2026-01-01T00:00:00Z";
  old_row.versions.cublas = "12.0";
  KernelTiming new_row = gemm_row(1024, 1024, 1024);
  new_row.median_s = 2e-4;
  new_row.measured_at = "2026-11-01T00:00:00Z";
  new_row.versions.cublas = "13.1";
  upsert_kernel_timing(database, new_row);
  upsert_kernel_timing(database, old_row);
  CostModel model(database, h100_cluster());
  EXPECT_NEAR(model.gemm(1024, 1024, 1024).time_s, 2e-4, 1e-12);
}

TEST(Fitting, GemmSurfaceFitsSyntheticDataAndIsStored) {
  Database database = open_in_memory_cost_database();
  fill_gemm_grid(database);
  const std::vector<FittedModel> fitted = fit_and_store(database, "H100");
  ASSERT_EQ(fitted.size(), 1u);
  EXPECT_EQ(fitted[0].model_kind, kFitGemmEfficiency);
  EXPECT_EQ(fitted[0].variant, "bf16");
  EXPECT_EQ(fitted[0].n_points, 216);
  EXPECT_GT(fitted[0].r2, 0.99);
  EXPECT_LT(fitted[0].mape, 0.03);
  ASSERT_EQ(load_fitted_models(database, "H100 SXM").size(), 1u);
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.sources().stored_fits, 1);
  EXPECT_EQ(model.sources().in_memory_fits, 0);
  EXPECT_EQ(model.gemm(100000, 300, 300).provenance, Provenance::kFitted);
}

TEST(Fitting, SurfaceRecoversAKnownLogitQuadratic) {
  std::vector<EfficiencySurface::Sample> samples;
  for (double a = 1; a <= 1024; a *= 2) {
    for (double b = 1; b <= 1024; b *= 4) {
      const double x = std::log(a), y = std::log(b);
      const double logit = -1.0 + 0.3 * x - 0.2 * y + 0.01 * x * y - 0.02 * x * x;
      samples.push_back({{a, b, 1, 1}, 1.0 / (1.0 + std::exp(-logit)), 1.0});
    }
  }
  FitQuality quality;
  const EfficiencySurface surface = EfficiencySurface::fit(samples, 2, &quality);
  EXPECT_GT(quality.r2, 0.9999);
  EXPECT_LT(quality.mape, 1e-4);
  for (const auto& sample : samples) EXPECT_NEAR(surface.efficiency(sample.shape), sample.efficiency, 1e-4);
  const EfficiencySurface reloaded = EfficiencySurface::from_json(surface.to_json());
  EXPECT_DOUBLE_EQ(reloaded.efficiency({37, 5, 1, 1}), surface.efficiency({37, 5, 1, 1}));
  EXPECT_THROW(EfficiencySurface::fit({samples.begin(), samples.begin() + 3}, 2, nullptr),
               std::invalid_argument);
  EXPECT_THROW(EfficiencySurface::from_json("{\"form\":\"latency_bandwidth\"}"), std::runtime_error);
}

TEST(Fitting, LatencyBandwidthLineIsRecovered) {
  std::vector<std::pair<double, double>> points;
  for (double bytes = 1024; bytes <= (1 << 30); bytes *= 4) points.emplace_back(bytes, 7e-6 + bytes / 3e11);
  FitQuality quality;
  const LinearTimeModel model = LinearTimeModel::fit(points, &quality);
  EXPECT_NEAR(model.latency_s, 7e-6, 1e-9);
  EXPECT_NEAR(model.seconds_per_byte * 3e11, 1.0, 1e-6);
  EXPECT_GT(quality.r2, 0.999999);
  const LinearTimeModel reloaded = LinearTimeModel::from_json(model.to_json());
  EXPECT_DOUBLE_EQ(reloaded.time_s(12345), model.time_s(12345));
  EXPECT_THROW(LinearTimeModel::fit({{1.0, 1.0}}, nullptr), std::invalid_argument);
  // Pure bandwidth data: the latency is clamped at zero rather than going negative.
  const LinearTimeModel bandwidth_only =
      LinearTimeModel::fit({{1e3, 1e-9}, {1e6, 1e-6}, {1e9, 1e-3}}, nullptr);
  EXPECT_GE(bandwidth_only.latency_s, 0);
}

layouts::AttentionShape attention_shape(std::int64_t batch, std::int64_t heads, std::int64_t seq,
                                        std::int64_t head_dim, bool causal = true) {
  layouts::AttentionShape shape;
  shape.batch = batch;
  shape.heads = heads;
  shape.kv_heads = heads / 4;
  shape.seq_q = seq;
  shape.seq_kv = seq;
  shape.head_dim = head_dim;
  shape.causal = causal;
  return shape;
}

TEST(AttentionCost, AnalyticHalvesCausalAndBackwardIsTwoAndAHalfForward) {
  const auto model = analytic_h100_model();
  const double launch = model->defaults().kernel_launch_latency_s;
  const auto causal = attention_shape(2, 32, 4096, 128, true);
  const auto full = attention_shape(2, 32, 4096, 128, false);
  const OpCost forward = model->attention_forward(causal);
  EXPECT_EQ(forward.provenance, Provenance::kAnalytic);
  const double flops = 4.0 * 2 * 32 * 4096.0 * 4096 * 128 / 2;
  EXPECT_NEAR(forward.time_s, flops / (989.4e12 * model->defaults().attention_forward_efficiency) + launch,
              1e-9);
  EXPECT_NEAR(model->attention_forward(full).time_s - launch, 2 * (forward.time_s - launch), 1e-9);
  EXPECT_NEAR(model->attention_backward(causal).time_s - launch, 2.5 * (forward.time_s - launch), 1e-9);
  EXPECT_LT(model->attention_forward(attention_shape(2, 32, 2048, 128)).time_s, forward.time_s);
}

TEST(AttentionCost, ProvenanceFollowsTheMeasurements) {
  Database database = open_in_memory_cost_database();
  auto efficiency = [](double bh, double seq, double head_dim) {
    return 0.6 / (1.0 + std::exp(-(0.5 * std::log(bh / 4) + 0.7 * std::log(seq / 512) +
                                   0.3 * std::log(head_dim / 64) - 1)));
  };
  {
    Transaction transaction(database);
    for (const char* kind : {"attention_fwd", "attention_bwd"}) {
      for (std::int64_t heads = 8; heads <= 64; heads *= 2) {
        for (std::int64_t seq = 512; seq <= 8192; seq *= 2) {
          for (std::int64_t head_dim : {64, 128}) {
            const auto shape = attention_shape(1, heads, seq, head_dim);
            const bool backward = std::string(kind) == "attention_bwd";
            KernelTiming row;
            row.op_kind = kind;
            row.batch = 1;
            row.heads = heads;
            row.kv_heads = heads / 4;
            row.seq_q = row.seq_kv = seq;
            row.head_dim = head_dim;
            row.causal = true;
            row.gpu = "H100 SXM";
            row.median_s =
                AttentionCostModel::flops(
                    backward ? AttentionDirection::kBackward : AttentionDirection::kForward, shape) /
                (989.4e12 * efficiency(heads, seq, head_dim));
            upsert_kernel_timing(database, row);
          }
        }
      }
    }
    transaction.commit();
  }
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.sources().attention_measurements, 2 * 4 * 5 * 2);
  EXPECT_EQ(model.sources().in_memory_fits, 2);
  const auto measured = attention_shape(1, 16, 2048, 128);
  EXPECT_EQ(model.attention_forward(measured).provenance, Provenance::kMeasured);
  EXPECT_EQ(model.attention_backward(measured).provenance, Provenance::kMeasured);
  // batch 2 x 12 heads = 24 "batch-heads", between 16 and 32: interpolated.
  const auto nearby = attention_shape(2, 12, 3000, 128);
  const OpCost interpolated = model.attention_forward(nearby);
  EXPECT_EQ(interpolated.provenance, Provenance::kInterpolated);
  const double truth = AttentionCostModel::flops(AttentionDirection::kForward, nearby) /
                       (989.4e12 * efficiency(24, 3000, 128));
  EXPECT_NEAR(interpolated.time_s / truth, 1.0, 0.1);
  EXPECT_EQ(model.attention_forward(attention_shape(8, 64, 131072, 128)).provenance, Provenance::kFitted);
  // Not measured without the causal mask: analytic.
  EXPECT_EQ(model.attention_forward(attention_shape(1, 16, 2048, 128, false)).provenance,
            Provenance::kAnalytic);
}

TEST(MemoryBoundCost, ProvenanceAndBandwidth) {
  const auto empty = analytic_h100_model();
  const OpCost analytic = empty->memory_bound(OpKind::kNorm, 1e9);
  EXPECT_EQ(analytic.provenance, Provenance::kAnalytic);
  EXPECT_NEAR(analytic.time_s, 3e-6 + 1e9 / (3.35e12 * 0.8), 1e-12);
  EXPECT_LT(empty->memory_bound(OpKind::kNorm, 1e6).time_s, analytic.time_s);
  EXPECT_EQ(empty->memory_bound(OpKind::kNorm, 0).time_s, 0);

  Database database = open_in_memory_cost_database();
  for (std::int64_t bytes = 1 << 16; bytes <= (1 << 28); bytes *= 4) {
    KernelTiming row;
    row.op_kind = "norm";
    row.bytes = bytes;
    row.gpu = "H100 SXM";
    row.median_s = 4e-6 + static_cast<double>(bytes) / 2.8e12;
    upsert_kernel_timing(database, row);
  }
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.memory_bound(OpKind::kNorm, 1 << 20).provenance, Provenance::kMeasured);
  const OpCost between = model.memory_bound(OpKind::kNorm, 3e6);
  EXPECT_EQ(between.provenance, Provenance::kInterpolated);
  EXPECT_NEAR(between.time_s / (4e-6 + 3e6 / 2.8e12), 1.0, 0.05);
  const OpCost beyond = model.memory_bound(OpKind::kNorm, 1e10);
  EXPECT_EQ(beyond.provenance, Provenance::kFitted);
  EXPECT_NEAR(beyond.time_s / (4e-6 + 1e10 / 2.8e12), 1.0, 0.01);
  EXPECT_EQ(model.memory_bound(OpKind::kRope, 1e6).provenance, Provenance::kAnalytic);
}

TEST(CollectiveCost, AnalyticRingAllReduceIsLatencyPlusTwoNMinusOneOverN) {
  const auto model = CostModel::from_embedded(h100_cluster());
  const CollectiveCostModel& collectives = model->collective_model();
  const double bandwidth = collectives.intra_node_bus_bandwidth_bytes_per_s();
  EXPECT_DOUBLE_EQ(bandwidth, 450e9 * model->defaults().intra_node_bandwidth_efficiency);
  for (const int n : {2, 4, 8}) {
    for (const double bytes : {1e3, 1e6, 1e9}) {
      const OpCost cost = model->collective(CollectiveOp::kAllReduce, bytes, {n, 1});
      EXPECT_EQ(cost.provenance, Provenance::kAnalytic);
      EXPECT_NEAR(cost.time_s, collectives.intra_node_latency_s() + 2.0 * (n - 1) / n * bytes / bandwidth,
                  1e-12);
      const OpCost gather = model->collective(CollectiveOp::kAllGather, bytes, {n, 1});
      EXPECT_NEAR(gather.time_s, collectives.intra_node_latency_s() + (n - 1.0) / n * bytes / bandwidth,
                  1e-12);
    }
  }
  EXPECT_EQ(model->collective(CollectiveOp::kAllReduce, 1e9, {1, 1}).time_s, 0);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kAllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kAllToAll, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::kSendRecv, 2), 1.0);
}

TEST(CollectiveCost, AcrossNodesIsHierarchical) {
  const auto model = CostModel::from_embedded(h100_cluster());
  const CollectiveCostModel& c = model->collective_model();
  const double bytes = 1e9;
  const double intra_bw = c.intra_node_bus_bandwidth_bytes_per_s();
  const double inter_bw = c.inter_node_bus_bandwidth_bytes_per_s();
  const OpCost across = model->collective(CollectiveOp::kAllReduce, bytes, {16, 2});
  // Reduce-scatter and all-gather in the node share NVLink; the all-reduce over 2 nodes of the 1/8 shard
  // uses the network. NCCL pipelines them in 4 MiB chunks: the busier fabric sets the time, the other adds
  // one chunk's pass.
  const double nvlink_s = 2 * 7.0 / 8 * bytes / intra_bw;
  const double network_s = 2.0 * 1 / 2 * (bytes / 8) / inter_bw;
  const double latency_s = 2 * c.intra_node_latency_s() + c.inter_node_latency_s();
  const double chunk_fraction = 4.0 * 1024 * 1024 / bytes;
  EXPECT_NEAR(across.time_s,
              latency_s + std::max(nvlink_s, network_s) + std::min(nvlink_s, network_s) * chunk_fraction,
              1e-12);
  // Between the intra-node all-reduce and the naive sum of the three phases.
  EXPECT_GT(across.time_s, model->collective(CollectiveOp::kAllReduce, bytes, {8, 1}).time_s);
  EXPECT_LT(across.time_s, latency_s + nvlink_s + network_s - 1e-4);
  // A message of one chunk or less runs its phases one after the other.
  const double small = 1 << 20;
  EXPECT_NEAR(model->collective(CollectiveOp::kAllReduce, small, {16, 2}).time_s,
              latency_s + 2 * 7.0 / 8 * small / intra_bw + (small / 8) / inter_bw, 1e-12);
  // One rank per node: a flat ring over the network.
  const OpCost flat = model->collective(CollectiveOp::kAllReduce, bytes, {2, 2});
  EXPECT_NEAR(flat.time_s, c.inter_node_latency_s() + bytes / inter_bw, 1e-12);
  // TP of 8 inside a node beats TP of 8 over 8 nodes.
  EXPECT_LT(model->collective(CollectiveOp::kAllGather, 1e8, {8, 1}).time_s,
            model->collective(CollectiveOp::kAllGather, 1e8, {8, 8}).time_s);
  EXPECT_GT(model->collective(CollectiveOp::kSendRecv, 1e8, {2, 2}).time_s,
            model->collective(CollectiveOp::kSendRecv, 1e8, {2, 1}).time_s);
  EXPECT_GT(model->collective(CollectiveOp::kAllToAll, 1e8, {16, 2}).time_s,
            model->collective(CollectiveOp::kAllToAll, 1e8, {8, 1}).time_s);
  for (const CollectiveOp op :
       {CollectiveOp::kAllGather, CollectiveOp::kReduceScatter, CollectiveOp::kBroadcast}) {
    EXPECT_GT(model->collective(op, bytes, {16, 2}).time_s, model->collective(op, bytes, {8, 1}).time_s)
        << collective_op_name(op);
  }
}

TEST(CollectiveCost, ProvenanceFollowsTheMeasurements) {
  Database database = open_in_memory_cost_database();
  auto measured_time = [](double bytes) { return 12e-6 + bytes * 1.75 / 360e9; };
  for (std::int64_t bytes = 1 << 10; bytes <= (1 << 28); bytes *= 4) {
    CollectiveTiming row;
    row.op = "all_reduce";
    row.group_size = 8;
    row.bytes = bytes;
    row.gpu = "H100 SXM";
    row.median_s = measured_time(static_cast<double>(bytes));
    upsert_collective_timing(database, row);
  }
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.collective(CollectiveOp::kAllReduce, 1 << 20, {8, 1}).provenance, Provenance::kMeasured);
  const OpCost between = model.collective(CollectiveOp::kAllReduce, 3e6, {8, 1});
  EXPECT_EQ(between.provenance, Provenance::kInterpolated);
  EXPECT_NEAR(between.time_s / measured_time(3e6), 1.0, 0.05);
  const OpCost beyond = model.collective(CollectiveOp::kAllReduce, 4e9, {8, 1});
  EXPECT_EQ(beyond.provenance, Provenance::kFitted);
  EXPECT_NEAR(beyond.time_s / measured_time(4e9), 1.0, 0.01);
  EXPECT_EQ(model.collective(CollectiveOp::kAllReduce, 1e6, {4, 1}).provenance, Provenance::kAnalytic);
  // Across nodes, the intra-node levels of all-reduce are not measured here (reduce-scatter, all-gather).
  EXPECT_EQ(model.collective(CollectiveOp::kAllReduce, 1e6, {16, 2}).provenance, Provenance::kAnalytic);

  const std::vector<FittedModel> fitted = fit_and_store(database, "H100 SXM");
  ASSERT_EQ(fitted.size(), 1u);
  EXPECT_EQ(fitted[0].variant, "all_reduce:8:1");
  EXPECT_GT(fitted[0].r2, 0.9999);
  const LinearTimeModel line = LinearTimeModel::from_json(fitted[0].params_json);
  EXPECT_NEAR(line.latency_s, 12e-6, 1e-8);
  EXPECT_NEAR(1.75 / line.seconds_per_byte / 360e9, 1.0, 1e-4);  // bus bandwidth recovered
}

TEST(CostModel, PricesStepProgramOps) {
  const auto model = CostModel::from_embedded(h100_cluster());
  layouts::Op gemm;
  gemm.kind = OpKind::kGemm;
  gemm.m = 4096;
  gemm.n = 4096;
  gemm.k = 1024;
  EXPECT_EQ(model->price(gemm).time_s, model->gemm(4096, 4096, 1024).time_s);
  layouts::Op attention;
  attention.kind = OpKind::kAttentionBackward;
  attention.attention = attention_shape(1, 8, 1024, 64);
  EXPECT_EQ(model->price(attention).time_s, model->attention_backward(attention.attention).time_s);
  layouts::Op reduce;
  reduce.kind = OpKind::kAllReduce;
  reduce.bytes = 1 << 24;
  reduce.group_size = 4;
  EXPECT_EQ(model->price(reduce).time_s, model->collective(CollectiveOp::kAllReduce, 1 << 24, {4, 1}).time_s);
  EXPECT_EQ(model->price(reduce, {16, 2}).time_s,
            model->collective(CollectiveOp::kAllReduce, 1 << 24, {16, 2}).time_s);
  layouts::Op send;
  send.kind = OpKind::kSend;
  send.bytes = 1 << 20;
  send.group_size = 4;
  EXPECT_EQ(model->price(send, {4, 2}).time_s,
            model->collective(CollectiveOp::kSendRecv, 1 << 20, {2, 2}).time_s);
  layouts::Op optimizer;
  optimizer.kind = OpKind::kOptimizer;
  optimizer.bytes = 1 << 30;
  EXPECT_EQ(model->price(optimizer).time_s, model->memory_bound(OpKind::kOptimizer, 1 << 30).time_s);
  EXPECT_EQ(collective_group_of({0, 1, 8, 9}, 8).nodes, 2);
  EXPECT_EQ(collective_group_of({0, 1, 2, 3}, 8).nodes, 1);
}

TEST(CostModel, SharedByThreadsGivesTheSameAnswers) {
  Database database = open_in_memory_cost_database();
  fill_gemm_grid(database);
  CostModel model(database, h100_cluster());
  std::vector<double> results(2, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      double sum = 0;
      for (int repeat = 0; repeat < 20; ++repeat) {
        for (std::int64_t m = 300; m < 6000; m += 379) sum += model.gemm(m, 1000 + m / 3, 3000).time_s;
      }
      results[static_cast<std::size_t>(t)] = sum;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_GT(results[0], 0);
  EXPECT_EQ(results[0], results[1]);
}

}  // namespace
}  // namespace megatune::cost_models

namespace megatune::cost_models {
namespace {

TEST(CostModel, ReadsRowsThatNameTheGpuByAnAlias) {
  Database database = open_in_memory_cost_database();
  KernelTiming row = gemm_row(2048, 2048, 2048);
  row.gpu = "NVIDIA H100 80GB HBM3";
  upsert_kernel_timing(database, row);
  KernelTiming other = gemm_row(16384, 16384, 16384);
  other.gpu = "H200";  // another GPU: not read for an H100 cluster
  upsert_kernel_timing(database, other);
  CostModel model(database, h100_cluster());
  EXPECT_EQ(model.sources().gemm_measurements, 1);
  EXPECT_EQ(model.gemm(2048, 2048, 2048).provenance, Provenance::kMeasured);
  EXPECT_EQ(model.gemm(16384, 16384, 16384).provenance, Provenance::kAnalytic);
}

}  // namespace
}  // namespace megatune::cost_models

namespace megatune::cost_models {
namespace {

TEST(Fitting, RowsStoredUnderAnAliasAreFittedForTheCatalogGpu) {
  Database database = open_in_memory_cost_database();
  for (std::int64_t bytes = 1 << 12; bytes <= (1 << 24); bytes *= 4) {
    KernelTiming row;
    row.op_kind = "rope";
    row.bytes = bytes;
    row.gpu = "NVIDIA H100 80GB HBM3";
    row.median_s = 3e-6 + static_cast<double>(bytes) / 2e12;
    upsert_kernel_timing(database, row);
  }
  const auto fitted = fit_and_store(database, "NVIDIA H100 80GB HBM3");
  ASSERT_EQ(fitted.size(), 1u);
  EXPECT_EQ(fitted[0].gpu, "H100 SXM");
  EXPECT_EQ(fitted[0].variant, "rope");
  EXPECT_THROW(fit_and_store(database, "Quantum GPU"), UserError);
}

}  // namespace
}  // namespace megatune::cost_models
