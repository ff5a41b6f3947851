// HardwareCatalog: parsing the catalog JSON, name/alias lookup, and installing rows into a database.
#include "cost_models/hardware_catalog.h"

#include <algorithm>
#include <cctype>

#include "base/user_error.h"
#include "cost_models/cost_database.h"
#include "cost_models/json_value.h"
#include "cost_models/record_store.h"

namespace megatune::cost_models {
namespace {

// Lower case without spaces, '-' and '_': "H100-SXM" -> "h100sxm".
std::string normalized(const std::string& name) {
  std::string out;
  for (const char c : name) {
    if (c == ' ' || c == '-' || c == '_') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

double number_field(const JsonValue& entry, const char* key, double fallback, bool required,
                    const std::string& where) {
  const JsonValue* value = entry.find(key);
  if (value == nullptr) {
    if (required) throw UserError(where + ": missing \"" + key + "\"; add it");
    return fallback;
  }
  if (!value->is_number()) throw UserError(where + ": \"" + key + "\" must be a number");
  if (value->as_number() < 0) throw UserError(where + ": \"" + key + "\" must not be negative");
  return value->as_number();
}

std::string string_field(const JsonValue& entry, const char* key, const std::string& fallback, bool required,
                         const std::string& where) {
  const JsonValue* value = entry.find(key);
  if (value == nullptr) {
    if (required) throw UserError(where + ": missing \"" + key + "\"; add it");
    return fallback;
  }
  if (!value->is_string()) throw UserError(where + ": \"" + key + "\" must be a string");
  return value->as_string();
}

void check_source(const std::string& source, const std::string& where) {
  if (source != kSourceDatasheet && source != kSourceMeasured) {
    throw UserError(where + ": \"source\" must be \"datasheet\" or \"measured\", not \"" + source + "\"");
  }
}

}  // namespace

const HardwareCatalog& HardwareCatalog::embedded() {
  static const HardwareCatalog catalog =
      from_json(embedded_hardware_catalog_json(), "embedded hardware catalog");
  return catalog;
}

HardwareCatalog HardwareCatalog::from_json(const std::string& json_text, const std::string& source_name) {
  JsonValue document;
  try {
    document = JsonValue::parse(json_text);
  } catch (const JsonParseError& error) {
    throw UserError(source_name + ": " + error.what() + "; fix the JSON");
  }
  if (!document.is_object())
    throw UserError(source_name + ": expected a JSON object with \"gpus\" and \"interconnects\"");
  HardwareCatalog catalog;
  if (const JsonValue* gpus = document.find("gpus")) {
    if (!gpus->is_array()) throw UserError(source_name + ": \"gpus\" must be an array");
    for (std::size_t i = 0; i < gpus->as_array().size(); ++i) {
      const JsonValue& entry = gpus->as_array()[i];
      const std::string where = source_name + ": gpus[" + std::to_string(i) + "]";
      if (!entry.is_object()) throw UserError(where + " must be an object");
      GpuModel gpu;
      gpu.name = string_field(entry, "name", "", true, where);
      const std::string named = where + " (" + gpu.name + ")";
      gpu.peak_bf16_tflops = number_field(entry, "peak_bf16_tflops", 0, true, named);
      gpu.peak_fp16_tflops = number_field(entry, "peak_fp16_tflops", gpu.peak_bf16_tflops, false, named);
      gpu.peak_fp8_tflops = number_field(entry, "peak_fp8_tflops", 0, false, named);
      gpu.peak_tf32_tflops = number_field(entry, "peak_tf32_tflops", 0, false, named);
      gpu.peak_fp32_tflops = number_field(entry, "peak_fp32_tflops", 0, false, named);
      gpu.memory_bytes = static_cast<std::int64_t>(number_field(entry, "memory_bytes", 0, true, named));
      gpu.hbm_bandwidth_bytes_per_s = number_field(entry, "hbm_bandwidth_bytes_per_s", 0, true, named);
      gpu.default_intra_node_interconnect =
          string_field(entry, "default_intra_node_interconnect", "", false, named);
      gpu.default_inter_node_interconnect =
          string_field(entry, "default_inter_node_interconnect", "", false, named);
      gpu.default_gpus_per_node =
          static_cast<int>(number_field(entry, "default_gpus_per_node", 8, false, named));
      gpu.source = string_field(entry, "source", kSourceDatasheet, false, named);
      check_source(gpu.source, named);
      if (gpu.peak_bf16_tflops <= 0 || gpu.memory_bytes <= 0 || gpu.hbm_bandwidth_bytes_per_s <= 0 ||
          gpu.default_gpus_per_node <= 0) {
        throw UserError(named +
                        ": peak_bf16_tflops, memory_bytes, hbm_bandwidth_bytes_per_s and "
                        "default_gpus_per_node must be positive");
      }
      catalog.add_gpu(std::move(gpu));
    }
  }
  if (const JsonValue* interconnects = document.find("interconnects")) {
    if (!interconnects->is_array()) throw UserError(source_name + ": \"interconnects\" must be an array");
    for (std::size_t i = 0; i < interconnects->as_array().size(); ++i) {
      const JsonValue& entry = interconnects->as_array()[i];
      const std::string where = source_name + ": interconnects[" + std::to_string(i) + "]";
      if (!entry.is_object()) throw UserError(where + " must be an object");
      Interconnect row;
      row.name = string_field(entry, "name", "", true, where);
      const std::string named = where + " (" + row.name + ")";
      row.kind = string_field(entry, "kind", "", true, named);
      if (row.kind != "intra_node" && row.kind != "inter_node") {
        throw UserError(named + ": \"kind\" must be \"intra_node\" or \"inter_node\"");
      }
      row.domain_size = static_cast<int>(number_field(entry, "domain_size", 0, false, named));
      row.bandwidth_per_direction_bytes_per_s =
          number_field(entry, "bandwidth_per_direction_bytes_per_s", 0, true, named);
      if (row.bandwidth_per_direction_bytes_per_s <= 0)
        throw UserError(named + ": bandwidth must be positive");
      row.latency_s = number_field(entry, "latency_s", 0, false, named);
      row.source = string_field(entry, "source", kSourceDatasheet, false, named);
      check_source(row.source, named);
      catalog.add_interconnect(std::move(row));
    }
  }
  if (const JsonValue* aliases = document.find("aliases")) {
    if (!aliases->is_object())
      throw UserError(source_name + ": \"aliases\" must be an object of name -> name");
    for (const auto& [alias, target] : aliases->as_object()) {
      if (!target.is_string())
        throw UserError(source_name + ": alias \"" + alias + "\" must map to a string");
      catalog.add_alias(alias, target.as_string());
    }
  }
  for (const GpuModel& gpu : catalog.gpus_) {
    for (const std::string* fabric :
         {&gpu.default_intra_node_interconnect, &gpu.default_inter_node_interconnect}) {
      if (!fabric->empty() && catalog.find_interconnect(*fabric) == nullptr) {
        throw UserError(source_name + ": GPU " + gpu.name + " names interconnect \"" + *fabric +
                        "\" which the catalog does not define; add it to \"interconnects\"");
      }
    }
  }
  return catalog;
}

HardwareCatalog HardwareCatalog::load(Database& database) {
  HardwareCatalog catalog;
  for (GpuModel& gpu : load_gpu_models(database)) catalog.add_gpu(std::move(gpu));
  for (Interconnect& row : load_interconnects(database)) catalog.add_interconnect(std::move(row));
  for (const auto& [alias, name] : embedded().aliases()) catalog.add_alias(alias, name);
  return catalog;
}

int HardwareCatalog::install_into(Database& database) const {
  Transaction transaction(database);
  int written = 0;
  Statement gpu_source(database, "SELECT source FROM gpu_models WHERE name = ?");
  for (const GpuModel& gpu : gpus_) {
    gpu_source.reset();
    gpu_source.bind(1, gpu.name);
    if (gpu_source.step() && gpu_source.column_text(0) == kSourceMeasured && gpu.source != kSourceMeasured)
      continue;
    upsert_gpu_model(database, gpu);
    ++written;
  }
  Statement fabric_source(database, "SELECT source FROM interconnects WHERE name = ?");
  for (const Interconnect& row : interconnects_) {
    fabric_source.reset();
    fabric_source.bind(1, row.name);
    if (fabric_source.step() && fabric_source.column_text(0) == kSourceMeasured &&
        row.source != kSourceMeasured) {
      continue;
    }
    upsert_interconnect(database, row);
    ++written;
  }
  transaction.commit();
  return written;
}

const GpuModel* HardwareCatalog::find_gpu(const std::string& name_or_alias) const {
  std::string key = normalized(name_or_alias);
  if (key.rfind("nvidia", 0) == 0 && key.size() > 6) key = key.substr(6);  // device names: "NVIDIA H200"

  for (const GpuModel& gpu : gpus_) {
    if (normalized(gpu.name) == key) return &gpu;
  }
  for (const auto& [alias, name] : aliases_) {
    if (normalized(alias) == key) {
      for (const GpuModel& gpu : gpus_) {
        if (gpu.name == name) return &gpu;
      }
    }
  }
  return nullptr;
}

const GpuModel& HardwareCatalog::gpu(const std::string& name_or_alias) const {
  if (const GpuModel* found = find_gpu(name_or_alias)) return *found;
  std::string known;
  for (const GpuModel& gpu : gpus_) known += (known.empty() ? "" : ", ") + gpu.name;
  throw UserError("unknown GPU \"" + name_or_alias + "\"; use one of: " + known +
                  " (or add it to the cost database with `megatune db import`)");
}

const Interconnect* HardwareCatalog::find_interconnect(const std::string& name_or_alias) const {
  const std::string key = normalized(name_or_alias);
  for (const Interconnect& row : interconnects_) {
    if (normalized(row.name) == key) return &row;
  }
  for (const auto& [alias, name] : aliases_) {
    if (normalized(alias) == key) {
      for (const Interconnect& row : interconnects_) {
        if (row.name == name) return &row;
      }
    }
  }
  return nullptr;
}

const Interconnect& HardwareCatalog::interconnect(const std::string& name_or_alias) const {
  if (const Interconnect* found = find_interconnect(name_or_alias)) return *found;
  std::string known;
  for (const Interconnect& row : interconnects_) known += (known.empty() ? "" : ", ") + row.name;
  throw UserError("unknown interconnect \"" + name_or_alias + "\"; use one of: " + known);
}

void HardwareCatalog::add_gpu(GpuModel gpu) {
  for (GpuModel& existing : gpus_) {
    if (existing.name == gpu.name) {
      existing = std::move(gpu);
      return;
    }
  }
  gpus_.push_back(std::move(gpu));
}

void HardwareCatalog::add_interconnect(Interconnect interconnect) {
  for (Interconnect& existing : interconnects_) {
    if (existing.name == interconnect.name) {
      existing = std::move(interconnect);
      return;
    }
  }
  interconnects_.push_back(std::move(interconnect));
}

void HardwareCatalog::add_alias(std::string alias, std::string name) {
  for (auto& [existing, target] : aliases_) {
    if (existing == alias) {
      target = std::move(name);
      return;
    }
  }
  aliases_.emplace_back(std::move(alias), std::move(name));
}

double peak_tflops(const GpuModel& gpu, layouts::DType dtype) {
  double peak = 0;
  const char* name = "bf16";
  switch (dtype) {
    case layouts::DType::kBF16:
      peak = gpu.peak_bf16_tflops;
      break;
    case layouts::DType::kFP16:
      peak = gpu.peak_fp16_tflops;
      name = "fp16";
      break;
    case layouts::DType::kFP8:
      peak = gpu.peak_fp8_tflops;
      name = "fp8";
      break;
    case layouts::DType::kFP32:
      peak = gpu.peak_tf32_tflops > 0 ? gpu.peak_tf32_tflops : gpu.peak_fp32_tflops;
      name = "fp32";
      break;
  }
  if (peak <= 0) {
    throw UserError("GPU " + gpu.name + " has no " + name +
                    " peak in the catalog; use another --dtype or GPU");
  }
  return peak;
}

double device_peak_bf16_tflops(const std::string& device_name) {
  const GpuModel* gpu = HardwareCatalog::embedded().find_gpu(device_name);
  return gpu ? gpu->peak_bf16_tflops : 0.0;
}

}  // namespace megatune::cost_models
