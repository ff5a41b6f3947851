// Rank shard names, the coordinates a shard's manifest records, and their checks on load.
#include "executor/training/checkpoint_shards.h"

#include <array>
#include <iomanip>
#include <map>
#include <sstream>
#include <utility>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"

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

ShardCoordinates shard_coordinates(const Communicator& communicator) {
  ShardCoordinates c;
  c.world_size = communicator.world_size();
  c.world_rank = communicator.world_rank();
  int* ranks[] = {&c.tp, &c.pp, &c.dp, &c.cp, &c.ep, &c.etp};
  for (std::size_t i = 0; i < kCoordinates.size(); ++i) *ranks[i] = communicator.rank(kCoordinates[i].second);
  c.tp_size = communicator.size(CommGroup::kTensor);
  c.etp_size = communicator.size(CommGroup::kExpertTensor);
  return c;
}

void record_shard_coordinates(checkpoint::CheckpointWriter& writer, const ShardCoordinates& c,
                              const std::string& layout) {
  writer.add_metadata("layout", layout);
  writer.add_metadata_int("world_size", c.world_size);
  writer.add_metadata_int("world_rank", c.world_rank);
  const int ranks[] = {c.tp, c.pp, c.dp, c.cp, c.ep, c.etp};
  for (std::size_t i = 0; i < kCoordinates.size(); ++i)
    writer.add_metadata_int(kCoordinates[i].first, ranks[i]);
  writer.add_metadata_int("tp_size", c.tp_size);
  writer.add_metadata_int("etp_size", c.etp_size);
}

void record_shard_coordinates(checkpoint::CheckpointWriter& writer, const Communicator& communicator,
                              const std::string& layout) {
  record_shard_coordinates(writer, shard_coordinates(communicator), layout);
}

std::vector<float> assemble_unsharded(const std::vector<checkpoint::CheckpointReader>& shards,
                                      const ParameterEntry& e, const std::string& name) {
  const bool expert = e.expert >= 0;
  const char* rank_key = expert ? "etp_rank" : "tp_rank";
  const char* size_key = expert ? "etp_size" : "tp_size";
  std::map<std::int64_t, std::vector<float>> slices;
  std::int64_t source_tp = 0;
  for (const checkpoint::CheckpointReader& shard : shards) {
    const checkpoint::TensorInfo* info = shard.find_tensor(name);
    if (info == nullptr) continue;
    const std::int64_t r = shard.has_metadata(rank_key) ? shard.metadata_int(rank_key) : 0;
    source_tp = shard.has_metadata(size_key) ? shard.metadata_int(size_key) : 1;
    if (slices.count(r)) continue;
    std::vector<float> values(static_cast<std::size_t>(info->num_elements()));
    shard.read_tensor(name, checkpoint::TensorDType::fp32, info->shape, values.data());
    slices.emplace(r, std::move(values));
  }
  if (source_tp == 0 || static_cast<std::int64_t>(slices.size()) != source_tp)
    throw UserError("checkpoint " + shards.front().directory() + " lacks tensor-parallel slices of " + name +
                    "; resume from a complete save");
  std::vector<std::vector<float>> ordered;
  for (auto& [r, values] : slices) ordered.push_back(std::move(values));
  return tensor_parallel_assemble(e, ordered);
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
