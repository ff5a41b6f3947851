// ClusterSpec: what the user trains on: nodes x GPUs per node x GPU type, and the fabrics inside and
// between nodes. Parsed from "--cluster 4x8xH100" or from a cluster JSON file.
#pragma once
#include <string>

#include "cost_models/hardware_catalog.h"
#include "cost_models/records.h"

namespace megatune::cost_models {

struct ClusterSpec {
  int nodes = 1;
  int gpus_per_node = 8;
  GpuModel gpu;             // resolved from the catalog
  Interconnect intra_node;  // NVLink domain (domain_size >= gpus_per_node when the node is one domain)
  Interconnect inter_node;  // network between nodes
  int world_size() const { return nodes * gpus_per_node; }
  // "4x8xH100 SXM (NVLink4, InfiniBand NDR400)"
  std::string describe() const;
  // "4x8xH100 SXM": the short form, parseable by parse_cluster_spec.
  std::string short_name() const;
};

// Parses either the short form "NODESxGPUSxTYPE" (e.g. "4x8xH100", "1x8xh200-sxm", "2x4xA100 80GB"), or,
// when `text` names an existing file or ends in ".json", a JSON file:
//   {"nodes": 4, "gpus_per_node": 8, "gpu": "H100",
//    "intra_node_interconnect": "NVLink4", "inter_node_interconnect": "InfiniBand NDR400",
//    "gpu_overrides": {"memory_bytes": ..., "peak_bf16_tflops": ...},            (optional)
//    "inter_node_overrides": {"bandwidth_per_direction_bytes_per_s": ..., "latency_s": ...}}  (optional)
// The fabrics default to the GPU's catalog defaults. Throws UserError (one line naming the input and the
// fix) on a malformed string, unknown GPU or fabric, non-positive counts, or gpus_per_node larger than the
// NVLink domain.
ClusterSpec parse_cluster_spec(const std::string& text,
                               const HardwareCatalog& catalog = HardwareCatalog::embedded());

}  // namespace megatune::cost_models
