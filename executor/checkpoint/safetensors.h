// Safetensors files (Hugging Face's tensor format): an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}}, then the raw
// little-endian tensor bytes (offsets relative to the byte after the header). Reading checks the whole
// header before any tensor is read: a bad file is one UserError naming it and the fix, never a crash.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "executor/checkpoint/checkpoint_format.h"

namespace megatune::executor::checkpoint {

// "F32" | "BF16" | "F16" | "I32" | "I64" | "U8" and back; unknown names give nullopt.
std::string safetensors_dtype_name(TensorDType dtype);
std::optional<TensorDType> safetensors_dtype_from_name(const std::string& name);

struct SafetensorsEntry {
  std::string name;
  TensorDType dtype = TensorDType::fp32;
  std::vector<int64_t> shape;
  int64_t offset_bytes = 0;  // from the start of the file
  int64_t size_bytes = 0;
  int64_t num_elements() const;
};

class SafetensorsFile {
 public:
  // Parses and checks the header of `path` (truncation, header length, JSON, dtypes, shapes against byte
  // counts, offsets in range and not overlapping). Throws UserError naming the file.
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in file order
  const SafetensorsEntry* find(const std::string& name) const;               // null when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The tensor's raw bytes (size_bytes). Throws UserError if absent or the read fails.
  std::vector<uint8_t> read_bytes(const std::string& name) const;
  // The tensor converted to fp32 (F32, BF16 or F16; others are refused naming the dtype).
  std::vector<float> read_floats(const std::string& name) const;

 private:
  std::string path_;
  int64_t file_bytes_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: `bytes` holds product(shape) * dtype size bytes, little-endian.
struct SafetensorsTensor {
  std::string name;
  TensorDType dtype = TensorDType::fp32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;
};

// Writes `path` (through a temporary name, fsync'd, renamed into place). The header is padded with spaces
// to a multiple of 8 bytes, as the reference writer does. Throws UserError on a bad tensor or a failed write.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// fp32 values in `dtype` (F32, BF16 rounded to nearest even, F16), as little-endian bytes.
std::vector<uint8_t> encode_floats(std::span<const float> values, TensorDType dtype);
// The inverse for F32, BF16 and F16 bytes.
std::vector<float> decode_floats(std::span<const uint8_t> bytes, TensorDType dtype);

}  // namespace megatune::executor::checkpoint
