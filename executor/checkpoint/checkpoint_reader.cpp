// CheckpointReader: manifest parsing with its own checksum, tensor reads checked by shape, dtype and CRC-32C.
#include "executor/checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/checkpoint/crc32c.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

namespace {

// The fix for a damaged iteration: megatune loads the iteration the tracker names.
const std::string kEarlierIteration =
    std::string("load an earlier iteration by writing its number into ") + kTrackerFileName;

std::string shape_text(TensorDType dtype, const std::vector<int64_t>& shape) {
  std::string text = tensor_dtype_name(dtype) + " [";
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d > 0) text.push_back(',');
    text += std::to_string(shape[d]);
  }
  return text + "]";
}

bool parse_int64(const std::string& text, int64_t& value) {
  if (text.empty() || text.size() > 19) return false;
  for (const char c : text) {
    if (c < '0' || c > '9') return false;
  }
  value = std::stoll(text);
  return true;
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t elements = 1;
  for (const int64_t dimension : shape) elements *= dimension;
  return elements;
}

CheckpointReader CheckpointReader::open_latest(const std::string& save_root, const std::string& shard_name) {
  std::error_code error;
  if (!fs::is_directory(save_root, error)) {
    throw UserError("checkpoint directory " + save_root + " does not exist; check --load");
  }
  const auto iteration = read_latest_iteration(save_root);
  if (!iteration) {
    throw UserError("no checkpoint in " + save_root + " (" + kTrackerFileName +
                    " is missing); check --load, or drop it to start from scratch");
  }
  return open(save_root, *iteration, shard_name);
}

CheckpointReader CheckpointReader::open(const std::string& save_root, int64_t iteration,
                                        const std::string& shard_name) {
  CheckpointReader reader = open_directory(iteration_directory(save_root, iteration), shard_name);
  if (reader.iteration_ != iteration) {
    throw UserError("checkpoint " + reader.shard_directory_ + " records iteration " +
                    std::to_string(reader.iteration_) + " but lies in the directory of iteration " +
                    std::to_string(iteration) + "; it was moved by hand: restore its name");
  }
  return reader;
}

CheckpointReader CheckpointReader::open_directory(const std::string& iteration_directory,
                                                  const std::string& shard_name) {
  std::error_code error;
  if (!fs::is_directory(iteration_directory, error)) {
    throw UserError("checkpoint " + iteration_directory +
                    " does not exist; the tracker names a deleted iteration: write a saved iteration into " +
                    kTrackerFileName +
                    " (a saved iteration) or point --load at another checkpoint directory");
  }
  CheckpointReader reader;
  reader.shard_directory_ = (fs::path(iteration_directory) / shard_name).string();
  if (!fs::is_directory(reader.shard_directory_, error)) {
    throw UserError("checkpoint " + iteration_directory + " has no shard " + shard_name +
                    "; it was saved by a different parallel layout or is incomplete");
  }
  reader.load_manifest();
  return reader;
}

void CheckpointReader::load_manifest() {
  const std::string path = (fs::path(shard_directory_) / kManifestFileName).string();
  const auto corrupt = [&](const std::string& what) {
    return UserError("checkpoint manifest " + path + " " + what +
                     "; the checkpoint is damaged: " + kEarlierIteration + " or re-save it");
  };
  if (non_regular_file_reason(path) == "does not exist") throw corrupt("is missing");
  const std::string text = read_regular_file(path, "checkpoint manifest", std::size_t{256} << 20);
  size_t body_size = 0;
  const std::string problem = check_end_checksum(text, &body_size, &manifest_checksum_);
  if (!problem.empty()) throw corrupt(problem);

  std::istringstream lines(text.substr(0, body_size));
  std::string line;
  bool header = false, have_iteration = false, have_size = false;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (!header) {
      int version = 0;
      if (kind != "megatune-checkpoint" || !(fields >> version))
        throw corrupt("is not a megatune checkpoint manifest");
      if (version != kCheckpointFormatVersion) {
        throw UserError("checkpoint " + path + " has format version " + std::to_string(version) +
                        "; this megatune reads " + std::to_string(kCheckpointFormatVersion) +
                        ": use the megatune that wrote it");
      }
      header = true;
    } else if (kind == "iteration") {
      std::string value;
      fields >> value;
      if (!parse_int64(value, iteration_)) throw corrupt("has a bad iteration line");
      have_iteration = true;
    } else if (kind == "tensors_bin_bytes") {
      std::string value;
      fields >> value;
      if (!parse_int64(value, tensors_bin_bytes_)) throw corrupt("has a bad tensors_bin_bytes line");
      have_size = true;
    } else if (kind == "meta") {
      std::string key, value;
      fields >> key >> value;
      try {
        metadata_[key] = percent_decode(value);
      } catch (const std::invalid_argument&) {
        throw corrupt("has a badly encoded value for " + key);
      }
    } else if (kind == "tensor") {
      TensorInfo info;
      std::string dtype, shape, offset, size, crc;
      fields >> info.name >> dtype >> shape >> offset >> size >> crc;
      const auto parsed_dtype = tensor_dtype_from_name(dtype);
      if (!parsed_dtype) throw corrupt("names unknown dtype '" + dtype + "' for tensor " + info.name);
      info.dtype = *parsed_dtype;
      if (shape != "scalar") {
        std::istringstream dims(shape);
        std::string dim;
        while (std::getline(dims, dim, ',')) {
          int64_t value = 0;
          if (!parse_int64(dim, value)) throw corrupt("has a bad shape for tensor " + info.name);
          info.shape.push_back(value);
        }
      }
      if (!parse_int64(offset, info.offset_bytes) || !parse_int64(size, info.size_bytes) || crc.size() != 8) {
        throw corrupt("has a bad line for tensor " + info.name);
      }
      info.crc32c = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
      if (info.size_bytes != info.num_elements() * tensor_dtype_size_bytes(info.dtype)) {
        throw corrupt("gives tensor " + info.name + " a size that does not match its shape");
      }
      tensors_.push_back(std::move(info));
    } else {
      throw corrupt("has an unknown line '" + kind + "'");
    }
  }
  if (!header || !have_iteration || !have_size) throw corrupt("lacks its header lines");
  const std::string bin = (fs::path(shard_directory_) / kTensorsFileName).string();
  std::error_code error;
  const auto actual = fs::file_size(bin, error);
  if (error || !fs::is_regular_file(bin, error)) {
    throw UserError("checkpoint tensor file " + bin + " is missing; " + kEarlierIteration);
  }
  if (static_cast<int64_t>(actual) != tensors_bin_bytes_) {
    throw UserError("checkpoint tensor file " + bin + " is " + std::to_string(actual) +
                    " bytes but its manifest says " + std::to_string(tensors_bin_bytes_) +
                    (static_cast<int64_t>(actual) < tensors_bin_bytes_ ? " (truncated)" : "") +
                    "; the checkpoint is damaged: " + kEarlierIteration);
  }
  for (const auto& tensor : tensors_) {
    if (tensor.offset_bytes + tensor.size_bytes > tensors_bin_bytes_)
      throw corrupt("places tensor " + tensor.name + " past the end of tensors.bin");
  }
}

const TensorInfo* CheckpointReader::find_tensor(const std::string& name) const {
  for (const auto& tensor : tensors_) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

void CheckpointReader::read_tensor(const std::string& name, TensorDType expected_dtype,
                                   const std::vector<int64_t>& expected_shape, void* out) const {
  const TensorInfo* tensor = find_tensor(name);
  if (tensor == nullptr) {
    throw UserError("checkpoint " + shard_directory_ + " has no tensor " + name +
                    "; it was saved for a different model: load with the model flags it was saved with");
  }
  if (tensor->dtype != expected_dtype || tensor->shape != expected_shape) {
    throw UserError("checkpoint " + shard_directory_ + " holds " + name + " as " +
                    shape_text(tensor->dtype, tensor->shape) + " but the model expects " +
                    shape_text(expected_dtype, expected_shape) +
                    "; load with the model flags it was saved with");
  }
  const std::string bin = (fs::path(shard_directory_) / kTensorsFileName).string();
  const int fd = open_regular_file(bin, "checkpoint tensor file");
  auto* bytes = static_cast<char*>(out);
  int64_t done = 0;
  while (done < tensor->size_bytes) {
    const ssize_t got = ::pread(fd, bytes + done, static_cast<size_t>(tensor->size_bytes - done),
                                static_cast<off_t>(tensor->offset_bytes + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int error = got < 0 ? errno : EIO;
      ::close(fd);
      throw UserError("cannot read tensor " + name + " from " + bin + ": " + std::strerror(error) +
                      "; the checkpoint is damaged: " + kEarlierIteration);
    }
    done += got;
  }
  ::close(fd);
  const uint32_t crc = crc32c_update(0, out, static_cast<size_t>(tensor->size_bytes));
  if (crc != tensor->crc32c) {
    char text[64];
    std::snprintf(text, sizeof(text), " (stored %08x, read %08x)", tensor->crc32c, crc);
    throw UserError("tensor " + name + " in " + bin + " fails its CRC-32C check" + text +
                    "; the checkpoint is corrupt: " + kEarlierIteration);
  }
}

void CheckpointReader::verify_all() const {
  std::vector<char> buffer;
  for (const auto& tensor : tensors_) {
    buffer.resize(static_cast<size_t>(tensor.size_bytes));
    read_tensor(tensor.name, tensor.dtype, tensor.shape, buffer.data());
  }
}

const std::string& CheckpointReader::metadata_value(const std::string& key) const {
  const auto found = metadata_.find(key);
  if (found == metadata_.end()) {
    throw UserError("checkpoint " + shard_directory_ + " has no metadata '" + key +
                    "'; it was written by an older megatune or another tool");
  }
  return found->second;
}

int64_t CheckpointReader::metadata_int(const std::string& key) const {
  const std::string& text = metadata_value(key);
  const bool negative = !text.empty() && text[0] == '-';
  int64_t value = 0;
  if (!parse_int64(negative ? text.substr(1) : text, value)) {
    throw UserError("checkpoint " + shard_directory_ + " metadata '" + key + "' is '" + text +
                    "', not an integer");
  }
  return negative ? -value : value;
}

std::vector<uint8_t> CheckpointReader::metadata_bytes(const std::string& key) const {
  const std::string& text = metadata_value(key);
  return std::vector<uint8_t>(text.begin(), text.end());
}

void CheckpointReader::require_metadata_equal(const std::string& key, const std::string& expected) const {
  const auto found = metadata_.find(key);
  const std::string saved = found == metadata_.end() ? "(absent)" : found->second;
  if (found == metadata_.end() || found->second != expected) {
    throw UserError("checkpoint " + shard_directory_ + " was saved with " + key + "=" + saved +
                    " but this run has " + key + "=" + expected +
                    "; pass the same setting or use another --load");
  }
}

}  // namespace megatune::executor::checkpoint
