// The shard each rank of a parallel run saves: its name (rank_NNNNN), the coordinates its manifest records
// (the layout, world rank and size, and the rank's tp / pp / dp / cp / ep / etp ranks), and the checks a
// load makes of them, so that a shard lying under another rank's name is refused instead of loaded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/model/parameter_layout.h"
#include "executor/parallel/communicator.h"

namespace megatune::executor {

namespace checkpoint {
class CheckpointReader;
class CheckpointWriter;
}  // namespace checkpoint

std::string rank_shard_name(int world_rank);  // "rank_00003"

// A rank's place in its layout, as its shard's manifest records it.
struct ShardCoordinates {
  int world_size = 1, world_rank = 0;
  int tp = 0, pp = 0, dp = 0, cp = 0, ep = 0, etp = 0;
  int tp_size = 1, etp_size = 1;
};
ShardCoordinates shard_coordinates(const Communicator& communicator);

// Adds the layout description and this rank's coordinates to its shard's metadata.
void record_shard_coordinates(checkpoint::CheckpointWriter& writer, const ShardCoordinates& coordinates,
                              const std::string& layout);
void record_shard_coordinates(checkpoint::CheckpointWriter& writer, const Communicator& communicator,
                              const std::string& layout);

// The unsharded (global) values of checkpoint tensor `name` of parameter `entry` from every rank's shard of
// one save (a single-rank save: one shard): its tensor-parallel slices (a routed expert's: its
// expert-tensor-parallel slices; any data-parallel copy of each) assembled in rank order. UserError when a
// slice is missing.
std::vector<float> assemble_unsharded(const std::vector<checkpoint::CheckpointReader>& shards,
                                      const ParameterEntry& entry, const std::string& name);

// Throws UserError naming the shard when its manifest records another world rank than `world_rank` (the
// name it lies under), or another layout or world size than `first` (the save's rank_00000).
void require_shard_of_rank(const checkpoint::CheckpointReader& shard, int world_rank,
                           const checkpoint::CheckpointReader& first);

// Resuming under the saved layout: throws UserError naming the shard when a coordinate it records differs
// from this rank's.
void require_own_coordinates(const checkpoint::CheckpointReader& shard, const Communicator& communicator);

}  // namespace megatune::executor
