// Rank shard names, the coordinates a shard's manifest records, and their checks on load.
#include "executor/training/checkpoint_shards.h"

#include <array>
#include <iomanip>
#include <sstream>
#include <utility>

#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "layouts/user_error.h"

namespace megatune::executor {
namespace {

// The metadata key of each recorded coordinate and the group it is this rank's index in. Routed experts are
// split over the expert-tensor-parallel group.
constexpr std::array<std::pair<const char*, CommGroup>, 6> kCoordinates{
    {{"tp_rank", CommGroup::kTensor},
     {"pp_rank", CommGroup::kPipeline},
     {"dp_rank", CommGroup::kData},
     {"cp_rank", CommGroup::kContext},
     {"ep_rank", CommGroup::kExpert},
     {"etp_rank", CommGroup::kExpertTensor}}};

const std::string kRestoreNames = "shard directories were swapped or renamed: restore their names";

std::string recorded(const checkpoint::CheckpointReader& shard, const std::string& key) {
  return shard.has_metadata(key) ? shard.metadata_value(key) : "(none)";
}

}  // namespace

std::string rank_shard_name(int world_rank) {
  std::ostringstream name;
  name << "rank_" << std::setw(5) << std::setfill('0') << world_rank;
  return name.str();
}

void record_shard_coordinates(checkpoint::CheckpointWriter& writer, const Communicator& communicator,
                              const std::string& layout) {
  writer.add_metadata("layout", layout);
  writer.add_metadata_int("world_size", communicator.world_size());
  writer.add_metadata_int("world_rank", communicator.world_rank());
  for (const auto& [key, group] : kCoordinates) writer.add_metadata_int(key, communicator.rank(group));
  writer.add_metadata_int("tp_size", communicator.size(CommGroup::kTensor));
  writer.add_metadata_int("etp_size", communicator.size(CommGroup::kExpertTensor));
}

void require_shard_of_rank(const checkpoint::CheckpointReader& shard, int world_rank,
                           const checkpoint::CheckpointReader& first) {
  if (shard.has_metadata("world_rank") && shard.metadata_int("world_rank") != world_rank) {
    throw UserError("checkpoint shard " + shard.directory() + " was written by world rank " +
                    shard.metadata_value("world_rank") + ", not rank " + std::to_string(world_rank) + ": " +
                    kRestoreNames);
  }
  for (const char* key : {"layout", "world_size"}) {
    if (recorded(shard, key) != recorded(first, key)) {
      throw UserError("checkpoint shard " + shard.directory() + " was saved with " + key + " " +
                      recorded(shard, key) + " but " + first.directory() + " with " + recorded(first, key) +
                      "; the shards come from different saves: resume from a directory one save wrote");
    }
  }
}

void require_own_coordinates(const checkpoint::CheckpointReader& shard, const Communicator& communicator) {
  for (const auto& [key, group] : kCoordinates) {
    if (!shard.has_metadata(key)) continue;  // saves before it recorded pp / dp / cp / ep ranks
    const std::int64_t own = communicator.rank(group);
    if (shard.metadata_int(key) != own) {
      throw UserError("checkpoint shard " + shard.directory() + " records " + key + " " +
                      shard.metadata_value(key) + " but world rank " +
                      std::to_string(communicator.world_rank()) + " of this layout has " + key + " " +
                      std::to_string(own) + ": " + kRestoreNames);
    }
  }
}

}  // namespace megatune::executor
