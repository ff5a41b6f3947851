// IndexedDataset: reader of Megatron's indexed dataset ({prefix}.idx + {prefix}.bin, megatron.md §7).
// Both files are memory-mapped; everything in the .idx is validated against the .bin on open.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "executor/data/index_dtype.h"
#include "executor/data/sequence_source.h"

namespace megatune::executor::data {

// Layout of an .idx file (little-endian):
//   0   magic "MMIDIDX\0\0" (9 bytes)      9  version uint64 = 1        17 dtype code uint8
//   18  sequence_count N uint64            26 document_count D uint64 (= documents + 1)
//   34  int32[N] sequence lengths (tokens)     34+4N  int64[N] sequence pointers (byte offsets in .bin)
//   34+12N int64[D] document indices (0, then the sequence count after each document)
//   34+12N+8D int8[N] sequence modes (multimodal datasets only; optional)
inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr int64_t kIndexHeaderBytes = 34;

std::string index_file_path(const std::string& path_prefix);  // prefix + ".idx"
std::string data_file_path(const std::string& path_prefix);   // prefix + ".bin"

class IndexedDataset final : public SequenceSource {
 public:
  // Opens {path_prefix}.idx and {path_prefix}.bin. Throws UserError (one line naming the file, what is
  // wrong and the fix) for a missing file, wrong magic, version or dtype code, counts that do not fit the
  // file sizes, pointers out of range or not contiguous, document indices out of order, a truncated or
  // over-long .bin.
  explicit IndexedDataset(std::string path_prefix);
  ~IndexedDataset() override;
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& path_prefix() const { return path_prefix_; }
  IndexDType dtype() const { return dtype_; }
  int64_t num_sequences() const override { return static_cast<int64_t>(sequence_lengths_.size()); }
  int64_t num_documents() const { return document_count_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<int32_t>& sequence_lengths() const override { return sequence_lengths_; }
  int64_t sequence_pointer_bytes(int64_t sequence) const;  // byte offset of the sequence in .bin
  // Entry i of the document indices (0 <= i <= num_documents()); document j = sequences
  // [document_index(j), document_index(j + 1)).
  int64_t document_index(int64_t i) const;
  bool has_sequence_modes() const { return has_sequence_modes_; }
  int8_t sequence_mode(int64_t sequence) const;  // requires has_sequence_modes()

  void read_tokens(int64_t sequence, int64_t offset, int64_t length, int32_t* out) const override;
  // The whole sequence, widened to int32 (int64 tokens outside int32 throw UserError).
  std::vector<int32_t> sequence(int64_t sequence) const;
  std::string description() const override;

 private:
  struct Mapping {
    const std::byte* data = nullptr;
    size_t size_bytes = 0;
  };
  static Mapping map_file(const std::string& path);
  static void unmap(Mapping& mapping);
  void validate_and_load();

  std::string path_prefix_;
  Mapping index_;
  Mapping data_;
  IndexDType dtype_ = IndexDType::uint16;
  int64_t document_count_ = 0;
  int64_t num_tokens_ = 0;
  bool has_sequence_modes_ = false;
  std::vector<int32_t> sequence_lengths_;  // (N), copied out of the .idx (its int32 array is unaligned)
};

}  // namespace megatune::executor::data
