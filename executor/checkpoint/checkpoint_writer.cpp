// CheckpointWriter: staging directory -> fsync -> rename into place -> tracker file, in that order.
#include "executor/checkpoint/checkpoint_writer.h"

#include <filesystem>
#include <sstream>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/crc32c.h"
#include "executor/checkpoint/run_lineage.h"
#include "executor/checkpoint/shard_index.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

namespace {

bool is_token(const std::string& text) {
  if (text.empty()) return false;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7F || c == '%') return false;
  }
  return true;
}

void create_directories_or_throw(const std::string& path) {
  std::error_code error;
  fs::create_directories(path, error);
  if (error) {
    throw UserError("checkpoint: cannot create directory " + path + ": " + error.message() +
                    "; check --save and its permissions");
  }
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string save_root, int64_t iteration, CheckpointWriteOptions options)
    : save_root_(std::move(save_root)), iteration_(iteration), options_(std::move(options)) {
  if (save_root_.empty()) throw UserError("--save is empty; give a directory for checkpoints");
  if (iteration_ < 0)
    throw UserError("checkpoint iteration must be non-negative, got " + std::to_string(iteration_));
  if (!is_token(options_.shard_name) || options_.shard_name.find('/') != std::string::npos) {
    throw UserError("checkpoint shard name '" + options_.shard_name + "' must be a plain file name");
  }
  if (!options_.run_id.empty()) {
    require_save_owner(save_root_, options_.run_id);
    metadata_[kRunIdMetadataKey] = options_.run_id;
  }
  create_directories_or_throw(save_root_);
  const std::string shard = shard_directory();
  std::error_code error;
  fs::remove_all(shard, error);  // a stale shard of a save that crashed
  create_directories_or_throw(shard);
  tensors_file_ = std::make_unique<DurableFile>((fs::path(shard) / kTensorsFileName).string());
}

CheckpointWriter::~CheckpointWriter() {
  if (shard_committed_) return;
  tensors_file_.reset();
  std::error_code error;
  fs::remove_all(shard_directory(), error);
}

std::string CheckpointWriter::shard_directory() const {
  return (fs::path(staging_directory(save_root_, iteration_)) / options_.shard_name).string();
}

void CheckpointWriter::add_tensor(const std::string& name, TensorDType dtype, std::vector<int64_t> shape,
                                  const void* data) {
  if (shard_committed_) throw std::logic_error("CheckpointWriter::add_tensor after commit");
  if (!is_token(name)) {
    throw UserError("checkpoint tensor name '" + name + "' must be non-empty without whitespace or '%'");
  }
  for (const auto& tensor : tensors_) {
    if (tensor.name == name) throw UserError("checkpoint tensor '" + name + "' was added twice");
  }
  int64_t elements = 1;
  for (const int64_t dimension : shape) {
    if (dimension < 0) throw UserError("checkpoint tensor '" + name + "' has a negative dimension");
    elements *= dimension;
  }
  const int64_t size_bytes = elements * tensor_dtype_size_bytes(dtype);
  if (size_bytes > 0 && data == nullptr)
    throw std::invalid_argument("checkpoint tensor '" + name + "' has no data");
  const int64_t offset = static_cast<int64_t>(tensors_file_->size_bytes());
  const int64_t aligned =
      (offset + kTensorAlignmentBytes - 1) / kTensorAlignmentBytes * kTensorAlignmentBytes;
  tensors_file_->write_zeros(static_cast<size_t>(aligned - offset));
  tensors_file_->write(data, static_cast<size_t>(size_bytes));
  tensors_.push_back(TensorEntry{name, dtype, std::move(shape), aligned, size_bytes,
                                 crc32c_update(0, data, static_cast<size_t>(size_bytes))});
}

void CheckpointWriter::add_metadata(const std::string& key, const std::string& value) {
  if (!is_token(key))
    throw UserError("checkpoint metadata key '" + key + "' must be non-empty without whitespace or '%'");
  metadata_[key] = value;
}

void CheckpointWriter::add_metadata_int(const std::string& key, int64_t value) {
  add_metadata(key, std::to_string(value));
}

void CheckpointWriter::add_metadata_bytes(const std::string& key, std::span<const uint8_t> value) {
  add_metadata(key, std::string(reinterpret_cast<const char*>(value.data()), value.size()));
}

void CheckpointWriter::commit_shard() {
  if (shard_committed_) throw std::logic_error("CheckpointWriter::commit_shard called twice");
  const std::string shard = shard_directory();
  const int64_t tensors_bytes = static_cast<int64_t>(tensors_file_->size_bytes());
  tensors_file_->close();
  std::ostringstream manifest;
  manifest << "megatune-checkpoint " << kCheckpointFormatVersion << "\n";
  manifest << "iteration " << iteration_ << "\n";
  manifest << "tensors_bin_bytes " << tensors_bytes << "\n";
  for (const auto& [key, value] : metadata_)
    manifest << "meta " << key << " " << percent_encode(value) << "\n";
  for (const auto& tensor : tensors_) {
    manifest << "tensor " << tensor.name << " " << tensor_dtype_name(tensor.dtype) << " ";
    if (tensor.shape.empty()) manifest << "scalar";
    for (size_t d = 0; d < tensor.shape.size(); ++d) manifest << (d ? "," : "") << tensor.shape[d];
    manifest << " " << tensor.offset_bytes << " " << tensor.size_bytes << " " << checksum_hex(tensor.crc32c)
             << "\n";
  }
  const std::string text = with_end_checksum(manifest.str());
  DurableFile file((fs::path(shard) / kManifestFileName).string());
  file.write(text.data(), text.size());
  file.close();
  fsync_directory(shard);
  fsync_directory(staging_directory(save_root_, iteration_));
  shard_committed_ = true;
}

void CheckpointWriter::commit() {
  commit_shard();
  finalize_iteration(save_root_, iteration_, {options_.shard_name}, options_.keep_last);
}

void CheckpointWriter::finalize_iteration(const std::string& save_root, int64_t iteration,
                                          const std::vector<std::string>& expected_shards,
                                          int64_t keep_last) {
  const std::string staging = staging_directory(save_root, iteration);
  for (const auto& shard : expected_shards) {
    std::error_code error;
    if (!fs::is_regular_file(fs::path(staging) / shard / kManifestFileName, error)) {
      throw UserError("checkpoint iteration " + std::to_string(iteration) + ": shard " + shard +
                      " is missing from " + staging +
                      "; every rank must commit its shard before the save is finalized");
    }
  }
  // The index binds each shard name to its manifest: a load refuses a shard replaced or swapped later.
  ShardIndex index;
  index.iteration = iteration;
  for (const auto& shard : expected_shards)
    index.shards.emplace_back(shard, CheckpointReader::open_directory(staging, shard).manifest_checksum());
  write_shard_index(staging, index);
  fsync_directory(staging);
  move_directory_into_place(staging, iteration_directory(save_root, iteration));
  replace_file_atomically(tracker_file_path(save_root), std::to_string(iteration) + "\n");
  if (keep_last > 0) {
    const auto iterations = list_checkpoint_iterations(save_root);
    const int64_t excess = static_cast<int64_t>(iterations.size()) - keep_last;
    for (int64_t i = 0; i < excess; ++i) {
      if (iterations[static_cast<size_t>(i)] == iteration) continue;
      std::error_code error;
      fs::remove_all(iteration_directory(save_root, iterations[static_cast<size_t>(i)]), error);
    }
    fsync_directory(save_root);
  }
}

}  // namespace megatune::executor::checkpoint
