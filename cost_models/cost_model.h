// CostModel: the planner's one entry point for op prices on a cluster. Built once from a cost database
// (catalog rows, measurements, fitted parameters for the cluster's GPU), it answers from memory: no SQL
// after construction. Lookups of shapes not measured exactly are cached; the cache is guarded, so one
// CostModel may be shared by threads.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cost_models/attention_cost_model.h"
#include "cost_models/calibration.h"
#include "cost_models/cluster_spec.h"
#include "cost_models/collective_cost_model.h"
#include "cost_models/gemm_cost_model.h"
#include "cost_models/gpu_transfer.h"
#include "cost_models/memory_bound_cost_model.h"
#include "cost_models/op_cost.h"
#include "cost_models/sqlite_database.h"
#include "layouts/op.h"

namespace megatune::cost_models {

// What a CostModel was built from (for reports: "priced from 412 measured GEMMs on H200 SXM").
struct CostModelSources {
  int gemm_measurements = 0;
  int attention_measurements = 0;
  int memory_bound_measurements = 0;
  int collective_measurements = 0;
  int stored_fits = 0;     // fitted_models rows used
  int in_memory_fits = 0;  // fits made at construction because the database had measurements but no fit
  // The profiled GPU whose kernel prices were transferred (gpu_transfer.h), "" when none was.
  std::string kernels_transferred_from;
};

class CostModel {
 public:
  // Reads what `database` holds for `cluster.gpu.name` (when a shape was measured with several software
  // versions, the newest measurement wins). The cluster's GPU and fabric figures come from `cluster`.
  // When the database holds no kernel measurements or fits for this GPU, GEMM, attention and memory-bound
  // kernels are priced from the GPU with the most GEMM measurements there, transferred (gpu_transfer.h).
  CostModel(Database& database, const ClusterSpec& cluster, const AnalyticDefaults& defaults = {});
  // From the data compiled into the binary only: the catalog and any shipped measurements (embedded_data.h).
  static std::unique_ptr<CostModel> from_embedded(const ClusterSpec& cluster,
                                                  const AnalyticDefaults& defaults = {});
  ~CostModel();
  CostModel(const CostModel&) = delete;
  CostModel& operator=(const CostModel&) = delete;

  OpCost gemm(std::int64_t m, std::int64_t n, std::int64_t k,
              layouts::DType dtype = layouts::DType::kBF16) const;
  OpCost attention_forward(const layouts::AttentionShape& shape,
                           layouts::DType dtype = layouts::DType::kBF16) const;
  OpCost attention_backward(const layouts::AttentionShape& shape,
                            layouts::DType dtype = layouts::DType::kBF16) const;
  // A memory-bound kernel kind (kNorm, kRope, kOptimizer, ...) moving `bytes`, writing `dtype` (kFP8: an
  // FP8 cast, memory_bound_cost_model.h).
  OpCost memory_bound(layouts::OpKind kind, double bytes, layouts::DType dtype = layouts::DType::kBF16) const;
  OpCost collective(CollectiveOp op, double bytes, const CollectiveGroup& group) const;
  // Prices one step-program op, with the calibration when one is set (set_calibration). For a communication
  // op, `group` gives its size and the nodes it spans (nodes defaults to 1 when left at {0, 0}: size then
  // comes from op.group_size); kSend/kRecv are priced as one send_recv of op.bytes.
  OpCost price(const layouts::Op& op, CollectiveGroup group = {0, 0}) const;
  // The same without the calibration: the per-op models' own price.
  OpCost uncalibrated_price(const layouts::Op& op, CollectiveGroup group = {0, 0}) const;

  // Corrections fitted from traced runs (calibration.h), applied by price(); nullopt removes them. Set it
  // before sharing the model between threads.
  void set_calibration(std::optional<Calibration> calibration) { calibration_ = std::move(calibration); }
  const std::optional<Calibration>& calibration() const { return calibration_; }
  // The names the database's rows may give this GPU (its catalog name first, then aliases found there).
  const std::vector<std::string>& gpu_names() const { return gpu_names_; }

  const ClusterSpec& cluster() const { return cluster_; }
  const GpuModel& gpu() const { return cluster_.gpu; }
  const AnalyticDefaults& defaults() const { return defaults_; }
  const CostModelSources& sources() const { return sources_; }
  // The profiled GPU's model whose kernel prices this one transfers (nullptr when it prices its own).
  const CostModel* profiled_model() const { return profiled_.get(); }
  double peak_flops_per_s(layouts::DType dtype) const;

  // Per-op models (for reports and tests).
  const GemmCostModel& gemm_model() const { return gemm_; }
  const AttentionCostModel& attention_model() const { return attention_; }
  const MemoryBoundCostModel& memory_bound_model() const { return memory_bound_; }
  const CollectiveCostModel& collective_model() const { return collective_; }

 private:
  struct Cache;
  ClusterSpec cluster_;
  AnalyticDefaults defaults_;
  GemmCostModel gemm_;
  AttentionCostModel attention_;
  MemoryBoundCostModel memory_bound_;
  CollectiveCostModel collective_;
  CostModelSources sources_;
  std::vector<std::string> gpu_names_;
  std::optional<Calibration> calibration_;
  std::unique_ptr<Cache> cache_;
  // The profiled GPU's model and the transfer to this one, when kernels are transferred.
  std::unique_ptr<CostModel> profiled_;
  std::optional<GpuTransfer> transfer_;
  void attach_profiled_gpu(Database& database);
};

}  // namespace megatune::cost_models
