// ShardIndex: shards.txt of an iteration directory (checkpoint_format.h), the shards one save wrote, each
// with its manifest checksum, so that a load can tell a shard that was replaced, swapped or copied in from
// another iteration or run from the one the save wrote.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace megatune::executor::checkpoint {

struct ShardIndex {
  int64_t iteration = 0;
  std::vector<std::pair<std::string, uint32_t>> shards;  // (name, manifest checksum), in the save's order
  const uint32_t* checksum_of(const std::string& name) const;  // null when the save wrote no such shard
  // The listed shard whose checksum is `checksum` ("" when none).
  std::string shard_with_checksum(uint32_t checksum) const;
};

// Writes <directory>/shards.txt (fsync'd). The directory must exist.
void write_shard_index(const std::string& directory, const ShardIndex& index);
// The index of <directory>; nullopt when it has no shards.txt (a save from before the index). Throws
// UserError naming the file when it is damaged.
std::optional<ShardIndex> read_shard_index(const std::string& directory);

}  // namespace megatune::executor::checkpoint
