// On-disk layout of megatune checkpoints (Megatron-style iteration directories) and the tensor dtypes
// they store.
//
//   <save>/latest_checkpointed_iteration.txt   the iteration number, replaced atomically after a save
//   <save>/iter_0000100/<shard>/tensors.bin     tensor bytes, each tensor at a 64-byte aligned offset
//   <save>/iter_0000100/<shard>/manifest.txt    text: header, metadata, one line per tensor, checksum
//   <save>/iter_0000100/shards.txt              the iteration's shards, each with its manifest's checksum
//   <save>/iter_0000100.staging/                 where a save is written before it is renamed into place
// <shard> is one writer's part ("mp_rank_00" for a single process; one per rank later).
//
// manifest.txt:
//   megatune-checkpoint 1
//   iteration <n>
//   tensors_bin_bytes <size of tensors.bin>
//   meta <key> <value percent-encoded>           (any number)
//   tensor <name> <dtype> <d0,d1,...|scalar> <offset_bytes> <size_bytes> <crc32c hex>
//   end <crc32c hex of every byte above this line>
// The manifest's end checksum covers its tensors' CRC-32Cs, so it is the shard's checksum.
//
// shards.txt (written when the iteration is finalized; saves before it have none and load without it):
//   megatune-checkpoint-shards 1
//   iteration <n>
//   shard <name> <crc32c hex: the end checksum of that shard's manifest>   (one line per shard)
//   end <crc32c hex of every byte above this line>
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace megatune::executor::checkpoint {

inline constexpr int kCheckpointFormatVersion = 1;
inline constexpr const char* kTrackerFileName = "latest_checkpointed_iteration.txt";
inline constexpr const char* kDefaultShardName = "mp_rank_00";
inline constexpr const char* kTensorsFileName = "tensors.bin";
inline constexpr const char* kManifestFileName = "manifest.txt";
inline constexpr const char* kShardIndexFileName = "shards.txt";
inline constexpr int64_t kTensorAlignmentBytes = 64;

enum class TensorDType : uint8_t { fp32, bf16, fp16, int32, int64, uint8 };

int64_t tensor_dtype_size_bytes(TensorDType dtype);
std::string tensor_dtype_name(TensorDType dtype);  // "fp32", "bf16", ...
std::optional<TensorDType> tensor_dtype_from_name(const std::string& name);

// "iter_0000100" (Megatron's 7-digit zero padding; wider numbers are written in full).
std::string iteration_directory_name(int64_t iteration);
std::string iteration_directory(const std::string& save_root, int64_t iteration);
std::string staging_directory(const std::string& save_root, int64_t iteration);
std::string tracker_file_path(const std::string& save_root);

// The iteration named by the tracker file; nullopt if there is none. Throws UserError if it is unreadable
// or does not hold a non-negative integer (Megatron's "release" is not supported: name an iteration).
std::optional<int64_t> read_latest_iteration(const std::string& save_root);
// Iterations with a complete directory under save_root, ascending.
std::vector<int64_t> list_checkpoint_iterations(const std::string& save_root);

// `body` (whole lines) followed by "end <crc32c hex of body>\n": how manifest.txt and shards.txt end.
std::string with_end_checksum(const std::string& body);
// Checks such a text: "" and *body_size / *checksum set when its last line is the end line of the bytes
// above it; else what is wrong ("is truncated (no final line)", "is truncated (no end line)", "fails its
// checksum").
std::string check_end_checksum(const std::string& text, size_t* body_size, uint32_t* checksum);
// "%08x" of a checksum, as the files write it.
std::string checksum_hex(uint32_t checksum);

// Metadata values are arbitrary bytes; in the manifest they are percent-encoded.
std::string percent_encode(const std::string& bytes);
std::string percent_decode(const std::string& text);  // throws std::invalid_argument on bad escapes

}  // namespace megatune::executor::checkpoint
