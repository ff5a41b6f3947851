// Rows of the cost database, one struct per table (schema in cost_database.cpp). Units live in the names.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace megatune::cost_models {

// Where a hardware figure comes from.
inline constexpr const char* kSourceDatasheet = "datasheet";
inline constexpr const char* kSourceMeasured = "measured";

// gpu_models: one GPU type. Natural key: name.
struct GpuModel {
  std::string name;               // "H100 SXM"
  double peak_bf16_tflops = 0;    // dense
  double peak_fp16_tflops = 0;    // dense
  double peak_fp8_tflops = 0;     // dense; 0 when the GPU has no FP8 tensor cores
  double peak_tf32_tflops = 0;    // dense
  double peak_fp32_tflops = 0;    // non-tensor-core
  std::int64_t memory_bytes = 0;  // device memory as the driver reports it
  double hbm_bandwidth_bytes_per_s = 0;
  std::string default_intra_node_interconnect;  // interconnects.name, e.g. "NVLink4"
  std::string default_inter_node_interconnect;  // interconnects.name, e.g. "InfiniBand NDR400"
  int default_gpus_per_node = 8;
  std::string source = kSourceDatasheet;  // "datasheet" | "measured"
  bool operator==(const GpuModel&) const = default;
};

// interconnects: an intra-node fabric (NVLink: domain of `domain_size` GPUs) or an inter-node network
// (domain_size 0). Bandwidths are per GPU and per direction. Natural key: name.
struct Interconnect {
  std::string name;  // "NVLink4", "InfiniBand NDR400"
  std::string kind;  // "intra_node" | "inter_node"
  int domain_size = 0;
  double bandwidth_per_direction_bytes_per_s = 0;
  double latency_s = 0;  // fixed cost of one collective over this fabric
  std::string source = kSourceDatasheet;
  bool operator==(const Interconnect&) const = default;
};

// Software that produced a measurement.
struct SoftwareVersions {
  std::string driver;
  std::string cuda;
  std::string cublas;
  std::string nccl;
  std::string commit;  // megatune git commit
  bool operator==(const SoftwareVersions&) const = default;
};

// kernel_timings: one measured kernel. `op_kind` uses layouts::op_kind_name ("gemm", "attention_fwd",
// "attention_bwd", "norm", "norm_bwd", "rope", ...). Unused shape fields stay 0. Natural key: op_kind,
// every shape field, dtype, gpu and versions; a re-measure replaces the row.
struct KernelTiming {
  std::string op_kind;
  std::int64_t m = 0, n = 0, k = 0;  // GEMM (m, k) x (k, n)
  std::int64_t batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_kv = 0, head_dim = 0;  // attention
  bool causal = false;                                                                   // attention
  std::int64_t bytes = 0;      // memory-bound kernels: bytes read + written
  std::string dtype = "bf16";  // "bf16" | "fp16" | "fp8" | "tf32" | "fp32"
  std::string gpu;             // gpu_models.name
  SoftwareVersions versions;
  double median_s = 0, min_s = 0, max_s = 0;
  int repeats = 0;
  std::string measured_at;  // ISO-8601 UTC
  bool operator==(const KernelTiming&) const = default;
};

// collective_timings: one measured NCCL collective, `bytes` in nccl-tests' convention (all-reduce,
// all-to-all, send/recv, broadcast: per-rank buffer; all-gather, reduce-scatter: the full gathered
// buffer). Natural key: op, group_size, placement, nodes, bytes, gpu, interconnect, versions.
struct CollectiveTiming {
  std::string
      op;  // "all_reduce" | "all_gather" | "reduce_scatter" | "all_to_all" | "send_recv" | "broadcast"
  int group_size = 0;
  std::string placement = "intra";  // "intra" (one node) | "inter" (spans nodes)
  int nodes = 1;                    // nodes the group spans
  std::int64_t bytes = 0;
  std::string gpu;
  std::string interconnect;  // interconnects.name of the fabric the group ran over ("" if unknown)
  SoftwareVersions versions;
  double median_s = 0, min_s = 0, max_s = 0;
  int repeats = 0;
  std::string measured_at;
  bool operator==(const CollectiveTiming&) const = default;
};

// fitted_models: parameters of a fitted cost model with its quality. Natural key: model_kind, gpu, variant.
//   model_kind "gemm_efficiency"       variant dtype ("bf16")
//   model_kind "attention_efficiency"  variant "fwd:bf16" | "bwd:bf16"
//   model_kind "memory_bandwidth"      variant op kind ("norm")
//   model_kind "collective"            variant "<op>:<placement>:<group_size>:<nodes>"
//   ("all_reduce:intra:8:1")
// `params_json` is the model's own JSON (see efficiency_surface.h and linear_time_model.h).
struct FittedModel {
  std::string model_kind;
  std::string gpu;
  std::string variant;
  std::string params_json;
  double r2 = 0;    // coefficient of determination on log time
  double mape = 0;  // mean absolute percentage error on time, as a fraction (0.05 = 5%)
  int n_points = 0;
  std::string fitted_at;
  bool operator==(const FittedModel&) const = default;
};

// plans: one planner result. Natural key: model, cluster, config_json (re-planning the same thing
// replaces the prediction).
struct PlanRecord {
  std::int64_t id = 0;  // assigned by the database
  std::string model;    // preset name or a description of the model flags
  std::string cluster;  // "8x8xH100"
  std::string config_json;
  double predicted_step_time_s = 0;
  double predicted_mfu = 0;
  std::int64_t peak_memory_bytes = 0;
  std::string created_at;
  bool operator==(const PlanRecord&) const = default;
};

// runs: one measured run of a plan (predicted next to measured).
struct RunRecord {
  std::int64_t id = 0;                  // assigned by the database
  std::optional<std::int64_t> plan_id;  // plans.id
  double predicted_step_time_s = 0;
  double measured_step_time_s = 0;
  double predicted_mfu = 0;
  double measured_mfu = 0;
  std::string gpu;
  SoftwareVersions versions;
  std::string started_at;
  bool operator==(const RunRecord&) const = default;
};

// run_ops: per-op predicted vs measured time of one run, keyed by the step program's op id.
struct RunOp {
  std::int64_t run_id = 0;
  std::int64_t op_id = 0;
  std::string op_text;  // layouts::to_string(op)
  double predicted_s = 0;
  double measured_s = 0;
  bool operator==(const RunOp&) const = default;
};

// calibrations: corrections fitted from traced runs (calibration.h), appended; a GPU is priced with its
// newest row. `runs_json` is the provenance: per run its folder, creation time, model, layout, device, GPU,
// backend, timing method, mean SM clock and board power (-1: not sampled) and command line.
struct CalibrationRecord {
  std::int64_t id = 0;      // assigned by the database
  std::string gpu;          // gpu_models.name whose prices are corrected
  std::string params_json;  // Calibration::to_json
  std::string runs_json = "[]";
  int n_runs = 0, n_ops = 0;
  // Over the fitted ops: sum |predicted - measured| / sum measured, uncalibrated and calibrated.
  double op_error_before = 0, op_error_after = 0;
  std::string calibrated_at;
  bool operator==(const CalibrationRecord&) const = default;
};

// Current UTC time as ISO-8601 ("2026-11-29T22:30:00Z").
std::string utc_now_iso8601();

}  // namespace megatune::cost_models
