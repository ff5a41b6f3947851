// Fitting cost models from measurements: each fit_* turns measured rows of one GPU into a fitted_models
// row (parameters + fit quality); fit_and_store fits everything a GPU has enough data for and upserts it.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "cost_models/op_cost.h"
#include "cost_models/records.h"
#include "cost_models/sqlite_database.h"

namespace megatune::cost_models {

inline constexpr const char* kFitGemmEfficiency = "gemm_efficiency";
inline constexpr const char* kFitAttentionEfficiency = "attention_efficiency";
inline constexpr const char* kFitMemoryBandwidth = "memory_bandwidth";
inline constexpr const char* kFitCollective = "collective";

// Variant strings of fitted_models rows (records.h).
std::string attention_fit_variant(bool backward, layouts::DType dtype, bool causal);  // "fwd:bf16:causal"
std::string collective_fit_variant(CollectiveOp op, int group_size, int nodes);       // "all_reduce:8:1"

// Each returns nullopt when the rows hold fewer than `min_points` usable points for that variant.
// GEMM efficiency surface over (m, n, k) for `dtype`, from "gemm" rows of `gpu`.
std::optional<FittedModel> fit_gemm_efficiency(const std::vector<KernelTiming>& rows, const GpuModel& gpu,
                                               layouts::DType dtype, int min_points = 12);
// Attention efficiency surface over (batch*heads, seq_q, seq_kv, head_dim).
std::optional<FittedModel> fit_attention_efficiency(const std::vector<KernelTiming>& rows,
                                                    const GpuModel& gpu, bool backward, layouts::DType dtype,
                                                    bool causal, int min_points = 20);
// Latency + bytes / bandwidth for one memory-bound series ("norm", "elementwise:fp8": memory_bound_series).
std::optional<FittedModel> fit_memory_bandwidth(const std::vector<KernelTiming>& rows, const GpuModel& gpu,
                                                const std::string& series, int min_points = 3);
// Latency + bytes x factor / busbw for one collective configuration.
std::optional<FittedModel> fit_collective(const std::vector<CollectiveTiming>& rows, const GpuModel& gpu,
                                          CollectiveOp op, int group_size, int nodes, int min_points = 3);

// Fits every variant with enough measurements of `gpu_name` and upserts the rows in one transaction.
std::vector<FittedModel> fit_and_store(Database& database, const std::string& gpu_name);

}  // namespace megatune::cost_models
