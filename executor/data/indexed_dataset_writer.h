// IndexedDatasetWriter: writes Megatron's indexed dataset (.bin tokens + .idx index, megatron.md §7)
// bit-exactly as megatron/core/datasets/indexed_dataset.py's IndexedDatasetBuilder does.
#pragma once
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "executor/data/index_dtype.h"

namespace megatune::executor::data {

class IndexedDatasetWriter {
 public:
  // Creates (truncates) bin_path and writes tokens to it as they come; idx_path is written by finalize().
  // Throws UserError if a file cannot be created.
  IndexedDatasetWriter(std::string bin_path, std::string idx_path, IndexDType dtype);
  ~IndexedDatasetWriter();  // closes the files; a writer never finalized leaves no .idx
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // Appends one sequence. Throws UserError if a token does not fit the dtype (naming the token).
  void add_sequence(std::span<const int32_t> tokens);
  void add_sequence(std::span<const int64_t> tokens);
  // Closes the current document (the sequences added since the last end_document()).
  void end_document();
  // add_sequence + end_document: one document of one sequence (preprocess without sentence splitting).
  void add_document(std::span<const int32_t> tokens);
  // Appends the sequences of another dataset prefix (Megatron's add_index), documents included.
  void append_dataset(const std::string& path_prefix);
  // Flushes the .bin, writes the .idx, fsyncs both. Must be called exactly once.
  void finalize();

  int64_t num_sequences() const { return static_cast<int64_t>(sequence_lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(document_indices_.size()) - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  IndexDType dtype() const { return dtype_; }

 private:
  void write_bytes(const void* bytes, size_t size_bytes);
  template <typename Token>
  void add_tokens(std::span<const Token> tokens);

  std::string bin_path_;
  std::string idx_path_;
  IndexDType dtype_;
  std::FILE* bin_file_ = nullptr;
  bool finalized_ = false;
  int64_t num_tokens_ = 0;
  std::vector<int32_t> sequence_lengths_;  // (N)
  std::vector<int64_t> document_indices_;  // (D), starts with 0
  std::vector<unsigned char> staging_;     // token bytes of the sequence being converted
};

}  // namespace megatune::executor::data
