// IndexedDatasetWriter: streams tokens to .bin and writes the .idx on finalize (megatron.md §7).
#include "executor/data/indexed_dataset_writer.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "base/user_error.h"
#include "executor/data/indexed_dataset.h"

namespace megatune::executor::data {

namespace {

std::FILE* open_for_writing(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    throw UserError("cannot create " + path + ": " + std::strerror(errno) +
                    "; check that its directory exists and is writable");
  }
  return file;
}

void write_or_throw(std::FILE* file, const void* bytes, size_t size_bytes, const std::string& path) {
  if (size_bytes > 0 && std::fwrite(bytes, 1, size_bytes, file) != size_bytes) {
    throw UserError("cannot write " + path + ": " + std::strerror(errno) + "; check free disk space");
  }
}

void flush_sync_close(std::FILE*& file, const std::string& path) {
  bool ok = std::fflush(file) == 0;
  ok = ok && ::fsync(::fileno(file)) == 0;
  const int error = errno;
  ok = (std::fclose(file) == 0) && ok;
  file = nullptr;
  if (!ok) throw UserError("cannot write " + path + ": " + std::strerror(error) + "; check free disk space");
}

template <typename Stored>
void store(std::vector<unsigned char>& staging, size_t index, Stored value) {
  std::memcpy(staging.data() + index * sizeof(Stored), &value, sizeof(Stored));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(std::string bin_path, std::string idx_path, IndexDType dtype)
    : bin_path_(std::move(bin_path)), idx_path_(std::move(idx_path)), dtype_(dtype), document_indices_{0} {
  bin_file_ = open_for_writing(bin_path_);
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_file_ != nullptr) std::fclose(bin_file_);
}

void IndexedDatasetWriter::write_bytes(const void* bytes, size_t size_bytes) {
  if (finalized_ || bin_file_ == nullptr)
    throw std::logic_error("IndexedDatasetWriter used after finalize()");
  write_or_throw(bin_file_, bytes, size_bytes, bin_path_);
}

template <typename Token>
void IndexedDatasetWriter::add_tokens(std::span<const Token> tokens) {
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UserError("a sequence of " + std::to_string(tokens.size()) + " tokens for " + bin_path_ +
                    " exceeds the int32 length field of the index; split the document");
  }
  const int64_t lowest = index_dtype_min_value(dtype_);
  const int64_t highest = index_dtype_max_value(dtype_);
  const size_t item_bytes = static_cast<size_t>(index_dtype_size_bytes(dtype_));
  staging_.resize(tokens.size() * item_bytes);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t token = static_cast<int64_t>(tokens[i]);
    if (token < lowest || token > highest) {
      throw UserError("token id " + std::to_string(token) + " does not fit the " + index_dtype_name(dtype_) +
                      " dtype of " + bin_path_ +
                      "; give the right vocabulary size (int32 is used from 65500)");
    }
    switch (dtype_) {
      case IndexDType::uint8:
        store(staging_, i, static_cast<uint8_t>(token));
        break;
      case IndexDType::int8:
        store(staging_, i, static_cast<int8_t>(token));
        break;
      case IndexDType::int16:
        store(staging_, i, static_cast<int16_t>(token));
        break;
      case IndexDType::uint16:
        store(staging_, i, static_cast<uint16_t>(token));
        break;
      case IndexDType::int32:
        store(staging_, i, static_cast<int32_t>(token));
        break;
      case IndexDType::int64:
        store(staging_, i, token);
        break;
      case IndexDType::float32:
        store(staging_, i, static_cast<float>(token));
        break;
      case IndexDType::float64:
        store(staging_, i, static_cast<double>(token));
        break;
    }
  }
  write_bytes(staging_.data(), staging_.size());
  sequence_lengths_.push_back(static_cast<int32_t>(tokens.size()));
  num_tokens_ += static_cast<int64_t>(tokens.size());
}

void IndexedDatasetWriter::add_sequence(std::span<const int32_t> tokens) { add_tokens(tokens); }
void IndexedDatasetWriter::add_sequence(std::span<const int64_t> tokens) { add_tokens(tokens); }

void IndexedDatasetWriter::end_document() { document_indices_.push_back(num_sequences()); }

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  add_sequence(tokens);
  end_document();
}

void IndexedDatasetWriter::append_dataset(const std::string& path_prefix) {
  const IndexedDataset other(path_prefix);
  if (other.dtype() != dtype_) {
    throw UserError("cannot append " + path_prefix + " (" + index_dtype_name(other.dtype()) + ") to " +
                    bin_path_ + " (" + index_dtype_name(dtype_) +
                    "); preprocess both with the same vocabulary size");
  }
  const int64_t sequence_offset = num_sequences();
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < other.num_sequences(); ++i) {
    tokens.resize(static_cast<size_t>(other.sequence_lengths()[static_cast<size_t>(i)]));
    other.read_tokens(i, 0, static_cast<int64_t>(tokens.size()), tokens.data());
    add_sequence(std::span<const int32_t>(tokens));
  }
  for (int64_t i = 1; i <= other.num_documents(); ++i) {
    document_indices_.push_back(sequence_offset + other.document_index(i));
  }
}

void IndexedDatasetWriter::finalize() {
  if (finalized_) throw std::logic_error("IndexedDatasetWriter::finalize() called twice");
  flush_sync_close(bin_file_, bin_path_);
  finalized_ = true;

  std::FILE* idx = open_for_writing(idx_path_);
  try {
    const uint64_t version = kIndexVersion;
    const uint8_t code = static_cast<uint8_t>(dtype_);
    const uint64_t sequence_count = sequence_lengths_.size();
    const uint64_t document_count = document_indices_.size();
    write_or_throw(idx, kIndexMagic, sizeof(kIndexMagic), idx_path_);
    write_or_throw(idx, &version, sizeof(version), idx_path_);
    write_or_throw(idx, &code, sizeof(code), idx_path_);
    write_or_throw(idx, &sequence_count, sizeof(sequence_count), idx_path_);
    write_or_throw(idx, &document_count, sizeof(document_count), idx_path_);
    write_or_throw(idx, sequence_lengths_.data(), sequence_lengths_.size() * sizeof(int32_t), idx_path_);
    std::vector<int64_t> pointers(sequence_lengths_.size());
    const int64_t item_bytes = index_dtype_size_bytes(dtype_);
    int64_t running_bytes = 0;
    for (size_t i = 0; i < sequence_lengths_.size(); ++i) {
      pointers[i] = running_bytes;
      running_bytes += sequence_lengths_[i] * item_bytes;
    }
    write_or_throw(idx, pointers.data(), pointers.size() * sizeof(int64_t), idx_path_);
    write_or_throw(idx, document_indices_.data(), document_indices_.size() * sizeof(int64_t), idx_path_);
  } catch (...) {
    std::fclose(idx);
    throw;
  }
  flush_sync_close(idx, idx_path_);
}

}  // namespace megatune::executor::data
