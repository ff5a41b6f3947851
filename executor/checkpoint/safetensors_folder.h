// A folder of safetensors files as Hugging Face saves a model: one model.safetensors, or shards
// model-00001-of-0000N.safetensors listed by model.safetensors.index.json ({"metadata": {"total_size"},
// "weight_map": {tensor: file}}). Reads by tensor name across the shards; writes one file, or shards of at
// most a size limit (HF's --max-shard-size, "5GB" by default) with the index.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/checkpoint/safetensors.h"

namespace megatune::executor::checkpoint {

inline constexpr const char* kSafetensorsIndexFileName = "model.safetensors.index.json";
inline constexpr const char* kSafetensorsSingleFileName = "model.safetensors";

// "5GB" (10^9), "500MB", "100KB", "2GiB", "512MiB", "64KiB", or a byte count. UserError naming `flag`.
int64_t parse_byte_size(const std::string& text, const std::string& flag);

class SafetensorsFolder {
 public:
  // Opens the index when there is one (every shard it names must exist and hold its tensors), else
  // model.safetensors, else the folder's one *.safetensors file. UserError naming the folder or file.
  explicit SafetensorsFolder(const std::string& directory);

  std::vector<std::string> tensor_names() const;  // sorted
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // UserError when absent
  std::vector<float> read_floats(const std::string& name) const;
  const std::string& directory() const { return directory_; }

 private:
  std::string directory_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

// Writes `tensors` into `directory` (which must exist): model.safetensors when their bytes fit in
// max_shard_bytes, else shards in the given order, each starting a new file when the next tensor would pass
// the limit (a tensor larger than the limit gets a file of its own), plus the index. Returns the files
// written.
std::vector<std::string> write_safetensors_folder(const std::string& directory,
                                                  const std::vector<SafetensorsTensor>& tensors,
                                                  int64_t max_shard_bytes,
                                                  const std::map<std::string, std::string>& metadata = {});

}  // namespace megatune::executor::checkpoint
