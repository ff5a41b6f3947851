// Common vocabulary of the op cost models: an op's priced time and where that price comes from, the
// analytic defaults used when nothing is measured, and the collectives with their groups.
#pragma once
#include <string>
#include <vector>

#include "layouts/op.h"

namespace megatune::cost_models {

// Where a price comes from, best first.
enum class Provenance : unsigned char {
  kMeasured,      // this exact shape was measured on this GPU
  kInterpolated,  // between measured neighbours
  kFitted,        // a model fitted to measurements of this GPU
  kTransferred,   // another GPU's measured price at this shape, scaled by peak FLOP/s and bandwidth
  kAnalytic,      // datasheet roofline / latency-bandwidth with default efficiencies
};
const char* provenance_name(Provenance provenance);
// The weaker of two (kAnalytic is the weakest).
inline Provenance weaker(Provenance a, Provenance b) { return a > b ? a : b; }

struct OpCost {
  double time_s = 0;
  Provenance provenance = Provenance::kAnalytic;
};

// Efficiencies assumed when a GPU has no measurements, as fractions of datasheet peaks. These are
// estimates, not measurements; `megatune profile` + `megatune db fit` replace them.
struct AnalyticDefaults {
  double gemm_compute_efficiency = 0.75;       // of dense peak, large GEMMs (cuBLASLt on Hopper ~0.7-0.8)
  double attention_forward_efficiency = 0.45;  // of dense peak on forward FLOPs; backward = 2.5x forward time
  double memory_bandwidth_efficiency = 0.80;  // of HBM bandwidth, for GEMM rooflines and memory-bound kernels
  double kernel_launch_latency_s = 3e-6;      // floor added to every kernel
  double intra_node_bandwidth_efficiency = 0.80;  // NCCL bus bandwidth / NVLink per-direction bandwidth
  double inter_node_bandwidth_efficiency = 0.85;  // NCCL bus bandwidth / network per-GPU bandwidth
  // Interpolate between measured shapes only when every dimension is within this factor of a measured one.
  double interpolation_max_ratio = 2.0;
  // Fit a model in memory from measurements when the database holds none, given at least this many points.
  int min_points_for_fit = 12;
};

enum class CollectiveOp : unsigned char {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSendRecv,
  kBroadcast
};
const char* collective_op_name(CollectiveOp op);  // "all_reduce", ..., "send_recv", "broadcast"
// Parses a name from collective_op_name; throws UserError naming the valid ones.
CollectiveOp parse_collective_op(const std::string& name);
// The collective of a communication OpKind (kSend and kRecv -> kSendRecv); throws std::invalid_argument
// for a non-communication kind.
CollectiveOp collective_op_of(layouts::OpKind kind);
// nccl-tests' bus-bandwidth factor: busbw = algbw * factor, algbw = bytes / time. all_reduce 2(n-1)/n;
// all_gather, reduce_scatter, all_to_all (n-1)/n; send_recv, broadcast 1.
double bus_factor(CollectiveOp op, int group_size);

// The ranks of a collective: `size` ranks spread evenly over `nodes` nodes (nodes == 1: inside one node).
struct CollectiveGroup {
  int size = 1;
  int nodes = 1;
  int ranks_per_node() const { return size / nodes; }
  bool spans_nodes() const { return nodes > 1; }
};
// The group of `global_ranks` on a cluster with `gpus_per_node` GPUs per node (rank r on node r /
// gpus_per_node).
CollectiveGroup collective_group_of(const std::vector<int>& global_ranks, int gpus_per_node);

// Datatype names used in the database ("bf16", "fp16", "fp32", "fp8").
const char* dtype_name(layouts::DType dtype);
// Parses "bf16" | "fp16" | "fp32" | "fp8" (case-insensitive); throws UserError otherwise.
layouts::DType parse_dtype(const std::string& name);

}  // namespace megatune::cost_models
