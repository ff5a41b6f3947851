// Hardware catalog (embedded data, aliases, installing into a database) and cluster parsing.
#include <gtest/gtest.h>

#include <fstream>

#include "base/user_error.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/cost_database.h"
#include "cost_models/embedded_data.h"
#include "cost_models/hardware_catalog.h"
#include "cost_models/plausible_ranges.h"
#include "cost_models/record_store.h"
#include "tests/cost_models/test_paths.h"

namespace megatune::cost_models {
namespace {

std::string cluster_error(const std::string& text) {
  try {
    parse_cluster_spec(text);
  } catch (const UserError& error) {
    return error.what();
  }
  return "";
}

TEST(HardwareCatalog, EmbeddedCatalogHasTheDatasheetFigures) {
  const HardwareCatalog& catalog = HardwareCatalog::embedded();
  const GpuModel& h100 = catalog.gpu("H100");
  EXPECT_EQ(h100.name, "H100 SXM");
  EXPECT_DOUBLE_EQ(h100.peak_bf16_tflops, 989.4);
  EXPECT_DOUBLE_EQ(h100.hbm_bandwidth_bytes_per_s, 3.35e12);
  EXPECT_NEAR(static_cast<double>(h100.memory_bytes) / (1LL << 30), 80, 1);
  EXPECT_EQ(h100.source, kSourceDatasheet);
  const GpuModel& h200 = catalog.gpu("h200-sxm");
  EXPECT_DOUBLE_EQ(h200.peak_bf16_tflops, 989.4);
  EXPECT_DOUBLE_EQ(h200.hbm_bandwidth_bytes_per_s, 4.8e12);
  EXPECT_NEAR(static_cast<double>(h200.memory_bytes) / 1e9, 141, 10);
  EXPECT_DOUBLE_EQ(catalog.gpu("A100 40GB").hbm_bandwidth_bytes_per_s, 1.555e12);
  EXPECT_DOUBLE_EQ(catalog.gpu("A100 80GB").hbm_bandwidth_bytes_per_s, 2.039e12);
  EXPECT_DOUBLE_EQ(catalog.gpu("A100").peak_bf16_tflops, 312);
  EXPECT_DOUBLE_EQ(catalog.gpu("b200").peak_bf16_tflops, 2250);
  EXPECT_EQ(catalog.gpu("NVIDIA H100 80GB HBM3").name, "H100 SXM");  // CUDA device names
  EXPECT_EQ(catalog.gpu("NVIDIA H200").name, "H200 SXM");
  EXPECT_EQ(catalog.gpu("NVIDIA A100-SXM4-40GB").name, "A100 SXM 40GB");
  EXPECT_DOUBLE_EQ(catalog.gpu("B200").hbm_bandwidth_bytes_per_s, 8e12);
  EXPECT_DOUBLE_EQ(catalog.interconnect("NVLink4").bandwidth_per_direction_bytes_per_s, 450e9);
  EXPECT_EQ(catalog.interconnect("nvlink 4").domain_size, 8);
  EXPECT_DOUBLE_EQ(catalog.interconnect("NVLink3").bandwidth_per_direction_bytes_per_s, 300e9);
  EXPECT_DOUBLE_EQ(catalog.interconnect("NVLink5").bandwidth_per_direction_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(catalog.interconnect("NDR400").bandwidth_per_direction_bytes_per_s, 50e9);
  EXPECT_DOUBLE_EQ(catalog.interconnect("IB NDR400").latency_s, 5e-6);
  for (const GpuModel& gpu : catalog.gpus()) EXPECT_EQ(gpu.source, kSourceDatasheet) << gpu.name;
}

TEST(HardwareCatalog, PeakPerDtype) {
  const HardwareCatalog& catalog = HardwareCatalog::embedded();
  EXPECT_DOUBLE_EQ(peak_tflops(catalog.gpu("H100"), layouts::DType::kFP8), 1978.9);
  EXPECT_DOUBLE_EQ(peak_tflops(catalog.gpu("H100"), layouts::DType::kFP32), 494.7);  // TF32 tensor cores
  EXPECT_THROW(peak_tflops(catalog.gpu("A100"), layouts::DType::kFP8), UserError);
}

TEST(HardwareCatalog, EveryGenerationHasItsDatasheetFigures) {
  const HardwareCatalog& catalog = HardwareCatalog::embedded();
  EXPECT_DOUBLE_EQ(catalog.gpu("V100 16GB").peak_fp16_tflops, 125);
  EXPECT_EQ(catalog.gpu("V100").memory_bytes, 34359738368);
  EXPECT_DOUBLE_EQ(catalog.gpu("Tesla V100-SXM2-16GB").hbm_bandwidth_bytes_per_s, 0.9e12);
  EXPECT_THROW(peak_tflops(catalog.gpu("V100"), layouts::DType::kFP8), UserError);
  EXPECT_DOUBLE_EQ(peak_tflops(catalog.gpu("V100"), layouts::DType::kFP32), 15.7);  // no TF32 cores
  EXPECT_DOUBLE_EQ(catalog.gpu("H100 PCIe").peak_bf16_tflops, 756);
  EXPECT_DOUBLE_EQ(catalog.gpu("A100 80GB SXM").hbm_bandwidth_bytes_per_s, 2.039e12);
  EXPECT_DOUBLE_EQ(catalog.interconnect("NVLink2").bandwidth_per_direction_bytes_per_s, 150e9);
  for (const char* name : {"V100 SXM2 16GB", "V100 SXM2 32GB", "A100 SXM 40GB", "A100 SXM 80GB", "H100 SXM",
                           "H100 PCIe", "H200 SXM", "B200"}) {
    const GpuModel& gpu = catalog.gpu(name);
    EXPECT_NO_THROW(check_plausible("peak_bf16_tflops", gpu.peak_bf16_tflops, name));
    EXPECT_NO_THROW(check_plausible("memory_bytes", static_cast<double>(gpu.memory_bytes), name));
    EXPECT_NO_THROW(check_plausible("hbm_bandwidth_bytes_per_s", gpu.hbm_bandwidth_bytes_per_s, name));
    // The ridge point of a datasheet GPU lies between 50 and 500 FLOP per byte.
    const double ridge_flops_per_byte = gpu.peak_bf16_tflops * 1e12 / gpu.hbm_bandwidth_bytes_per_s;
    EXPECT_GT(ridge_flops_per_byte, 50) << name;
    EXPECT_LT(ridge_flops_per_byte, 500) << name;
    const Interconnect& nvlink = catalog.interconnect(gpu.default_intra_node_interconnect);
    const Interconnect& network = catalog.interconnect(gpu.default_inter_node_interconnect);
    EXPECT_NO_THROW(check_plausible("bandwidth_per_direction_bytes_per_s",
                                    nvlink.bandwidth_per_direction_bytes_per_s, name));
    EXPECT_NO_THROW(check_plausible("bandwidth_per_direction_bytes_per_s",
                                    network.bandwidth_per_direction_bytes_per_s, name));
    EXPECT_GT(nvlink.bandwidth_per_direction_bytes_per_s, network.bandwidth_per_direction_bytes_per_s)
        << name;
  }
}

TEST(HardwareCatalog, UnknownNamesListTheKnownOnes) {
  try {
    HardwareCatalog::embedded().gpu("K80");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("H100 SXM"), std::string::npos);
  }
  EXPECT_EQ(HardwareCatalog::embedded().find_interconnect("Token Ring"), nullptr);
}

TEST(HardwareCatalog, InstallKeepsMeasuredFigures) {
  Database database = open_in_memory_cost_database();
  GpuModel measured = HardwareCatalog::embedded().gpu("H200");
  measured.hbm_bandwidth_bytes_per_s = 4.1e12;
  measured.source = kSourceMeasured;
  upsert_gpu_model(database, measured);
  const HardwareCatalog& embedded = HardwareCatalog::embedded();
  EXPECT_EQ(embedded.install_into(database),
            static_cast<int>(embedded.gpus().size() + embedded.interconnects().size()) - 1);
  const HardwareCatalog loaded = HardwareCatalog::load(database);
  EXPECT_EQ(loaded.gpus().size(), embedded.gpus().size());
  EXPECT_DOUBLE_EQ(loaded.gpu("H200").hbm_bandwidth_bytes_per_s, 4.1e12);
  EXPECT_EQ(loaded.gpu("H200").source, kSourceMeasured);
  EXPECT_EQ(loaded.gpu("H100"), embedded.gpu("H100"));
}

TEST(HardwareCatalog, BadCatalogJsonIsOneClearLine) {
  EXPECT_THROW(HardwareCatalog::from_json("{\"gpus\": [{\"name\": \"X\"}]}", "c.json"), UserError);
  EXPECT_THROW(HardwareCatalog::from_json("{\"gpus\": [", "c.json"), UserError);
  try {
    HardwareCatalog::from_json(
        "{\"gpus\": [{\"name\": \"X\", \"peak_bf16_tflops\": 1, \"memory_bytes\": 1, "
        "\"hbm_bandwidth_bytes_per_s\": 1, \"default_intra_node_interconnect\": \"Warp\"}]}",
        "c.json");
    FAIL();
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("\"Warp\""), std::string::npos) << error.what();
  }
}

TEST(ClusterSpec, ParsesTheShortForm) {
  const ClusterSpec cluster = parse_cluster_spec("4x8xH100");
  EXPECT_EQ(cluster.nodes, 4);
  EXPECT_EQ(cluster.gpus_per_node, 8);
  EXPECT_EQ(cluster.world_size(), 32);
  EXPECT_EQ(cluster.gpu.name, "H100 SXM");
  EXPECT_EQ(cluster.intra_node.name, "NVLink4");
  EXPECT_EQ(cluster.inter_node.name, "InfiniBand NDR400");
  EXPECT_EQ(cluster.short_name(), "4x8xH100 SXM");
  EXPECT_EQ(parse_cluster_spec(cluster.short_name()).gpu.name, "H100 SXM");
  EXPECT_EQ(parse_cluster_spec(" 1X2Xh200-sxm ").gpu.name, "H200 SXM");
  EXPECT_EQ(parse_cluster_spec("2x4xA100 40GB").intra_node.name, "NVLink3");
  EXPECT_EQ(parse_cluster_spec("1x8xB200").intra_node.name, "NVLink5");
}

TEST(ClusterSpec, RejectsBadShortForms) {
  EXPECT_NE(cluster_error("").find("empty"), std::string::npos);
  EXPECT_NE(cluster_error("8xH100").find("NODESxGPUSxTYPE"), std::string::npos);
  EXPECT_NE(cluster_error("0x8xH100").find("at least 1"), std::string::npos);
  EXPECT_NE(cluster_error("ax8xH100").find("node count"), std::string::npos);
  EXPECT_NE(cluster_error("2x-8xH100").find("GPUs per node"), std::string::npos);
  EXPECT_NE(cluster_error("2x8xK80").find("unknown GPU"), std::string::npos);
  EXPECT_NE(cluster_error("1x16xH100").find("exceed the NVLink4 domain of 8"), std::string::npos);
  EXPECT_NE(cluster_error("2x8x").find("NODESxGPUSxTYPE"), std::string::npos);
  EXPECT_NE(cluster_error("99999999x8xH100").find("node count"), std::string::npos);
}

TEST(ClusterSpec, ParsesAClusterFile) {
  testing::TemporaryDirectory directory;
  const std::string path = directory.file("cluster.json");
  {
    std::ofstream file(path);
    file << R"({"nodes": 2, "gpus_per_node": 4, "gpu": "A100 80GB", "inter_node_interconnect": "RoCE 400G",
               "gpu_overrides": {"memory_bytes": 80000000000},
               "inter_node_overrides": {"latency_s": 1e-5}})";
  }
  const ClusterSpec cluster = parse_cluster_spec(path);
  EXPECT_EQ(cluster.nodes, 2);
  EXPECT_EQ(cluster.gpus_per_node, 4);
  EXPECT_EQ(cluster.gpu.name, "A100 SXM 80GB");
  EXPECT_EQ(cluster.gpu.memory_bytes, 80000000000);
  EXPECT_EQ(cluster.intra_node.name, "NVLink3");
  EXPECT_EQ(cluster.inter_node.name, "RoCE 400G");
  EXPECT_DOUBLE_EQ(cluster.inter_node.latency_s, 1e-5);

  const std::string bad = directory.file("bad.json");
  {
    std::ofstream file(bad);
    file << R"({"nodes": 2, "gpu": "H100", "intra_node_interconnect": "InfiniBand NDR400"})";
  }
  EXPECT_NE(cluster_error(bad).find("is an inter-node network"), std::string::npos) << cluster_error(bad);
  {
    std::ofstream file(bad);
    file << R"({"nodes": 2.5, "gpu": "H100"})";
  }
  EXPECT_NE(cluster_error(bad).find("\"nodes\" must be a whole number"), std::string::npos);
  {
    std::ofstream file(bad);
    file << R"({"nodes": 2, )";
  }
  EXPECT_NE(cluster_error(bad).find("fix the JSON"), std::string::npos);
  EXPECT_NE(cluster_error(directory.file("missing.json")).find("does not exist"), std::string::npos);
}

}  // namespace
}  // namespace megatune::cost_models

namespace megatune::cost_models {
namespace {

TEST(EmbeddedData, ShippedTablesLoadIntoAFreshDatabase) {
  for (const EmbeddedTable& table : embedded_tables()) {
    EXPECT_NO_THROW(cost_database_table(table.table)) << table.source_name;
    EXPECT_NE(table.csv_text.find('\n'), std::string::npos) << table.source_name;
  }
  Database database = open_embedded_cost_database();
  EXPECT_EQ(load_gpu_models(database).size(), HardwareCatalog::embedded().gpus().size());
  EXPECT_EQ(load_interconnects(database).size(), HardwareCatalog::embedded().interconnects().size());
  std::int64_t shipped_rows = 0;
  for (const auto& [table, count] : table_row_counts(database)) {
    if (table != "gpu_models" && table != "interconnects") shipped_rows += count;
  }
  EXPECT_EQ(shipped_rows > 0, !embedded_tables().empty());
  // Installing twice is idempotent (upserts).
  const auto before = table_row_counts(database);
  install_embedded_data(database);
  EXPECT_EQ(table_row_counts(database), before);
}

// The one GPU-peak table: device names as CUDA reports them resolve through the catalog's aliases.
TEST(DevicePeak, CudaDeviceNamesResolveThroughTheCatalog) {
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("NVIDIA H200"), 989.4);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("NVIDIA H100 80GB HBM3"), 989.4);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("h100-sxm"), 989.4);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("NVIDIA H100 PCIe"), 756.0);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("NVIDIA H100 NVL"), 835.5);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("NVIDIA GH200 480GB"), 989.4);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("NVIDIA A100-SXM4-80GB"), 312.0);
  EXPECT_DOUBLE_EQ(device_peak_bf16_tflops("B200"), 2250.0);
  EXPECT_EQ(device_peak_bf16_tflops("NVIDIA GeForce RTX 4090"), 0.0);
  EXPECT_EQ(device_peak_bf16_tflops(""), 0.0);
}

}  // namespace
}  // namespace megatune::cost_models
