// HardwareCatalog: GPU models and interconnects with their name aliases, from the catalog shipped in the
// binary (data/hardware_catalog.json, datasheet figures) or from a cost database (which may hold measured
// figures that replace them).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "cost_models/records.h"
#include "cost_models/sqlite_database.h"
#include "layouts/op.h"

namespace megatune::cost_models {

class HardwareCatalog {
 public:
  HardwareCatalog() = default;
  // The catalog compiled into the binary.
  static const HardwareCatalog& embedded();
  // Parses catalog JSON ({"gpus": [...], "interconnects": [...], "aliases": {"H100": "H100 SXM"}});
  // throws UserError naming `source_name` and the bad entry.
  static HardwareCatalog from_json(const std::string& json_text, const std::string& source_name);
  // GPU models and interconnects stored in `database`, with the embedded aliases.
  static HardwareCatalog load(Database& database);

  // Writes the catalog's rows into `database` in one transaction. A row whose source in the database is
  // "measured" is kept (a datasheet figure never replaces a measurement). Returns rows written.
  int install_into(Database& database) const;

  // Looks a GPU up by name or alias, ignoring case, spaces, '-', '_' and a leading "NVIDIA" ("h100",
  // "H100-SXM", "NVIDIA H100 80GB HBM3").
  // Throws UserError listing the known GPUs when there is none.
  const GpuModel& gpu(const std::string& name_or_alias) const;
  const GpuModel* find_gpu(const std::string& name_or_alias) const;
  // Same for interconnects ("NVLink4", "nvlink4", "IB NDR400" when aliased).
  const Interconnect& interconnect(const std::string& name_or_alias) const;
  const Interconnect* find_interconnect(const std::string& name_or_alias) const;

  const std::vector<GpuModel>& gpus() const { return gpus_; }
  const std::vector<Interconnect>& interconnects() const { return interconnects_; }
  const std::vector<std::pair<std::string, std::string>>& aliases() const { return aliases_; }

  void add_gpu(GpuModel gpu);                        // replaces a GPU of the same name
  void add_interconnect(Interconnect interconnect);  // replaces one of the same name
  void add_alias(std::string alias, std::string name);

 private:
  std::vector<GpuModel> gpus_;
  std::vector<Interconnect> interconnects_;
  std::vector<std::pair<std::string, std::string>> aliases_;  // (alias, canonical name)
};

// Dense peak of `gpu` for `dtype` in TFLOP/s (FP32 GEMMs are priced at the TF32 tensor-core rate when the
// GPU has one, as cuBLAS does by default in training code). Throws UserError when the GPU lacks the type.
double peak_tflops(const GpuModel& gpu, layouts::DType dtype);

// The dense BF16 peak in TFLOP/s of the GPU a device reports by name ("NVIDIA H200", "NVIDIA H100 80GB
// HBM3"), from the embedded catalog: the one GPU-peak table (train's MFU, the profiler's synthetic device and
// the planner all read it). 0 when the catalog does not know the GPU (MFU is then not printed).
double device_peak_bf16_tflops(const std::string& device_name);

// The catalog JSON compiled into the binary.
const std::string& embedded_hardware_catalog_json();

}  // namespace megatune::cost_models
