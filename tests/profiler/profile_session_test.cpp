// Profiling sessions over the synthetic device: rows written with their identity and device-timed medians,
// resumption (a second run measures nothing new; new software versions measure again), two writers
// sharing one database file, and fitting the planner's cost models from the measurements.
#include "profiler/profile_session.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <thread>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_database.h"
#include "cost_models/cost_model.h"
#include "cost_models/fitting.h"
#include "cost_models/record_store.h"
#include "profiler/sweep_builder.h"
#include "profiler/synthetic_device.h"

namespace megatune::profiler {
namespace {

DeviceIdentity identity(const std::string& commit = "abc1234") {
  DeviceIdentity id;
  id.gpu = "H200 SXM";
  id.interconnect = "NVLink4";
  id.versions = {"580.159.04", "13.0", "13.0.0", "2.28.3", commit};
  return id;
}

Sweep small_sweep() {
  Sweep sweep;
  sweep.gemms = {{4096, 4096, 4096}, {1024, 8192, 2048, GemmVariant::kBackwardWeight}};
  AttentionItem fwd;
  fwd.shape = {2, 32, 8, 2048, 2048, 128, true};
  AttentionItem bwd = fwd;
  bwd.backward = true;
  AttentionItem odd_head_dim = fwd;
  odd_head_dim.shape.head_dim = 96;  // no executor kernel: unsupported
  sweep.attention = {fwd, bwd, odd_head_dim};
  sweep.memory_bound = {{layouts::OpKind::kNorm, 64 << 20, 4096}};
  sweep.collectives = collective_sweep(2, true);
  return sweep;
}

TEST(ProfileSession, WritesDeviceTimedRowsAndResumes) {
  cost_models::Database database = cost_models::open_in_memory_cost_database();
  SyntheticDevice device({}, /*world_size=*/2);
  const Sweep sweep = small_sweep();
  const DeviceIdentity id = identity();

  Sweep pending = pending_items(database, sweep, id);
  EXPECT_EQ(pending.size(), sweep.size());
  int progress_calls = 0;
  const ProfileCounts kernels =
      run_kernel_sweep(database, device, pending, id, {2, 9}, [&](const ProfileProgress& p) {
        ++progress_calls;
        EXPECT_EQ(p.total, pending.kernel_count());
        EXPECT_LE(p.done, p.total);
      });
  EXPECT_EQ(kernels.measured, 5);
  EXPECT_EQ(kernels.unsupported, 1);
  EXPECT_EQ(progress_calls, 6);
  const ProfileCounts collectives = run_collective_sweep(&database, device, pending.collectives, id, {2, 9});
  EXPECT_EQ(collectives.measured, static_cast<int>(sweep.collectives.size()));

  const auto rows = cost_models::load_kernel_timings(database, "H200 SXM");
  ASSERT_EQ(rows.size(), 5u);
  for (const auto& row : rows) {
    EXPECT_EQ(row.versions, id.versions);
    EXPECT_EQ(row.repeats, 9);
    EXPECT_LE(row.min_s, row.median_s);
    EXPECT_LE(row.median_s, row.max_s);
    EXPECT_FALSE(row.measured_at.empty());
    if (row.op_kind == "gemm" && row.m == 4096) {
      // The median of device-timed repeats recovers the model's time within its 2% jitter.
      EXPECT_NEAR(row.median_s / device.ideal_gemm_s(sweep.gemms[0]), 1.0, 0.02);
    }
  }
  const auto collective_rows = cost_models::load_collective_timings(database, "H200 SXM");
  ASSERT_EQ(collective_rows.size(), sweep.collectives.size());
  EXPECT_EQ(collective_rows.front().interconnect, "NVLink4");
  EXPECT_EQ(collective_rows.front().group_size, 2);

  // Resumption: only the unsupported item (never stored) is left for the same GPU and software, and a
  // second run measures nothing; a new commit measures everything again.
  const Sweep again = pending_items(database, sweep, id);
  EXPECT_EQ(again.size(), 1u);
  EXPECT_EQ(again.attention.size(), 1u);
  const ProfileCounts second = run_kernel_sweep(database, device, again, id, {1, 3});
  EXPECT_EQ(second.measured, 0);
  EXPECT_EQ(second.unsupported, 1);
  EXPECT_EQ(cost_models::load_kernel_timings(database).size(), 5u);
  EXPECT_EQ(pending_items(database, sweep, identity("def5678")).size(), sweep.size());
}

TEST(ProfileSession, CollectiveBandwidthFollowsNcclTests) {
  const CollectiveItem all_reduce{cost_models::CollectiveOp::kAllReduce, 4, std::int64_t(1) << 30};
  const CollectiveBandwidth bw = collective_bandwidth(all_reduce, 0.01);
  EXPECT_DOUBLE_EQ(bw.algbw_bytes_per_s, double(1 << 30) / 0.01);
  EXPECT_DOUBLE_EQ(bw.busbw_bytes_per_s, bw.algbw_bytes_per_s * 2.0 * 3.0 / 4.0);
  const CollectiveItem send{cost_models::CollectiveOp::kSendRecv, 2, 1 << 20};
  EXPECT_DOUBLE_EQ(collective_bandwidth(send, 1e-3).busbw_bytes_per_s, double(1 << 20) / 1e-3);
}

TEST(ProfileSession, TwoWorkersShareOneDatabaseFile) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("megatune_profile_workers_" + std::to_string(::getpid()) + ".db");
  std::filesystem::remove(path);
  Sweep sweep = generic_kernel_grid(true);
  sweep.attention.clear();
  { cost_models::Database create = cost_models::open_cost_database(path.string()); }
  const DeviceIdentity id = identity();
  ProfileCounts counts[2];
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      cost_models::Database database = cost_models::open_cost_database(path.string());
      SyntheticDevice device;
      counts[w] = run_kernel_sweep(database, device, sweep, id, {1, 3}, {}, w, 2);
    });
  }
  for (std::thread& worker : workers) worker.join();
  EXPECT_EQ(counts[0].measured + counts[1].measured, static_cast<int>(sweep.kernel_count()));
  EXPECT_NEAR(counts[0].measured, counts[1].measured, 1);
  cost_models::Database database = cost_models::open_cost_database(path.string());
  EXPECT_EQ(cost_models::load_kernel_timings(database).size(), sweep.kernel_count());
  EXPECT_EQ(pending_items(database, sweep, id).size(), 0u);
  std::filesystem::remove(path);
  std::filesystem::remove(path.string() + "-wal");
  std::filesystem::remove(path.string() + "-shm");
}

TEST(ProfileSession, FitsFromSyntheticMeasurementsDrivePrices) {
  cost_models::Database database = cost_models::open_in_memory_cost_database();
  cost_models::HardwareCatalog::embedded().install_into(database);
  SyntheticDeviceSpec spec;
  spec.jitter = 0;
  SyntheticDevice device(spec, 2);
  Sweep sweep = generic_kernel_grid(true);
  sweep.collectives = collective_sweep(2, true);
  const DeviceIdentity id = identity();
  run_kernel_sweep(database, device, sweep, id, {1, 3});
  run_collective_sweep(&database, device, sweep.collectives, id, {1, 3});

  const auto fitted = cost_models::fit_and_store(database, "H200 SXM");
  std::set<std::string> kinds;
  for (const auto& row : fitted) {
    kinds.insert(row.model_kind);
    EXPECT_GT(row.n_points, 0);
  }
  EXPECT_TRUE(kinds.count(cost_models::kFitGemmEfficiency));
  EXPECT_TRUE(kinds.count(cost_models::kFitAttentionEfficiency));
  EXPECT_TRUE(kinds.count(cost_models::kFitMemoryBandwidth));
  EXPECT_TRUE(kinds.count(cost_models::kFitCollective));
  EXPECT_EQ(cost_models::load_fitted_models(database, "H200 SXM").size(), fitted.size());
  for (const auto& row : fitted) {
    if (row.model_kind == cost_models::kFitMemoryBandwidth || row.model_kind == cost_models::kFitCollective) {
      EXPECT_LT(row.mape, 0.05) << row.variant;  // latency + bytes / bandwidth is the synthetic law
    }
  }

  const cost_models::ClusterSpec cluster = cost_models::parse_cluster_spec("1x2xH200");
  const cost_models::CostModel model(database, cluster);
  const auto measured = model.gemm(8192, 8192, 8192);
  EXPECT_EQ(measured.provenance, cost_models::Provenance::kMeasured);
  EXPECT_NEAR(measured.time_s / device.ideal_gemm_s({8192, 8192, 8192}), 1.0, 1e-3);
  const auto unseen = model.gemm(3000, 7000, 50000);
  EXPECT_NE(unseen.provenance, cost_models::Provenance::kAnalytic);
  const auto all_reduce = model.collective(cost_models::CollectiveOp::kAllReduce, 1 << 30, {2, 1});
  EXPECT_EQ(all_reduce.provenance, cost_models::Provenance::kMeasured);
  EXPECT_NEAR(all_reduce.time_s / device.ideal_collective_s(
                                      {cost_models::CollectiveOp::kAllReduce, 2, std::int64_t(1) << 30}),
              1.0, 1e-3);
}

}  // namespace
}  // namespace megatune::profiler
