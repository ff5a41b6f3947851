// Sharded safetensors folders: the index file, reading by name across shards, writing shards by size.
#include "executor/checkpoint/safetensors_folder.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/user_error.h"
#include "executor/checkpoint/durable_file.h"

namespace megatune::executor::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string shard_file_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

}  // namespace

int64_t parse_byte_size(const std::string& text, const std::string& flag) {
  static const std::vector<std::pair<std::string, int64_t>> kUnits = {{"GIB", int64_t{1} << 30},
                                                                      {"MIB", int64_t{1} << 20},
                                                                      {"KIB", int64_t{1} << 10},
                                                                      {"GB", 1'000'000'000},
                                                                      {"MB", 1'000'000},
                                                                      {"KB", 1'000},
                                                                      {"B", 1},
                                                                      {"", 1}};
  std::string upper;
  for (char c : text) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& [unit, scale] : kUnits) {
    if (upper.size() <= unit.size() || upper.compare(upper.size() - unit.size(), unit.size(), unit) != 0)
      continue;
    const std::string number = upper.substr(0, upper.size() - unit.size());
    size_t used = 0;
    double value = 0;
    try {
      value = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != number.size() || !(value > 0)) break;
    return static_cast<int64_t>(value * static_cast<double>(scale));
  }
  throw UserError(flag + " '" + text + "' is not a size; give e.g. 5GB, 500MB, 2GiB or a byte count");
}

SafetensorsFolder::SafetensorsFolder(const std::string& directory) : directory_(directory) {
  if (!fs::is_directory(directory_))
    throw UserError(directory_ +
                    " is not a folder; give the Hugging Face model folder (config.json + "
                    "*.safetensors)");
  const fs::path index_path = fs::path(directory_) / kSafetensorsIndexFileName;
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    const json index = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object())
      throw UserError(index_path.string() +
                      " is not a safetensors index (a JSON object with a weight_map); re-save the model");
    std::map<std::string, const SafetensorsFile*> by_file;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw UserError(index_path.string() + " maps '" + tensor +
                        "' to something that is not a file name in the folder; re-save the model");
      const std::string name = file.get<std::string>();
      if (!by_file.count(name)) {
        const fs::path shard = fs::path(directory_) / name;
        if (!fs::exists(shard))
          throw UserError(index_path.string() + " names " + name +
                          ", which is missing from the folder; copy every shard the index lists");
        files_.push_back(std::make_unique<SafetensorsFile>(shard.string()));
        by_file[name] = files_.back().get();
      }
      const SafetensorsFile* holder = by_file[name];
      if (holder->find(tensor) == nullptr)
        throw UserError(index_path.string() + " puts '" + tensor + "' in " + name +
                        ", which does not hold it; the index and the shards come from different saves");
      where_[tensor] = holder;
    }
    return;
  }
  fs::path single = fs::path(directory_) / kSafetensorsSingleFileName;
  if (!fs::exists(single)) {
    std::vector<fs::path> found;
    for (const fs::directory_entry& e : fs::directory_iterator(directory_))
      if (e.path().extension() == ".safetensors") found.push_back(e.path());
    if (found.size() != 1)
      throw UserError(directory_ + " holds " + std::to_string(found.size()) + " .safetensors files and no " +
                      kSafetensorsIndexFileName + "; give a folder with model.safetensors or an index");
    single = found.front();
  }
  files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  for (const SafetensorsEntry& e : files_.back()->entries()) where_[e.name] = files_.back().get();
}

std::vector<std::string> SafetensorsFolder::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, file] : where_) names.push_back(name);
  return names;
}

const SafetensorsEntry& SafetensorsFolder::entry(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end())
    throw UserError("the safetensors of " + directory_ + " hold no tensor '" + name +
                    "'; is this folder the model its config.json describes?");
  return *it->second->find(name);
}

std::vector<float> SafetensorsFolder::read_floats(const std::string& name) const {
  entry(name);
  return where_.at(name)->read_floats(name);
}

std::vector<std::string> write_safetensors_folder(const std::string& directory,
                                                  const std::vector<SafetensorsTensor>& tensors,
                                                  int64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata) {
  std::vector<std::vector<SafetensorsTensor>> shards(1);
  int64_t shard_bytes = 0, total_bytes = 0;
  for (const SafetensorsTensor& t : tensors) {
    const auto bytes = static_cast<int64_t>(t.bytes.size());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(t);
    shard_bytes += bytes;
    total_bytes += bytes;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((fs::path(directory) / kSafetensorsSingleFileName).string(), shards.front(), metadata);
    written.push_back(kSafetensorsSingleFileName);
    return written;
  }
  json weight_map = json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shard_file_name(i, shards.size());
    write_safetensors((fs::path(directory) / name).string(), shards[i], metadata);
    for (const SafetensorsTensor& t : shards[i]) weight_map[t.name] = name;
    written.push_back(name);
  }
  const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  replace_file_atomically((fs::path(directory) / kSafetensorsIndexFileName).string(), index.dump(2) + "\n");
  written.push_back(kSafetensorsIndexFileName);
  return written;
}

}  // namespace megatune::executor::checkpoint
