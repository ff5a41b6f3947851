// CollectiveCostModel: measured/interpolated/fitted per configuration, else flat (one node) or hierarchical
// (across nodes) latency-bandwidth forms from the catalog, the hierarchical phases pipelined in chunks.
#include "cost_models/collective_cost_model.h"

#include <algorithm>
#include <vector>

namespace megatune::cost_models {

namespace {

// The unit a hierarchical collective is pipelined in across its NVLink and network phases (NCCL's default
// NCCL_BUFFSIZE, 4 MiB): a message up to this size runs its phases one after the other.
constexpr double kPipelineChunkBytes = 4.0 * 1024 * 1024;

// One level of a hierarchical collective: its price, its latency share, and whether it crosses nodes.
struct Phase {
  OpCost cost;
  double latency_s;
  bool over_network;
};

// The phases of a hierarchical collective run chunk by chunk as NCCL pipelines them: the result lies
// between the busier fabric's time and the naive sum of the phases.
OpCost pipelined(const std::vector<Phase>& phases, double bytes) {
  // NVLink phases share the NVLink links and network phases the NICs; the two fabrics work at once on
  // successive chunks, so the busier fabric sets the time and the other adds one chunk's pass.
  double latency_s = 0, nvlink_s = 0, network_s = 0;
  Provenance provenance = Provenance::kMeasured;
  for (const Phase& phase : phases) {
    const double phase_latency_s = std::min(phase.cost.time_s, phase.latency_s);
    latency_s += phase_latency_s;
    (phase.over_network ? network_s : nvlink_s) += phase.cost.time_s - phase_latency_s;
    provenance = weaker(provenance, phase.cost.provenance);
  }
  const double chunk_fraction = std::min(1.0, kPipelineChunkBytes / bytes);
  return {latency_s + std::max(nvlink_s, network_s) + std::min(nvlink_s, network_s) * chunk_fraction,
          provenance};
}

}  // namespace

CollectiveCostModel::CollectiveCostModel(const ClusterSpec& cluster, const AnalyticDefaults& defaults)
    : cluster_(cluster), defaults_(defaults) {}

void CollectiveCostModel::add_measurement(const CollectiveTiming& timing) {
  if (timing.bytes <= 0 || timing.median_s <= 0 || timing.group_size < 1) return;
  const CollectiveOp op = parse_collective_op(timing.op);
  const int nodes = std::clamp(timing.nodes, 1, timing.group_size);
  measured_[{op, timing.group_size, nodes}].add(timing.bytes, timing.median_s);
}

void CollectiveCostModel::set_fit(CollectiveOp op, int group_size, int nodes, LinearTimeModel model) {
  fitted_[{op, group_size, nodes}] = model;
}

bool CollectiveCostModel::has_fit(CollectiveOp op, int group_size, int nodes) const {
  return fitted_.count({op, group_size, nodes}) > 0;
}

double CollectiveCostModel::intra_node_bus_bandwidth_bytes_per_s() const {
  return cluster_.intra_node.bandwidth_per_direction_bytes_per_s * defaults_.intra_node_bandwidth_efficiency;
}

double CollectiveCostModel::inter_node_bus_bandwidth_bytes_per_s() const {
  return cluster_.inter_node.bandwidth_per_direction_bytes_per_s * defaults_.inter_node_bandwidth_efficiency;
}

double CollectiveCostModel::latency_bandwidth_time_s(CollectiveOp op, double bytes, int group_size,
                                                     double latency_s, double bus_bandwidth_bytes_per_s) {
  if (group_size <= 1 || bytes <= 0) return 0.0;
  return latency_s + bytes * bus_factor(op, group_size) / bus_bandwidth_bytes_per_s;
}

OpCost CollectiveCostModel::level_cost(CollectiveOp op, double bytes, int group_size, int nodes) const {
  if (group_size <= 1 || bytes <= 0) return {0.0, Provenance::kAnalytic};
  const Config config{op, group_size, nodes};
  if (measured_.empty() && fitted_.empty()) {
    const bool inter = nodes > 1;
    return {latency_bandwidth_time_s(
                op, bytes, group_size, inter ? inter_node_latency_s() : intra_node_latency_s(),
                inter ? inter_node_bus_bandwidth_bytes_per_s() : intra_node_bus_bandwidth_bytes_per_s()),
            Provenance::kAnalytic};
  }
  if (const auto series = measured_.find(config); series != measured_.end()) {
    if (const auto time_s = series->second.interpolate(bytes)) {
      const bool exact = series->second.exact(static_cast<std::int64_t>(bytes)).has_value() &&
                         static_cast<double>(static_cast<std::int64_t>(bytes)) == bytes;
      return {*time_s, exact ? Provenance::kMeasured : Provenance::kInterpolated};
    }
  }
  if (const auto fit = fitted_.find(config); fit != fitted_.end())
    return {fit->second.time_s(bytes), Provenance::kFitted};
  const bool inter = nodes > 1;
  return {latency_bandwidth_time_s(
              op, bytes, group_size, inter ? inter_node_latency_s() : intra_node_latency_s(),
              inter ? inter_node_bus_bandwidth_bytes_per_s() : intra_node_bus_bandwidth_bytes_per_s()),
          Provenance::kAnalytic};
}

OpCost CollectiveCostModel::cost(CollectiveOp op, double bytes, const CollectiveGroup& group) const {
  if (group.size <= 1 || bytes <= 0) return {0.0, Provenance::kAnalytic};
  const int nodes = std::clamp(group.nodes, 1, group.size);
  if (nodes == 1) return level_cost(op, bytes, group.size, 1);
  // A configuration measured or fitted as a whole prices itself.
  const Config config{op, group.size, nodes};
  if (measured_.count(config) > 0 || fitted_.count(config) > 0) {
    const OpCost whole = level_cost(op, bytes, group.size, nodes);
    if (whole.provenance != Provenance::kAnalytic) return whole;
  }
  const int per_node = std::max(1, group.size / nodes);
  if (per_node == 1) return level_cost(op, bytes, group.size, nodes);
  const double shard = bytes / per_node;
  const double intra_latency_s = intra_node_latency_s();
  const double inter_latency_s = inter_node_latency_s();
  switch (op) {
    case CollectiveOp::kAllReduce:
      // Reduce-scatter inside each node, all-reduce of the 1/g shard across nodes, all-gather inside each
      // node.
      return pipelined(
          {{level_cost(CollectiveOp::kReduceScatter, bytes, per_node, 1), intra_latency_s, false},
           {level_cost(CollectiveOp::kAllReduce, shard, nodes, nodes), inter_latency_s, true},
           {level_cost(CollectiveOp::kAllGather, bytes, per_node, 1), intra_latency_s, false}},
          bytes);
    case CollectiveOp::kAllGather:
      // Across nodes among ranks of one local index (gathering S/g), then inside each node (gathering S).
      return pipelined({{level_cost(CollectiveOp::kAllGather, shard, nodes, nodes), inter_latency_s, true},
                        {level_cost(CollectiveOp::kAllGather, bytes, per_node, 1), intra_latency_s, false}},
                       bytes);
    case CollectiveOp::kReduceScatter:
      return pipelined(
          {{level_cost(CollectiveOp::kReduceScatter, bytes, per_node, 1), intra_latency_s, false},
           {level_cost(CollectiveOp::kReduceScatter, shard, nodes, nodes), inter_latency_s, true}},
          bytes);
    case CollectiveOp::kAllToAll: {
      // (n - g)/n of each rank's buffer leaves the node over its NIC while (g - 1)/n moves over NVLink.
      const double n = group.size;
      const double network_s = bytes * (n - per_node) / n / inter_node_bus_bandwidth_bytes_per_s();
      const double nvlink_s = bytes * (per_node - 1) / n / intra_node_bus_bandwidth_bytes_per_s();
      return {inter_node_latency_s() + std::max(network_s, nvlink_s), Provenance::kAnalytic};
    }
    case CollectiveOp::kSendRecv:
      return level_cost(CollectiveOp::kSendRecv, bytes, 2, 2);
    case CollectiveOp::kBroadcast:
      return pipelined({{level_cost(CollectiveOp::kBroadcast, bytes, nodes, nodes), inter_latency_s, true},
                        {level_cost(CollectiveOp::kBroadcast, bytes, per_node, 1), intra_latency_s, false}},
                       bytes);
  }
  return level_cost(op, bytes, group.size, nodes);
}

}  // namespace megatune::cost_models
