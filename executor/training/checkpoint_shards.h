// The shard each rank of a parallel run saves: its name (rank_NNNNN), the coordinates its manifest records
// (the layout, world rank and size, and the rank's tp / pp / dp / cp / ep / etp ranks), and the checks a
// load makes of them, so that a shard lying under another rank's name is refused instead of loaded.
#pragma once
#include <string>

#include "executor/parallel/communicator.h"

namespace megatune::executor {

namespace checkpoint {
class CheckpointReader;
class CheckpointWriter;
}  // namespace checkpoint

std::string rank_shard_name(int world_rank);  // "rank_00003"

// Adds the layout description and this rank's coordinates to its shard's metadata.
void record_shard_coordinates(checkpoint::CheckpointWriter& writer, const Communicator& communicator,
                              const std::string& layout);

// Throws UserError naming the shard when its manifest records another world rank than `world_rank` (the
// name it lies under), or another layout or world size than `first` (the save's rank_00000).
void require_shard_of_rank(const checkpoint::CheckpointReader& shard, int world_rank,
                           const checkpoint::CheckpointReader& first);

// Resuming under the saved layout: throws UserError naming the shard when a coordinate it records differs
// from this rank's.
void require_own_coordinates(const checkpoint::CheckpointReader& shard, const Communicator& communicator);

}  // namespace megatune::executor
