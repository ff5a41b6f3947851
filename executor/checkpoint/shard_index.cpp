// shards.txt: writing it with its end checksum, reading and checking it.
#include "executor/checkpoint/shard_index.h"

#include <filesystem>
#include <sstream>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_format.h"
#include "executor/checkpoint/durable_file.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

const uint32_t* ShardIndex::checksum_of(const std::string& name) const {
  for (const auto& [shard, checksum] : shards)
    if (shard == name) return &checksum;
  return nullptr;
}

std::string ShardIndex::shard_with_checksum(uint32_t checksum) const {
  for (const auto& [shard, value] : shards)
    if (value == checksum) return shard;
  return "";
}

void write_shard_index(const std::string& directory, const ShardIndex& index) {
  std::ostringstream body;
  body << "megatune-checkpoint-shards 1\n"
       << "iteration " << index.iteration << "\n";
  for (const auto& [name, checksum] : index.shards)
    body << "shard " << name << " " << checksum_hex(checksum) << "\n";
  const std::string text = with_end_checksum(body.str());
  DurableFile file((fs::path(directory) / kShardIndexFileName).string());
  file.write(text.data(), text.size());
  file.close();
}

std::optional<ShardIndex> read_shard_index(const std::string& directory) {
  const std::string path = (fs::path(directory) / kShardIndexFileName).string();
  if (non_regular_file_reason(path) == "does not exist") return std::nullopt;
  const auto damaged = [&](const std::string& what) {
    return UserError("checkpoint shard index " + path + " " + what + "; the checkpoint is damaged: load an " +
                     "earlier iteration by writing its number into " + kTrackerFileName);
  };
  const std::string text = read_regular_file(path, "checkpoint shard index", std::size_t{64} << 20);
  size_t body_size = 0;
  uint32_t checksum = 0;
  const std::string problem = check_end_checksum(text, &body_size, &checksum);
  if (!problem.empty()) throw damaged(problem);
  std::istringstream lines(text.substr(0, body_size));
  std::string header, kind;
  ShardIndex index;
  if (!std::getline(lines, header) || header != "megatune-checkpoint-shards 1")
    throw damaged("does not start with megatune-checkpoint-shards 1");
  if (!(lines >> kind >> index.iteration) || kind != "iteration" || index.iteration < 0)
    throw damaged("lacks its iteration line");
  for (std::string name, hex; lines >> kind >> name >> hex;) {
    if (kind != "shard" || hex.size() != 8 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw damaged("has a bad shard line");
    index.shards.emplace_back(name, static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
  }
  if (index.shards.empty()) throw damaged("lists no shard");
  return index;
}

}  // namespace megatune::executor::checkpoint
