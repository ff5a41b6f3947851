// Collective cost: latency + bytes x bus_factor / bus bandwidth (nccl-tests conventions). Per (op, group
// size, nodes spanned): measured exact size -> measured; between measured sizes -> interpolated; a fitted
// latency/bandwidth line -> fitted. Otherwise a group inside one node uses the NVLink figures and a group
// across nodes is priced hierarchically (intra-node reduce-scatter, inter-node all-reduce over the nodes,
// intra-node all-gather for all-reduce; the analogous two-level forms for the others), each level from its
// own fit when there is one or from the catalog (analytic).
#pragma once
#include <map>
#include <tuple>

#include "cost_models/cluster_spec.h"
#include "cost_models/fitted_forms.h"
#include "cost_models/measured_tables.h"
#include "cost_models/op_cost.h"
#include "cost_models/records.h"

namespace megatune::cost_models {

class CollectiveCostModel {
 public:
  CollectiveCostModel(const ClusterSpec& cluster, const AnalyticDefaults& defaults);
  // A collective_timings row of this GPU.
  void add_measurement(const CollectiveTiming& timing);
  void set_fit(CollectiveOp op, int group_size, int nodes, LinearTimeModel model);
  bool has_fit(CollectiveOp op, int group_size, int nodes) const;

  // `bytes` in nccl-tests' convention (collective_timings). A group of size 1 costs nothing.
  OpCost cost(CollectiveOp op, double bytes, const CollectiveGroup& group) const;

  // Analytic pieces (catalog figure x efficiency; latency from the catalog).
  double intra_node_bus_bandwidth_bytes_per_s() const;
  double inter_node_bus_bandwidth_bytes_per_s() const;
  double intra_node_latency_s() const { return cluster_.intra_node.latency_s; }
  double inter_node_latency_s() const { return cluster_.inter_node.latency_s; }
  // latency + bytes * bus_factor / bandwidth over one flat level.
  static double latency_bandwidth_time_s(CollectiveOp op, double bytes, int group_size, double latency_s,
                                         double bus_bandwidth_bytes_per_s);

 private:
  using Config = std::tuple<CollectiveOp, int, int>;  // (op, group size, nodes)
  // One flat level (inside a node, or across `nodes` nodes with one rank each), fitted or analytic.
  OpCost level_cost(CollectiveOp op, double bytes, int group_size, int nodes) const;
  ClusterSpec cluster_;
  AnalyticDefaults defaults_;
  std::map<Config, MeasuredSeries> measured_;
  std::map<Config, LinearTimeModel> fitted_;
};

}  // namespace megatune::cost_models
