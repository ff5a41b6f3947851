// The shipped H200 profile (cost_models/data/h200_profile_*.csv, compiled in by cost_models/embedded_data):
// it names the catalog's H200 with sane timings, and makes the embedded cost model (what `megatune plan`
// uses on a GPU-less machine without a database) price measured shapes with measured provenance.
#include <gtest/gtest.h>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "cost_models/embedded_data.h"
#include "cost_models/record_store.h"

namespace megatune::cost_models {
namespace {

bool h200_profile_shipped() {
  for (const EmbeddedTable& table : embedded_tables())
    if (table.source_name.find("h200_profile") != std::string::npos && !table.csv_text.empty()) return true;
  return false;
}

TEST(ShippedProfile, HoldsH200KernelsAndTwoGpuCollectives) {
  if (!h200_profile_shipped()) GTEST_SKIP() << "no H200 profile shipped in this checkout";
  Database database = open_embedded_cost_database();
  const auto kernels = load_kernel_timings(database, "H200 SXM");
  const auto collectives = load_collective_timings(database, "H200 SXM");
  EXPECT_GT(kernels.size(), 100u);
  for (const KernelTiming& row : kernels) {
    EXPECT_GT(row.median_s, 0.0);
    EXPECT_LE(row.min_s, row.median_s);
    EXPECT_LE(row.median_s, row.max_s);
    EXPECT_FALSE(row.versions.cuda.empty());
  }
  bool all_reduce_1gib = false;
  for (const CollectiveTiming& row : collectives)
    all_reduce_1gib |= row.op == "all_reduce" && row.group_size == 2 && row.bytes == (std::int64_t(1) << 30);
  EXPECT_TRUE(all_reduce_1gib);
}

TEST(ShippedProfile, EmbeddedCostModelPricesMeasuredShapesAsMeasured) {
  if (!h200_profile_shipped()) GTEST_SKIP() << "no H200 profile shipped in this checkout";
  const auto model = CostModel::from_embedded(parse_cluster_spec("1x8xH200"));
  const OpCost gemm = model->gemm(8192, 8192, 8192);
  EXPECT_EQ(gemm.provenance, Provenance::kMeasured);
  const double tflops = 2.0 * 8192.0 * 8192.0 * 8192.0 / gemm.time_s / 1e12;
  EXPECT_GT(tflops, 500.0);
  EXPECT_LT(tflops, 989.4);
  EXPECT_NE(model->gemm(5000, 3000, 7000).provenance, Provenance::kAnalytic);
  EXPECT_GT(model->sources().gemm_measurements, 100);
}

}  // namespace
}  // namespace megatune::cost_models
