// CheckpointReader: opens one shard of a saved iteration, lists its tensors and metadata, and reads
// tensors into caller buffers after checking name, dtype, shape, size and CRC-32C.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "executor/checkpoint/checkpoint_format.h"

namespace megatune::executor::checkpoint {

struct TensorInfo {
  std::string name;
  TensorDType dtype = TensorDType::fp32;
  std::vector<int64_t> shape;  // empty = scalar
  int64_t offset_bytes = 0;    // in tensors.bin
  int64_t size_bytes = 0;
  uint32_t crc32c = 0;
  int64_t num_elements() const;
};

class CheckpointReader {
 public:
  // The iteration named by <save_root>/latest_checkpointed_iteration.txt. Throws UserError when there is
  // no tracker file or its directory is missing or damaged (each message names the file and the fix).
  static CheckpointReader open_latest(const std::string& save_root,
                                      const std::string& shard_name = kDefaultShardName);
  // A given iteration under save_root.
  static CheckpointReader open(const std::string& save_root, int64_t iteration,
                               const std::string& shard_name = kDefaultShardName);
  // An iteration directory given directly (<save>/iter_0000100).
  static CheckpointReader open_directory(const std::string& iteration_directory,
                                         const std::string& shard_name = kDefaultShardName);

  int64_t iteration() const { return iteration_; }  // the iteration the manifest records
  const std::string& directory() const { return shard_directory_; }
  // The manifest's end checksum (CRC-32C of the manifest, tensor checksums included): the shard's checksum.
  uint32_t manifest_checksum() const { return manifest_checksum_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(const std::string& name) const;  // null if absent
  bool has_tensor(const std::string& name) const { return find_tensor(name) != nullptr; }

  // Reads tensor `name` into `out` (size_bytes bytes). Throws UserError if the tensor is missing, its dtype
  // or shape differs from the expected ones (naming both), or its bytes fail the CRC-32C check.
  void read_tensor(const std::string& name, TensorDType expected_dtype,
                   const std::vector<int64_t>& expected_shape, void* out) const;
  // Reads and CRC-checks every tensor (used by `megatune` to verify a checkpoint). Throws on the first bad.
  void verify_all() const;

  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has_metadata(const std::string& key) const { return metadata_.count(key) != 0; }
  // Throws UserError naming the key and the checkpoint when absent (or not an integer).
  const std::string& metadata_value(const std::string& key) const;
  int64_t metadata_int(const std::string& key) const;
  std::vector<uint8_t> metadata_bytes(const std::string& key) const;
  // Throws UserError "checkpoint <dir> was saved with <key>=<saved> but this run has <expected>; ..."
  // when the stored value differs (or is absent): for arguments that must match on load.
  void require_metadata_equal(const std::string& key, const std::string& expected) const;

 private:
  CheckpointReader() = default;
  void load_manifest();

  std::string shard_directory_;
  int64_t iteration_ = 0;
  int64_t tensors_bin_bytes_ = 0;
  uint32_t manifest_checksum_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace megatune::executor::checkpoint
