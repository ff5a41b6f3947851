// IndexedDataset: memory-mapped reader of Megatron's .idx/.bin pair with full validation on open.
#include "executor/data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "base/user_error.h"

namespace megatune::executor::data {

static_assert(std::endian::native == std::endian::little, "the indexed dataset format is little-endian");

namespace {

template <typename T>
T load(const std::byte* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw UserError("indexed dataset " + file + ": " + what +
                  "; re-run `megatune data preprocess` (or Megatron's preprocess_data.py) to rebuild it");
}

}  // namespace

std::string index_file_path(const std::string& path_prefix) { return path_prefix + ".idx"; }
std::string data_file_path(const std::string& path_prefix) { return path_prefix + ".bin"; }

IndexedDataset::Mapping IndexedDataset::map_file(const std::string& path) {
  // O_NONBLOCK and a regular-file check on the descriptor: a FIFO named like a dataset fails, never hangs.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (error == ENOENT) {
      throw UserError("indexed dataset file " + path +
                      " does not exist; pass --data-path the prefix without .bin/.idx, or create it with "
                      "`megatune data preprocess`");
    }
    throw UserError("cannot open indexed dataset file " + path + ": " + std::strerror(error) +
                    "; check its permissions");
  }
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw UserError("indexed dataset file " + path + " " +
                    (S_ISDIR(info.st_mode)    ? "is a directory"
                     : S_ISFIFO(info.st_mode) ? "is a FIFO"
                                              : "is a device") +
                    ", not a regular file; pass --data-path the prefix of a .bin/.idx pair");
  }
  Mapping mapping;
  mapping.size_bytes = static_cast<size_t>(info.st_size);
  if (mapping.size_bytes > 0) {
    void* address = ::mmap(nullptr, mapping.size_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (address == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      throw UserError("cannot memory-map indexed dataset file " + path + ": " + std::strerror(error));
    }
    mapping.data = static_cast<const std::byte*>(address);
  }
  ::close(fd);
  return mapping;
}

void IndexedDataset::unmap(Mapping& mapping) {
  if (mapping.data != nullptr) ::munmap(const_cast<std::byte*>(mapping.data), mapping.size_bytes);
  mapping = Mapping{};
}

IndexedDataset::IndexedDataset(std::string path_prefix) : path_prefix_(std::move(path_prefix)) {
  index_ = map_file(index_file_path(path_prefix_));
  try {
    data_ = map_file(data_file_path(path_prefix_));
    validate_and_load();
  } catch (...) {
    unmap(index_);
    unmap(data_);
    throw;
  }
}

IndexedDataset::~IndexedDataset() {
  unmap(index_);
  unmap(data_);
}

void IndexedDataset::validate_and_load() {
  const std::string idx_path = index_file_path(path_prefix_);
  const std::string bin_path = data_file_path(path_prefix_);
  const int64_t idx_size = static_cast<int64_t>(index_.size_bytes);
  if (idx_size < kIndexHeaderBytes) {
    fail(idx_path, "truncated: " + std::to_string(idx_size) + " bytes, shorter than the 34-byte header");
  }
  const std::byte* idx = index_.data;
  if (std::memcmp(idx, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    fail(idx_path, "wrong magic (not a Megatron MMIDIDX index file)");
  }
  const uint64_t version = load<uint64_t>(idx + 9);
  if (version != kIndexVersion) {
    fail(idx_path, "unsupported version " + std::to_string(version) + " (megatune reads version 1)");
  }
  const uint8_t code = load<uint8_t>(idx + 17);
  const auto dtype = index_dtype_from_code(code);
  if (!dtype) fail(idx_path, "unknown dtype code " + std::to_string(code) + " (valid codes are 1..8)");
  dtype_ = *dtype;
  const uint64_t sequence_count = load<uint64_t>(idx + 18);
  const uint64_t document_count = load<uint64_t>(idx + 26);
  constexpr uint64_t kMaxCount = uint64_t{1} << 56;
  if (sequence_count > kMaxCount || document_count > kMaxCount) {
    fail(idx_path, "implausible counts in the header (" + std::to_string(sequence_count) + " sequences, " +
                       std::to_string(document_count) + " document entries)");
  }
  if (document_count < 1) fail(idx_path, "document count is 0 (it must be at least 1: the leading 0 entry)");
  const int64_t n = static_cast<int64_t>(sequence_count);
  const int64_t d = static_cast<int64_t>(document_count);
  const int64_t expected = kIndexHeaderBytes + 12 * n + 8 * d;
  if (idx_size == expected) {
    has_sequence_modes_ = false;
  } else if (idx_size == expected + n && n > 0) {
    has_sequence_modes_ = true;
  } else {
    fail(idx_path, "is " + std::to_string(idx_size) + " bytes but its header (" + std::to_string(n) +
                       " sequences, " + std::to_string(d) + " document entries) needs " +
                       std::to_string(expected) + (idx_size < expected ? " (truncated)" : " (extra bytes)"));
  }
  document_count_ = d;

  const int64_t item_bytes = index_dtype_size_bytes(dtype_);
  const int64_t bin_size = static_cast<int64_t>(data_.size_bytes);
  sequence_lengths_.resize(static_cast<size_t>(n));
  if (n > 0) std::memcpy(sequence_lengths_.data(), idx + kIndexHeaderBytes, static_cast<size_t>(4 * n));
  int64_t running_bytes = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t length = sequence_lengths_[static_cast<size_t>(i)];
    if (length < 0)
      fail(idx_path, "sequence " + std::to_string(i) + " has negative length " + std::to_string(length));
    const int64_t pointer = sequence_pointer_bytes(i);
    if (pointer < 0 || pointer > bin_size || length * item_bytes > bin_size - pointer) {
      // The end is printed as an unsigned sum: a corrupt pointer near INT64_MAX must not overflow here.
      const uint64_t end = static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length * item_bytes);
      fail(idx_path, "sequence " + std::to_string(i) + " points to bytes [" + std::to_string(pointer) + ", " +
                         std::to_string(end) + ") outside " + bin_path + " (" + std::to_string(bin_size) +
                         " bytes): the .bin is truncated or belongs to another index");
    }
    if (pointer != running_bytes) {
      fail(idx_path, "sequence " + std::to_string(i) + " pointer is " + std::to_string(pointer) +
                         " but the sequences before it end at byte " + std::to_string(running_bytes) +
                         " (pointers must be cumulative)");
    }
    running_bytes += length * item_bytes;
  }
  if (running_bytes != bin_size) {
    fail(bin_path, "is " + std::to_string(bin_size) + " bytes but its index " + idx_path + " describes " +
                       std::to_string(running_bytes) + " bytes" +
                       (bin_size < running_bytes ? " (truncated)" : " (the files come from different runs)"));
  }
  num_tokens_ = running_bytes / item_bytes;
  int64_t previous = 0;
  for (int64_t i = 0; i < d; ++i) {
    const int64_t entry = document_index(i);
    if (i == 0 && entry != 0) fail(idx_path, "document index 0 is " + std::to_string(entry) + " (must be 0)");
    if (entry < previous || entry > n) {
      fail(idx_path, "document index " + std::to_string(i) + " is " + std::to_string(entry) +
                         " (must be non-decreasing and at most the " + std::to_string(n) + " sequences)");
    }
    previous = entry;
  }
  if (d > 1 && previous != n) {
    fail(idx_path, "the last document ends at sequence " + std::to_string(previous) + " but there are " +
                       std::to_string(n) + " sequences");
  }
}

int64_t IndexedDataset::sequence_pointer_bytes(int64_t sequence) const {
  return load<int64_t>(index_.data + kIndexHeaderBytes + 4 * num_sequences() + 8 * sequence);
}

int64_t IndexedDataset::document_index(int64_t i) const {
  return load<int64_t>(index_.data + kIndexHeaderBytes + 12 * num_sequences() + 8 * i);
}

int8_t IndexedDataset::sequence_mode(int64_t sequence) const {
  if (!has_sequence_modes_) throw UserError("indexed dataset " + path_prefix_ + " has no sequence modes");
  return load<int8_t>(index_.data + kIndexHeaderBytes + 12 * num_sequences() + 8 * document_count_ +
                      sequence);
}

void IndexedDataset::read_tokens(int64_t sequence, int64_t offset, int64_t length, int32_t* out) const {
  if (sequence < 0 || sequence >= num_sequences()) {
    throw UserError("indexed dataset " + path_prefix_ + ": sequence " + std::to_string(sequence) +
                    " requested but it holds " + std::to_string(num_sequences()));
  }
  const int64_t sequence_length = sequence_lengths_[static_cast<size_t>(sequence)];
  if (offset < 0 || length < 0 || offset + length > sequence_length) {
    throw UserError("indexed dataset " + path_prefix_ + ": tokens [" + std::to_string(offset) + ", " +
                    std::to_string(offset + length) + ") requested from sequence " +
                    std::to_string(sequence) + " of length " + std::to_string(sequence_length));
  }
  const int64_t item_bytes = index_dtype_size_bytes(dtype_);
  const std::byte* at = data_.data + sequence_pointer_bytes(sequence) + offset * item_bytes;
  const auto too_large = [&](double value) {
    throw UserError("indexed dataset " + path_prefix_ + ": token " + std::to_string(value) + " in sequence " +
                    std::to_string(sequence) +
                    " does not fit int32; rebuild the dataset with a smaller vocabulary");
  };
  const auto float_token = [&](double value) -> int32_t {
    if (!(value >= std::numeric_limits<int32_t>::min() && value <= std::numeric_limits<int32_t>::max())) {
      too_large(value);
    }
    return static_cast<int32_t>(value);
  };
  switch (dtype_) {
    case IndexDType::uint8:
      for (int64_t i = 0; i < length; ++i) out[i] = load<uint8_t>(at + i);
      break;
    case IndexDType::int8:
      for (int64_t i = 0; i < length; ++i) out[i] = load<int8_t>(at + i);
      break;
    case IndexDType::int16:
      for (int64_t i = 0; i < length; ++i) out[i] = load<int16_t>(at + 2 * i);
      break;
    case IndexDType::uint16:
      for (int64_t i = 0; i < length; ++i) out[i] = load<uint16_t>(at + 2 * i);
      break;
    case IndexDType::int32:
      if (length > 0) std::memcpy(out, at, static_cast<size_t>(4 * length));
      break;
    case IndexDType::int64:
      for (int64_t i = 0; i < length; ++i) {
        const int64_t value = load<int64_t>(at + 8 * i);
        if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
          too_large(static_cast<double>(value));
        }
        out[i] = static_cast<int32_t>(value);
      }
      break;
    case IndexDType::float32:
      for (int64_t i = 0; i < length; ++i) out[i] = float_token(load<float>(at + 4 * i));
      break;
    case IndexDType::float64:
      for (int64_t i = 0; i < length; ++i) out[i] = float_token(load<double>(at + 8 * i));
      break;
  }
}

std::vector<int32_t> IndexedDataset::sequence(int64_t sequence) const {
  if (sequence < 0 || sequence >= num_sequences()) {
    throw UserError("indexed dataset " + path_prefix_ + ": sequence " + std::to_string(sequence) +
                    " requested but it holds " + std::to_string(num_sequences()));
  }
  std::vector<int32_t> tokens(static_cast<size_t>(sequence_lengths_[static_cast<size_t>(sequence)]));
  read_tokens(sequence, 0, static_cast<int64_t>(tokens.size()), tokens.data());
  return tokens;
}

std::string IndexedDataset::description() const { return "indexed dataset " + path_prefix_; }

}  // namespace megatune::executor::data
