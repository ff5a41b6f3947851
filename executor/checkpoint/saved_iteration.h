// SavedIteration: the iteration a --load directory's tracker names, as a load opens it: its shard names
// (shards.txt; for a save from before the index, the shard directories there) and each shard opened with
// every check that needs no model: its manifest and the manifest's checksum (CheckpointReader), the
// iteration the manifest records against the tracker's, and the manifest's checksum against the one
// shards.txt recorded for that name. Saves without shards.txt load with the first two checks.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/shard_index.h"

namespace megatune::executor::checkpoint {

class SavedIteration {
 public:
  // Throws UserError (naming the file and the fix) when load_root has no tracker, the iteration directory
  // it names is missing, or its shards.txt is damaged.
  static SavedIteration open_latest(const std::string& load_root);

  int64_t iteration() const { return iteration_; }
  const std::string& directory() const { return directory_; }
  bool indexed() const { return index_.has_value(); }
  // The one shard of a single-process save (kDefaultShardName), not one shard per rank.
  bool single_shard() const;
  // Shard `name`, checked; UserError naming its file and the cause: not written by this save, missing,
  // damaged, copied from another iteration, or another shard's (swapped) or another save's (replaced).
  CheckpointReader open_shard(const std::string& name) const;

 private:
  int64_t iteration_ = 0;
  std::string directory_;
  std::optional<ShardIndex> index_;
};

}  // namespace megatune::executor::checkpoint
