// ClusterSpec parsing: "NODESxGPUSxTYPE" or a cluster JSON file.
#include "cost_models/cluster_spec.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "base/input_file.h"
#include "base/user_error.h"
#include "cost_models/json_value.h"
#include "cost_models/plausible_ranges.h"

namespace megatune::cost_models {
namespace {

int parse_count(const std::string& text, const std::string& what, const std::string& input) {
  if (text.empty() || text.size() > 7) {
    throw UserError("--cluster \"" + input + "\": " + what +
                    " must be a positive integer; write NODESxGPUSxTYPE, e.g. 4x8xH100");
  }
  for (const char c : text) {
    if (!std::isdigit(static_cast<unsigned char>(c))) {
      throw UserError("--cluster \"" + input + "\": " + what + " \"" + text +
                      "\" is not a positive integer; write NODESxGPUSxTYPE, e.g. 4x8xH100");
    }
  }
  const int value = std::stoi(text);
  if (value <= 0) throw UserError("--cluster \"" + input + "\": " + what + " must be at least 1");
  return value;
}

// Most GPUs (and most nodes) a cluster may have: world sizes are ints everywhere, and no product of
// parallel sizes may overflow.
constexpr int kMaxCount = 1 << 20;

void check_world_size(const ClusterSpec& spec, const std::string& where) {
  const long long world = static_cast<long long>(spec.nodes) * spec.gpus_per_node;
  if (world > kMaxCount) {
    throw UserError(where + ": " + std::to_string(spec.nodes) + " nodes x " +
                    std::to_string(spec.gpus_per_node) + " GPUs = " + std::to_string(world) +
                    " GPUs is more than the " + std::to_string(kMaxCount) +
                    " megatune plans for; give fewer nodes");
  }
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

void check_fabrics(const ClusterSpec& spec, const std::string& input) {
  if (spec.intra_node.kind != "intra_node") {
    throw UserError("cluster " + input + ": \"" + spec.intra_node.name +
                    "\" is an inter-node network; name an intra-node fabric (NVLink3/4/5, PCIe Gen4/5)");
  }
  if (spec.inter_node.kind != "inter_node") {
    throw UserError(
        "cluster " + input + ": \"" + spec.inter_node.name +
        "\" is an intra-node fabric; name an inter-node network (InfiniBand NDR400, RoCE 400G, ...)");
  }
  if (spec.intra_node.domain_size > 0 && spec.gpus_per_node > spec.intra_node.domain_size) {
    throw UserError("cluster " + input + ": " + std::to_string(spec.gpus_per_node) +
                    " GPUs per node exceed the " + spec.intra_node.name + " domain of " +
                    std::to_string(spec.intra_node.domain_size) + "; use at most " +
                    std::to_string(spec.intra_node.domain_size) + " GPUs per node");
  }
}

ClusterSpec with_defaults(int nodes, int gpus_per_node, const GpuModel& gpu, const HardwareCatalog& catalog,
                          const std::string& input) {
  ClusterSpec spec;
  spec.nodes = nodes;
  spec.gpus_per_node = gpus_per_node;
  spec.gpu = gpu;
  if (gpu.default_intra_node_interconnect.empty() || gpu.default_inter_node_interconnect.empty()) {
    throw UserError("cluster " + input + ": GPU " + gpu.name +
                    " has no default interconnects in the catalog; use a cluster JSON file that names them");
  }
  spec.intra_node = catalog.interconnect(gpu.default_intra_node_interconnect);
  spec.inter_node = catalog.interconnect(gpu.default_inter_node_interconnect);
  return spec;
}

void apply_number(const JsonValue& object, const char* key, double& target, const std::string& where) {
  if (const JsonValue* value = object.find(key)) {
    if (!value->is_number() || !std::isfinite(value->as_number()) || value->as_number() <= 0) {
      const auto range = plausible_range(key);
      throw UserError(where + ": \"" + key + "\" must be a positive number" +
                      (range ? std::string(" of ") + range->unit : std::string()));
    }
    check_plausible(key, value->as_number(), where);
    target = value->as_number();
  }
}

void apply_integer(const JsonValue& object, const char* key, int& target, const std::string& where) {
  double number = target;
  apply_number(object, key, number, where);
  if (number != std::floor(number)) {
    throw UserError(where + ": \"" + key + "\" " + std::to_string(number) +
                    " must be a whole number of GPUs");
  }
  target = static_cast<int>(number);
}

// A key the reader does not know would be silently ignored (a misspelling, or an override at the wrong
// level): refused, naming the keys that are read there.
void require_known_keys(const JsonValue& object, std::initializer_list<const char*> known,
                        const std::string& where) {
  for (const auto& [key, value] : object.as_object()) {
    bool found = false;
    std::string names;
    for (const char* name : known) {
      found = found || key == name;
      names += std::string(names.empty() ? "" : ", ") + name;
    }
    if (!found) throw UserError(where + ": unknown key \"" + key + "\" (it would be ignored); use " + names);
  }
}

ClusterSpec parse_cluster_file(const std::string& path, const HardwareCatalog& catalog) {
  const std::string text = read_regular_file(path, "--cluster file", std::size_t{16} << 20);
  JsonValue document;
  try {
    document = JsonValue::parse(text);
  } catch (const JsonParseError& error) {
    throw UserError("cluster file " + path + ": " + error.what() + "; fix the JSON");
  }
  if (!document.is_object()) throw UserError("cluster file " + path + ": expected a JSON object");
  require_known_keys(document,
                     {"gpu", "nodes", "gpus_per_node", "intra_node_interconnect", "inter_node_interconnect",
                      "gpu_overrides", "intra_node_overrides", "inter_node_overrides"},
                     "cluster file " + path);
  auto integer = [&](const char* key, int fallback) {
    const JsonValue* value = document.find(key);
    if (value == nullptr) return fallback;
    if (!value->is_number() || !(value->as_number() >= 1 && value->as_number() <= kMaxCount) ||
        value->as_number() != std::floor(value->as_number())) {
      throw UserError("cluster file " + path + ": \"" + key + "\" must be a whole number from 1 to " +
                      std::to_string(kMaxCount));
    }
    return static_cast<int>(value->as_number());
  };
  const JsonValue* gpu_name = document.find("gpu");
  if (gpu_name == nullptr || !gpu_name->is_string()) {
    throw UserError("cluster file " + path + ": missing \"gpu\" (a name such as \"H100\")");
  }
  const GpuModel& gpu = catalog.gpu(gpu_name->as_string());
  ClusterSpec spec = with_defaults(integer("nodes", 1), integer("gpus_per_node", gpu.default_gpus_per_node),
                                   gpu, catalog, path);
  for (const char* key : {"intra_node_interconnect", "inter_node_interconnect"}) {
    if (const JsonValue* fabric = document.find(key)) {
      if (!fabric->is_string())
        throw UserError("cluster file " + path + ": \"" + key + "\" must be a string");
      (std::string(key) == "intra_node_interconnect" ? spec.intra_node : spec.inter_node) =
          catalog.interconnect(fabric->as_string());
    }
  }
  if (const JsonValue* overrides = document.find("gpu_overrides")) {
    const std::string where = "cluster file " + path + ": gpu_overrides";
    if (!overrides->is_object()) throw UserError(where + " must be an object");
    require_known_keys(*overrides,
                       {"memory_bytes", "peak_bf16_tflops", "peak_fp16_tflops", "peak_fp8_tflops",
                        "hbm_bandwidth_bytes_per_s"},
                       where);
    double memory_bytes = static_cast<double>(spec.gpu.memory_bytes);
    apply_number(*overrides, "memory_bytes", memory_bytes, where);
    spec.gpu.memory_bytes = static_cast<std::int64_t>(memory_bytes);
    apply_number(*overrides, "peak_bf16_tflops", spec.gpu.peak_bf16_tflops, where);
    apply_number(*overrides, "peak_fp16_tflops", spec.gpu.peak_fp16_tflops, where);
    apply_number(*overrides, "peak_fp8_tflops", spec.gpu.peak_fp8_tflops, where);
    apply_number(*overrides, "hbm_bandwidth_bytes_per_s", spec.gpu.hbm_bandwidth_bytes_per_s, where);
  }
  for (const char* key : {"intra_node_overrides", "inter_node_overrides"}) {
    if (const JsonValue* overrides = document.find(key)) {
      const std::string where = "cluster file " + path + ": " + key;
      if (!overrides->is_object()) throw UserError(where + " must be an object");
      require_known_keys(*overrides, {"bandwidth_per_direction_bytes_per_s", "latency_s", "domain_size"},
                         where);
      Interconnect& fabric = std::string(key) == "intra_node_overrides" ? spec.intra_node : spec.inter_node;
      apply_number(*overrides, "bandwidth_per_direction_bytes_per_s",
                   fabric.bandwidth_per_direction_bytes_per_s, where);
      apply_number(*overrides, "latency_s", fabric.latency_s, where);
      apply_integer(*overrides, "domain_size", fabric.domain_size, where);
    }
  }
  check_fabrics(spec, "file " + path);
  check_world_size(spec, "cluster file " + path);
  return spec;
}

}  // namespace

std::string ClusterSpec::short_name() const {
  return std::to_string(nodes) + "x" + std::to_string(gpus_per_node) + "x" + gpu.name;
}

std::string ClusterSpec::describe() const {
  return short_name() + " (" + intra_node.name + ", " + inter_node.name + ")";
}

ClusterSpec parse_cluster_spec(const std::string& text, const HardwareCatalog& catalog) {
  const std::string input = trim(text);
  if (input.empty())
    throw UserError("--cluster is empty; write NODESxGPUSxTYPE (e.g. 4x8xH100) or a cluster JSON file");
  std::error_code error;
  const bool ends_in_json = input.size() > 5 && input.compare(input.size() - 5, 5, ".json") == 0;
  if (ends_in_json || std::filesystem::exists(input, error)) return parse_cluster_file(input, catalog);

  // NODESxGPUSxTYPE: the type may itself contain 'x' ("H100 SXM" does not, but be exact): split at the first
  // two.
  const auto first = input.find_first_of("xX");
  const auto second = first == std::string::npos ? std::string::npos : input.find_first_of("xX", first + 1);
  if (first == std::string::npos || second == std::string::npos || second + 1 >= input.size()) {
    throw UserError("--cluster \"" + input +
                    "\": expected NODESxGPUSxTYPE (e.g. 4x8xH100) or a cluster JSON file");
  }
  const int nodes = parse_count(trim(input.substr(0, first)), "the node count", input);
  const int gpus_per_node =
      parse_count(trim(input.substr(first + 1, second - first - 1)), "GPUs per node", input);
  const GpuModel& gpu = catalog.gpu(trim(input.substr(second + 1)));
  ClusterSpec spec = with_defaults(nodes, gpus_per_node, gpu, catalog, "\"" + input + "\"");
  check_fabrics(spec, "\"" + input + "\"");
  check_world_size(spec, "--cluster \"" + input + "\"");
  return spec;
}

}  // namespace megatune::cost_models
