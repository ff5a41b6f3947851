// libFuzzer target: the readers of user files must answer any bytes with a UserError (or success), never a
// crash, hang or sanitizer report. The first input byte picks the reader: JSONL line, indexed dataset
// (.idx + .bin, split at a position given by the next two bytes), or checkpoint manifest + tensors.bin.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/json_line.h"
#include "layouts/fuzz/fuzz_files.h"

namespace {

namespace fs = std::filesystem;
using namespace megatune::executor;

// The fuzz work directory with the iteration directory the checkpoint reader expects.
const fs::path& work_directory() {
  const fs::path& path = megatune::fuzz::work_directory("data");
  static const bool created = fs::create_directories(path / "iter_0000001" / "mp_rank_00");
  (void)created;
  return path;
}

using megatune::fuzz::write_file;

void fuzz_json(const uint8_t* data, size_t size) {
  try {
    const data::JsonLine line(std::string_view(reinterpret_cast<const char*>(data), size));
    if (line.has("text")) (void)line.string_field("text");
    if (line.has("ids")) (void)line.integer_array_field("ids");
  } catch (const data::JsonLineError&) {
  }
}

void fuzz_indexed_dataset(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t split =
      std::min<size_t>(size - 2, static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8));
  const fs::path prefix = work_directory() / "dataset";
  write_file(prefix.string() + ".idx", data + 2, split);
  write_file(prefix.string() + ".bin", data + 2 + split, size - 2 - split);
  try {
    const data::IndexedDataset dataset(prefix.string());
    for (int64_t i = 0; i < dataset.num_sequences() && i < 64; ++i) (void)dataset.sequence(i);
    for (int64_t i = 0; i <= dataset.num_documents() && i < 64; ++i) (void)dataset.document_index(i);
  } catch (const megatune::UserError&) {
  }
}

void fuzz_checkpoint(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t split =
      std::min<size_t>(size - 2, static_cast<size_t>(data[0]) | (static_cast<size_t>(data[1]) << 8));
  const fs::path shard = work_directory() / "iter_0000001" / "mp_rank_00";
  write_file(shard / checkpoint::kManifestFileName, data + 2, split);
  write_file(shard / checkpoint::kTensorsFileName, data + 2 + split, size - 2 - split);
  try {
    const auto reader = checkpoint::CheckpointReader::open(work_directory().string(), 1);
    if (reader.tensors().size() < 16) {
      int64_t total = 0;
      for (const auto& tensor : reader.tensors()) total += tensor.size_bytes;
      if (total < (1 << 20)) reader.verify_all();
    }
    for (const auto& [key, value] : reader.metadata()) (void)reader.metadata_bytes(key);
  } catch (const megatune::UserError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  switch (data[0] % 3) {
    case 0:
      fuzz_json(data + 1, size - 1);
      break;
    case 1:
      fuzz_indexed_dataset(data + 1, size - 1);
      break;
    default:
      fuzz_checkpoint(data + 1, size - 1);
      break;
  }
  return 0;
}
