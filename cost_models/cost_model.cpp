// CostModel: loads one GPU's measurements and fits into the per-op models, then prices ops from memory.
#include "cost_models/cost_model.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/embedded_data.h"
#include "cost_models/fitted_forms.h"
#include "cost_models/fitting.h"
#include "cost_models/record_store.h"

namespace megatune::cost_models {
namespace {

// Splits "a:b:c" at ':'.
std::vector<std::string> split_variant(const std::string& variant) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t end = variant.find(':', start);
    parts.push_back(variant.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

struct PricedKey {
  std::array<std::int64_t, 4> shape;
  int variant;  // dtype, direction and causal packed
  bool operator==(const PricedKey&) const = default;
};

struct PricedKeyHash {
  std::size_t operator()(const PricedKey& key) const noexcept {
    return ShapeKeyHash{}(key.shape) * 31 + static_cast<std::size_t>(key.variant);
  }
};

}  // namespace

// Prices of GEMM and attention shapes of GPUs with measurements (finding that a shape has no measured
// neighbour scans the table, so every answer is kept). Bounded: cleared when it reaches kMaxCachedPrices.
constexpr std::size_t kMaxCachedPrices = 1 << 20;

struct CostModel::Cache {
  std::mutex mutex;
  std::unordered_map<PricedKey, OpCost, PricedKeyHash> prices;
};

namespace {
void remember(std::mutex& mutex, std::unordered_map<PricedKey, OpCost, PricedKeyHash>& prices,
              const PricedKey& key, const OpCost& cost) {
  std::lock_guard<std::mutex> lock(mutex);
  if (prices.size() >= kMaxCachedPrices) prices.clear();
  prices.emplace(key, cost);
}
}  // namespace

CostModel::CostModel(Database& database, const ClusterSpec& cluster, const AnalyticDefaults& defaults)
    : cluster_(cluster),
      defaults_(defaults),
      gemm_(cluster.gpu, defaults),
      attention_(cluster.gpu, defaults),
      memory_bound_(cluster.gpu, defaults),
      collective_(cluster, defaults),
      cache_(std::make_unique<Cache>()) {
  // Rows may name the GPU by an alias ("H200", "NVIDIA H200"): read every spelling that resolves to ours.
  std::vector<std::string> gpu_names{cluster_.gpu.name};
  {
    Statement names(database,
                    "SELECT gpu FROM kernel_timings UNION SELECT gpu FROM collective_timings UNION "
                    "SELECT gpu FROM fitted_models");
    while (names.step()) {
      std::string name = names.column_text(0);
      if (name == cluster_.gpu.name) continue;
      std::string stripped = name.rfind("NVIDIA ", 0) == 0 ? name.substr(7) : name;
      const GpuModel* known = HardwareCatalog::embedded().find_gpu(stripped);
      if (known != nullptr && known->name == cluster_.gpu.name) gpu_names.push_back(std::move(name));
    }
  }
  gpu_names_ = gpu_names;
  auto rows_of_all_names = [&](auto load) {
    auto rows = load(gpu_names.front());
    for (std::size_t i = 1; i < gpu_names.size(); ++i) {
      auto more = load(gpu_names[i]);
      for (auto& row : more) row.gpu = cluster_.gpu.name;
      rows.insert(rows.end(), more.begin(), more.end());
    }
    return rows;
  };
  // Oldest first, so that the newest measurement of a shape replaces older ones.
  std::vector<KernelTiming> kernels =
      rows_of_all_names([&](const std::string& name) { return load_kernel_timings(database, name); });
  std::stable_sort(kernels.begin(), kernels.end(), [](const KernelTiming& a, const KernelTiming& b) {
    return a.measured_at < b.measured_at;
  });
  std::set<layouts::DType> gemm_dtypes;
  std::set<std::tuple<AttentionDirection, layouts::DType, bool>> attention_variants;
  for (const KernelTiming& row : kernels) {
    if (row.op_kind == "gemm") {
      gemm_.add_measurement(row);
      gemm_dtypes.insert(parse_dtype(row.dtype));
      ++sources_.gemm_measurements;
    } else if (row.op_kind == "attention_fwd" || row.op_kind == "attention_bwd") {
      attention_.add_measurement(row);
      attention_variants.insert(
          {row.op_kind == "attention_fwd" ? AttentionDirection::kForward : AttentionDirection::kBackward,
           parse_dtype(row.dtype), row.causal});
      ++sources_.attention_measurements;
    } else if (row.bytes > 0) {
      memory_bound_.add_measurement(row);
      ++sources_.memory_bound_measurements;
    }
  }
  std::vector<CollectiveTiming> collectives =
      rows_of_all_names([&](const std::string& name) { return load_collective_timings(database, name); });
  std::stable_sort(
      collectives.begin(), collectives.end(),
      [](const CollectiveTiming& a, const CollectiveTiming& b) { return a.measured_at < b.measured_at; });
  std::set<std::tuple<CollectiveOp, int, int>> collective_configs;
  for (const CollectiveTiming& row : collectives) {
    collective_.add_measurement(row);
    collective_configs.insert(
        {parse_collective_op(row.op), row.group_size, std::clamp(row.nodes, 1, std::max(row.group_size, 1))});
    ++sources_.collective_measurements;
  }

  bool has_kernel_fits = false;
  for (const FittedModel& row :
       rows_of_all_names([&](const std::string& name) { return load_fitted_models(database, name); })) {
    try {
      const std::vector<std::string> parts = split_variant(row.variant);
      if (row.model_kind == kFitGemmEfficiency) {
        gemm_.set_fitted_surface(parse_dtype(row.variant), EfficiencySurface::from_json(row.params_json));
      } else if (row.model_kind == kFitAttentionEfficiency) {
        if (parts.size() != 3 || (parts[0] != "fwd" && parts[0] != "bwd"))
          throw std::runtime_error("bad variant");
        attention_.set_fitted_surface(
            parts[0] == "fwd" ? AttentionDirection::kForward : AttentionDirection::kBackward,
            parse_dtype(parts[1]), parts[2] == "causal", EfficiencySurface::from_json(row.params_json));
      } else if (row.model_kind == kFitMemoryBandwidth) {
        memory_bound_.set_fit(row.variant, LinearTimeModel::from_json(row.params_json));
      } else if (row.model_kind == kFitCollective) {
        if (parts.size() != 3) throw std::runtime_error("bad variant");
        collective_.set_fit(parse_collective_op(parts[0]), std::stoi(parts[1]), std::stoi(parts[2]),
                            LinearTimeModel::from_json(row.params_json));
      } else {
        continue;  // a model kind of a newer megatune: not ours to use
      }
      ++sources_.stored_fits;
      if (row.model_kind != kFitCollective) has_kernel_fits = true;
    } catch (const std::exception& error) {
      throw UserError("cost database " + database.path() + ": fitted model " + row.model_kind + "/" +
                      row.gpu + "/" + row.variant + " is unreadable (" + error.what() +
                      "); run `megatune db fit` again");
    }
  }

  // Measurements without a stored fit: fit in memory so unseen shapes get a fitted rather than analytic
  // price.
  for (const layouts::DType dtype : gemm_dtypes) {
    if (gemm_.has_fitted_surface(dtype)) continue;
    const auto samples = gemm_.samples(dtype);
    if (static_cast<int>(samples.size()) >=
        std::max(defaults_.min_points_for_fit, EfficiencySurface::term_count(3))) {
      gemm_.set_fitted_surface(dtype, EfficiencySurface::fit(samples, 3, nullptr));
      ++sources_.in_memory_fits;
    }
  }
  for (const auto& [direction, dtype, causal] : attention_variants) {
    if (attention_.has_fitted_surface(direction, dtype, causal)) continue;
    const auto samples = attention_.samples(direction, dtype, causal);
    if (static_cast<int>(samples.size()) >=
        std::max(defaults_.min_points_for_fit, EfficiencySurface::term_count(4))) {
      attention_.set_fitted_surface(direction, dtype, causal, EfficiencySurface::fit(samples, 4, nullptr));
      ++sources_.in_memory_fits;
    }
  }
  for (const auto& [kind, series] : memory_bound_.measured()) {
    if (memory_bound_.has_fit(kind) || series.size() < 3) continue;
    std::vector<std::pair<double, double>> points;
    for (const auto& [bytes, time_s] : series.points())
      points.emplace_back(static_cast<double>(bytes), time_s);
    memory_bound_.set_fit(kind, LinearTimeModel::fit(points, nullptr));
    ++sources_.in_memory_fits;
  }
  for (const auto& [op, group_size, nodes] : collective_configs) {
    if (collective_.has_fit(op, group_size, nodes)) continue;
    if (auto row = fit_collective(collectives, cluster_.gpu, op, group_size, nodes)) {
      collective_.set_fit(op, group_size, nodes, LinearTimeModel::from_json(row->params_json));
      ++sources_.in_memory_fits;
    }
  }
  const int kernel_measurements =
      sources_.gemm_measurements + sources_.attention_measurements + sources_.memory_bound_measurements;
  if (kernel_measurements == 0 && !has_kernel_fits) attach_profiled_gpu(database);
}

void CostModel::attach_profiled_gpu(Database& database) {
  const HardwareCatalog catalog = HardwareCatalog::load(database);
  Statement rows(database,
                 "SELECT gpu, COUNT(*) AS n FROM kernel_timings WHERE op_kind = 'gemm' GROUP BY gpu "
                 "ORDER BY n DESC, gpu");
  while (rows.step()) {
    const std::string name = rows.column_text(0);
    const std::string stripped = name.rfind("NVIDIA ", 0) == 0 ? name.substr(7) : name;
    const GpuModel* gpu = catalog.find_gpu(stripped);
    if (gpu == nullptr) gpu = HardwareCatalog::embedded().find_gpu(stripped);
    if (gpu == nullptr || gpu->name == cluster_.gpu.name) continue;
    ClusterSpec profiled_cluster = cluster_;
    profiled_cluster.gpu = *gpu;
    profiled_ = std::make_unique<CostModel>(database, profiled_cluster, defaults_);
    transfer_.emplace(*gpu, cluster_.gpu, defaults_.kernel_launch_latency_s);
    sources_.kernels_transferred_from = gpu->name;
    return;
  }
}

CostModel::~CostModel() = default;

std::unique_ptr<CostModel> CostModel::from_embedded(const ClusterSpec& cluster,
                                                    const AnalyticDefaults& defaults) {
  Database database = open_embedded_cost_database();
  return std::make_unique<CostModel>(database, cluster, defaults);
}

double CostModel::peak_flops_per_s(layouts::DType dtype) const {
  return peak_tflops(cluster_.gpu, dtype) * 1e12;
}

OpCost CostModel::gemm(std::int64_t m, std::int64_t n, std::int64_t k, layouts::DType dtype) const {
  if (transfer_) {
    const OpCost profiled = profiled_->gemm(m, n, k, dtype);
    if (profiled.provenance != Provenance::kAnalytic)
      return {transfer_->gemm_time_s(profiled.time_s, m, n, k, dtype), Provenance::kTransferred};
  }
  // Only an interpolation scans the measured table (of the dtype, or of bf16 for an FP8 GEMM priced from
  // it); every other price is cheaper than the cache lookup.
  const bool from_bf16 = dtype == layouts::DType::kFP8 && !gemm_.prices_fp8_from_records();
  if (!gemm_.has_measurements(from_bf16 ? layouts::DType::kBF16 : dtype)) return gemm_.cost(m, n, k, dtype);
  const PricedKey key{{m, n, k, 0}, static_cast<int>(dtype)};
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (const auto found = cache_->prices.find(key); found != cache_->prices.end()) return found->second;
  }
  const OpCost cost = gemm_.cost(m, n, k, dtype);
  remember(cache_->mutex, cache_->prices, key, cost);
  return cost;
}

namespace {
OpCost cached_attention(std::mutex& mutex, std::unordered_map<PricedKey, OpCost, PricedKeyHash>& prices,
                        const AttentionCostModel& model, AttentionDirection direction,
                        const layouts::AttentionShape& shape, layouts::DType dtype) {
  if (!model.has_measurements()) return model.cost(direction, shape, dtype);
  const int variant = 1000 + static_cast<int>(dtype) * 4 +
                      (direction == AttentionDirection::kBackward ? 2 : 0) + (shape.causal ? 1 : 0);
  const PricedKey key{AttentionCostModel::shape_key(shape), variant};
  // The key drops batch/heads individually but keeps their product, which is all the price depends on.
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto found = prices.find(key); found != prices.end()) return found->second;
  }
  const OpCost cost = model.cost(direction, shape, dtype);
  remember(mutex, prices, key, cost);
  return cost;
}
}  // namespace

OpCost CostModel::attention_forward(const layouts::AttentionShape& shape, layouts::DType dtype) const {
  if (transfer_) {
    const OpCost profiled = profiled_->attention_forward(shape, dtype);
    if (profiled.provenance != Provenance::kAnalytic) {
      return {transfer_->attention_time_s(profiled.time_s, AttentionDirection::kForward, shape, dtype),
              Provenance::kTransferred};
    }
  }
  return cached_attention(cache_->mutex, cache_->prices, attention_, AttentionDirection::kForward, shape,
                          dtype);
}

OpCost CostModel::attention_backward(const layouts::AttentionShape& shape, layouts::DType dtype) const {
  if (transfer_) {
    const OpCost profiled = profiled_->attention_backward(shape, dtype);
    if (profiled.provenance != Provenance::kAnalytic) {
      return {transfer_->attention_time_s(profiled.time_s, AttentionDirection::kBackward, shape, dtype),
              Provenance::kTransferred};
    }
  }
  return cached_attention(cache_->mutex, cache_->prices, attention_, AttentionDirection::kBackward, shape,
                          dtype);
}

OpCost CostModel::memory_bound(layouts::OpKind kind, double bytes, layouts::DType dtype) const {
  if (transfer_) {
    const OpCost profiled = profiled_->memory_bound(kind, bytes, dtype);
    if (profiled.provenance != Provenance::kAnalytic)
      return {transfer_->memory_bound_time_s(profiled.time_s), Provenance::kTransferred};
  }
  return memory_bound_.cost(kind, bytes, dtype);
}

OpCost CostModel::collective(CollectiveOp op, double bytes, const CollectiveGroup& group) const {
  return collective_.cost(op, bytes, group);
}

OpCost CostModel::price(const layouts::Op& op, CollectiveGroup group) const {
  const OpCost raw = uncalibrated_price(op, group);
  return calibration_ ? calibration_->apply(op, raw) : raw;
}

OpCost CostModel::uncalibrated_price(const layouts::Op& op, CollectiveGroup group) const {
  switch (op.kind) {
    case layouts::OpKind::kGemm:
      return gemm(op.m, op.n, op.k, op.dtype);
    case layouts::OpKind::kAttentionForward:
      return attention_forward(op.attention, op.dtype);
    case layouts::OpKind::kAttentionBackward:
      return attention_backward(op.attention, op.dtype);
    default:
      break;
  }
  if (op.is_communication()) {
    if (group.size <= 0) group = {op.group_size, 1};
    if (op.kind == layouts::OpKind::kSend || op.kind == layouts::OpKind::kRecv) {
      group.size = 2;
      group.nodes = std::clamp(group.nodes, 1, 2);
    }
    return collective(collective_op_of(op.kind), static_cast<double>(op.bytes), group);
  }
  return memory_bound(op.kind, static_cast<double>(op.bytes), op.dtype);
}

}  // namespace megatune::cost_models
