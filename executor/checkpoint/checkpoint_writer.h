// CheckpointWriter: saves named tensors and metadata of one iteration atomically: written to a staging
// directory, fsync'd, renamed into place as <save>/iter_NNNNNNN, and only then the tracker file
// latest_checkpointed_iteration.txt is replaced. A crash at any point leaves the previous checkpoint
// loadable and never a half-written one in place.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "executor/checkpoint/checkpoint_format.h"
#include "executor/checkpoint/durable_file.h"

namespace megatune::executor::checkpoint {

struct CheckpointWriteOptions {
  std::string shard_name = kDefaultShardName;  // this writer's part of the iteration directory
  int64_t keep_last = 0;  // > 0: after a commit delete all but the newest keep_last iteration directories
  // The saving run's id (run_lineage.h). When set, the writer refuses a save_root owned by another run
  // (claiming an unclaimed one, which refuses one holding another run's checkpoints) and records the id in
  // the manifest's metadata ("run_id"), which a resumed run adopts.
  std::string run_id;
};

class CheckpointWriter {
 public:
  // Creates <save_root> if needed and the staging directory (a stale shard left there by a crashed save is
  // removed). Throws UserError if save_root cannot be created or written, or belongs to another run.
  CheckpointWriter(std::string save_root, int64_t iteration, CheckpointWriteOptions options = {});
  ~CheckpointWriter();  // an uncommitted writer removes its partial shard; the checkpoint in place is
                        // untouched
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Streams the tensor into tensors.bin now (the caller may reuse `data` afterwards). shape: dimensions
  // (empty = scalar); data holds product(shape) * dtype size bytes. Throws UserError for a name that is
  // empty, holds whitespace or '%', or was already added.
  void add_tensor(const std::string& name, TensorDType dtype, std::vector<int64_t> shape, const void* data);
  // Metadata: any bytes under a key without whitespace. Later values replace earlier ones.
  void add_metadata(const std::string& key, const std::string& value);
  void add_metadata_int(const std::string& key, int64_t value);
  void add_metadata_bytes(const std::string& key, std::span<const uint8_t> value);

  // Writes this shard completely (tensors.bin and manifest.txt fsync'd) into the staging directory.
  // A multi-process save calls this on every rank, then finalize_iteration() on one rank.
  void commit_shard();
  // commit_shard() + finalize_iteration() for a single-process save.
  void commit();

  // Writes the iteration's shards.txt (each expected shard's manifest checksum), renames the staging
  // directory of `iteration` into place (replacing an older save of the same iteration atomically),
  // fsyncs, replaces the tracker file, then applies keep_last. Throws UserError if a shard in
  // `expected_shards` is missing from the staging directory or its manifest is damaged.
  static void finalize_iteration(const std::string& save_root, int64_t iteration,
                                 const std::vector<std::string>& expected_shards, int64_t keep_last = 0);

  const std::string& save_root() const { return save_root_; }
  int64_t iteration() const { return iteration_; }

 private:
  struct TensorEntry {
    std::string name;
    TensorDType dtype;
    std::vector<int64_t> shape;
    int64_t offset_bytes;
    int64_t size_bytes;
    uint32_t crc32c;
  };
  std::string shard_directory() const;

  std::string save_root_;
  int64_t iteration_;
  CheckpointWriteOptions options_;
  std::unique_ptr<DurableFile> tensors_file_;
  std::vector<TensorEntry> tensors_;
  std::map<std::string, std::string> metadata_;
  bool shard_committed_ = false;
};

}  // namespace megatune::executor::checkpoint
