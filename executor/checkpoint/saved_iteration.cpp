// SavedIteration: the tracker's iteration, its shards.txt, and each shard checked against both.
#include "executor/checkpoint/saved_iteration.h"

#include <filesystem>

#include "base/user_error.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

namespace {

const std::string kRestoreOrEarlier =
    std::string("restore it, or load an earlier iteration by writing its number into ") + kTrackerFileName;

// "4 shards, rank_00000 .. rank_00003" for messages.
std::string listed_shards(const ShardIndex& index) {
  const std::string count =
      std::to_string(index.shards.size()) + (index.shards.size() == 1 ? " shard" : " shards");
  if (index.shards.size() == 1) return count + ", " + index.shards.front().first;
  return count + ", " + index.shards.front().first + " .. " + index.shards.back().first;
}

}  // namespace

SavedIteration SavedIteration::open_latest(const std::string& load_root) {
  std::error_code error;
  if (!fs::is_directory(load_root, error))
    throw UserError("checkpoint directory " + load_root + " does not exist; check --load");
  const std::optional<int64_t> iteration = read_latest_iteration(load_root);
  if (!iteration) {
    throw UserError("no checkpoint in " + load_root + " (" + kTrackerFileName +
                    " is missing); check --load, or drop it to start from scratch");
  }
  SavedIteration saved;
  saved.iteration_ = *iteration;
  saved.directory_ = iteration_directory(load_root, *iteration);
  if (!fs::is_directory(saved.directory_, error)) {
    throw UserError(
        "checkpoint " + saved.directory_ +
        " does not exist; the tracker names a deleted iteration: " + "write a saved iteration into " +
        kTrackerFileName + " or point --load at another checkpoint directory");
  }
  saved.index_ = read_shard_index(saved.directory_);
  if (saved.index_ && saved.index_->iteration != saved.iteration_) {
    throw UserError("checkpoint shard index " + (fs::path(saved.directory_) / kShardIndexFileName).string() +
                    " records iteration " + std::to_string(saved.index_->iteration) +
                    " but lies in the directory of iteration " + std::to_string(saved.iteration_) +
                    "; it was copied from another iteration: " + kRestoreOrEarlier);
  }
  return saved;
}

bool SavedIteration::single_shard() const {
  if (index_) return index_->shards.size() == 1 && index_->shards.front().first == kDefaultShardName;
  std::error_code error;
  return fs::is_directory(fs::path(directory_) / kDefaultShardName, error);
}

CheckpointReader SavedIteration::open_shard(const std::string& name) const {
  const std::string shard = (fs::path(directory_) / name).string();
  const uint32_t* recorded = index_ ? index_->checksum_of(name) : nullptr;
  if (index_ && recorded == nullptr) {
    throw UserError("checkpoint " + directory_ + " has no shard " + name + ": its " + kShardIndexFileName +
                    " lists " + listed_shards(*index_) +
                    "; it was saved by another parallel layout: resume from a save of the layout it names");
  }
  std::error_code error;
  if (!fs::is_directory(shard, error)) {
    throw UserError(
        "checkpoint shard " + shard + " is missing" +
        (index_ ? std::string(" (the save wrote it: ") + kShardIndexFileName + " lists it)" : "") +
        "; the checkpoint is incomplete: " + kRestoreOrEarlier);
  }
  CheckpointReader reader = CheckpointReader::open_directory(directory_, name);
  if (reader.iteration() != iteration_) {
    throw UserError("checkpoint shard " + shard + " records iteration " + std::to_string(reader.iteration()) +
                    " but lies in the directory of iteration " + std::to_string(iteration_) +
                    "; it was copied from another iteration: " + kRestoreOrEarlier);
  }
  if (recorded != nullptr && reader.manifest_checksum() != *recorded) {
    const std::string other = index_->shard_with_checksum(reader.manifest_checksum());
    if (!other.empty()) {
      throw UserError("checkpoint shard " + shard + " holds the shard this save wrote as " + other +
                      " (by its manifest checksum): shard directories were swapped or renamed; restore their "
                      "names");
    }
    throw UserError("checkpoint shard " + shard + " is not the one this save wrote (manifest checksum " +
                    checksum_hex(reader.manifest_checksum()) + ", " + kShardIndexFileName + " records " +
                    checksum_hex(*recorded) +
                    "); it was replaced, e.g. by another run's shard: " + kRestoreOrEarlier);
  }
  return reader;
}

}  // namespace megatune::executor::checkpoint
