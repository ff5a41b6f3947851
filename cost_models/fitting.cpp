// Fitting cost models from measured rows into fitted_models rows, and fitting everything of one GPU.
#include "cost_models/fitting.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "cost_models/attention_cost_model.h"
#include "cost_models/fitted_forms.h"
#include "cost_models/gemm_cost_model.h"
#include "cost_models/hardware_catalog.h"
#include "cost_models/memory_bound_cost_model.h"
#include "cost_models/record_store.h"

namespace megatune::cost_models {
namespace {

// Rows of one shape measured under several software versions: the newest measurement wins.
std::vector<KernelTiming> newest_first_sorted(std::vector<KernelTiming> rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const KernelTiming& a, const KernelTiming& b) {
    return a.measured_at < b.measured_at;
  });
  return rows;
}

FittedModel row_of(const char* kind, const GpuModel& gpu, std::string variant, std::string params,
                   const FitQuality& quality) {
  FittedModel row;
  row.model_kind = kind;
  row.gpu = gpu.name;
  row.variant = std::move(variant);
  row.params_json = std::move(params);
  row.r2 = quality.r2;
  row.mape = quality.mape;
  row.n_points = quality.n_points;
  row.fitted_at = utc_now_iso8601();
  return row;
}

}  // namespace

std::string attention_fit_variant(bool backward, layouts::DType dtype, bool causal) {
  return std::string(backward ? "bwd" : "fwd") + ":" + dtype_name(dtype) + ":" + (causal ? "causal" : "full");
}

std::string collective_fit_variant(CollectiveOp op, int group_size, int nodes) {
  return std::string(collective_op_name(op)) + ":" + std::to_string(group_size) + ":" + std::to_string(nodes);
}

std::optional<FittedModel> fit_gemm_efficiency(const std::vector<KernelTiming>& rows, const GpuModel& gpu,
                                               layouts::DType dtype, int min_points) {
  GemmCostModel model(gpu, AnalyticDefaults{});
  for (const KernelTiming& row : newest_first_sorted(rows)) {
    if (row.op_kind == "gemm" && row.gpu == gpu.name && parse_dtype(row.dtype) == dtype)
      model.add_measurement(row);
  }
  const auto samples = model.samples(dtype);
  const int needed = std::max(min_points, EfficiencySurface::term_count(3));
  if (static_cast<int>(samples.size()) < needed) return std::nullopt;
  FitQuality quality;
  const EfficiencySurface surface = EfficiencySurface::fit(samples, 3, &quality);
  return row_of(kFitGemmEfficiency, gpu, dtype_name(dtype), surface.to_json(), quality);
}

std::optional<FittedModel> fit_attention_efficiency(const std::vector<KernelTiming>& rows,
                                                    const GpuModel& gpu, bool backward, layouts::DType dtype,
                                                    bool causal, int min_points) {
  AttentionCostModel model(gpu, AnalyticDefaults{});
  const std::string kind = backward ? "attention_bwd" : "attention_fwd";
  for (const KernelTiming& row : newest_first_sorted(rows)) {
    if (row.op_kind == kind && row.gpu == gpu.name && parse_dtype(row.dtype) == dtype &&
        row.causal == causal) {
      model.add_measurement(row);
    }
  }
  const AttentionDirection direction =
      backward ? AttentionDirection::kBackward : AttentionDirection::kForward;
  const auto samples = model.samples(direction, dtype, causal);
  const int needed = std::max(min_points, EfficiencySurface::term_count(4));
  if (static_cast<int>(samples.size()) < needed) return std::nullopt;
  FitQuality quality;
  const EfficiencySurface surface = EfficiencySurface::fit(samples, 4, &quality);
  return row_of(kFitAttentionEfficiency, gpu, attention_fit_variant(backward, dtype, causal),
                surface.to_json(), quality);
}

std::optional<FittedModel> fit_memory_bandwidth(const std::vector<KernelTiming>& rows, const GpuModel& gpu,
                                                const std::string& series, int min_points) {
  std::map<std::int64_t, double> newest;  // bytes -> time
  for (const KernelTiming& row : newest_first_sorted(rows)) {
    if (memory_bound_series(row) == series && row.gpu == gpu.name && row.bytes > 0 && row.median_s > 0) {
      newest[row.bytes] = row.median_s;
    }
  }
  if (static_cast<int>(newest.size()) < std::max(min_points, 2)) return std::nullopt;
  std::vector<std::pair<double, double>> points;
  for (const auto& [bytes, time_s] : newest) points.emplace_back(static_cast<double>(bytes), time_s);
  FitQuality quality;
  const LinearTimeModel model = LinearTimeModel::fit(points, &quality);
  return row_of(kFitMemoryBandwidth, gpu, series, model.to_json(), quality);
}

std::optional<FittedModel> fit_collective(const std::vector<CollectiveTiming>& rows, const GpuModel& gpu,
                                          CollectiveOp op, int group_size, int nodes, int min_points) {
  std::vector<CollectiveTiming> sorted = rows;
  std::stable_sort(sorted.begin(), sorted.end(), [](const CollectiveTiming& a, const CollectiveTiming& b) {
    return a.measured_at < b.measured_at;
  });
  std::map<std::int64_t, double> newest;
  for (const CollectiveTiming& row : sorted) {
    if (row.gpu == gpu.name && row.op == collective_op_name(op) && row.group_size == group_size &&
        std::clamp(row.nodes, 1, std::max(row.group_size, 1)) == nodes && row.bytes > 0 && row.median_s > 0) {
      newest[row.bytes] = row.median_s;
    }
  }
  if (static_cast<int>(newest.size()) < std::max(min_points, 2)) return std::nullopt;
  std::vector<std::pair<double, double>> points;
  for (const auto& [bytes, time_s] : newest) points.emplace_back(static_cast<double>(bytes), time_s);
  FitQuality quality;
  const LinearTimeModel model = LinearTimeModel::fit(points, &quality);
  return row_of(kFitCollective, gpu, collective_fit_variant(op, group_size, nodes), model.to_json(), quality);
}

std::vector<FittedModel> fit_and_store(Database& database, const std::string& gpu_name) {
  const HardwareCatalog catalog = HardwareCatalog::load(database);
  const GpuModel* found = catalog.find_gpu(gpu_name);
  const GpuModel& gpu = found != nullptr ? *found : HardwareCatalog::embedded().gpu(gpu_name);
  // Rows stored under the name as given (an alias such as "H200") count as rows of the catalog GPU.
  std::vector<KernelTiming> kernels = load_kernel_timings(database, gpu.name);
  std::vector<CollectiveTiming> collectives = load_collective_timings(database, gpu.name);
  if (gpu_name != gpu.name) {
    for (KernelTiming& row : load_kernel_timings(database, gpu_name)) {
      row.gpu = gpu.name;
      kernels.push_back(std::move(row));
    }
    for (CollectiveTiming& row : load_collective_timings(database, gpu_name)) {
      row.gpu = gpu.name;
      collectives.push_back(std::move(row));
    }
  }

  std::vector<FittedModel> fitted;
  std::set<layouts::DType> gemm_dtypes;
  std::set<std::tuple<bool, layouts::DType, bool>> attention_variants;
  std::set<std::string> memory_kinds;
  for (const KernelTiming& row : kernels) {
    if (row.op_kind == "gemm") {
      gemm_dtypes.insert(parse_dtype(row.dtype));
    } else if (row.op_kind == "attention_fwd" || row.op_kind == "attention_bwd") {
      attention_variants.insert({row.op_kind == "attention_bwd", parse_dtype(row.dtype), row.causal});
    } else if (row.bytes > 0) {
      memory_kinds.insert(memory_bound_series(row));
    }
  }
  for (const layouts::DType dtype : gemm_dtypes) {
    if (auto row = fit_gemm_efficiency(kernels, gpu, dtype)) fitted.push_back(std::move(*row));
  }
  for (const auto& [backward, dtype, causal] : attention_variants) {
    if (auto row = fit_attention_efficiency(kernels, gpu, backward, dtype, causal))
      fitted.push_back(std::move(*row));
  }
  for (const std::string& kind : memory_kinds) {
    if (auto row = fit_memory_bandwidth(kernels, gpu, kind)) fitted.push_back(std::move(*row));
  }
  std::set<std::tuple<CollectiveOp, int, int>> configs;
  for (const CollectiveTiming& row : collectives) {
    configs.insert(
        {parse_collective_op(row.op), row.group_size, std::clamp(row.nodes, 1, std::max(row.group_size, 1))});
  }
  for (const auto& [op, group_size, nodes] : configs) {
    if (auto row = fit_collective(collectives, gpu, op, group_size, nodes)) fitted.push_back(std::move(*row));
  }
  Transaction transaction(database);
  for (const FittedModel& row : fitted) upsert_fitted_model(database, row);
  transaction.commit();
  return fitted;
}

}  // namespace megatune::cost_models
