// Run ids of checkpoint directories and the checks of --load and --save paths.
#include "executor/checkpoint/run_lineage.h"

#include <filesystem>
#include <random>

#include "executor/checkpoint/checkpoint_format.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/durable_file.h"
#include "layouts/input_file.h"
#include "layouts/user_error.h"

namespace megatune::executor::checkpoint {

namespace fs = std::filesystem;

namespace {

bool is_iteration_entry(const std::string& name) {
  if (name.rfind("iter_", 0) != 0 || name.size() <= 5) return false;
  std::string number = name.substr(5);
  const std::string staging = ".staging";
  if (number.size() > staging.size() &&
      number.compare(number.size() - staging.size(), staging.size(), staging) == 0)
    number.resize(number.size() - staging.size());
  for (const char c : number)
    if (c < '0' || c > '9') return false;
  return !number.empty();
}

bool same_directory(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code error;
  return fs::equivalent(a, b, error);
}

std::string latest_text(const std::string& root) {
  try {
    const auto latest = read_latest_iteration(root);
    return latest ? " (latest iteration " + std::to_string(*latest) + ")" : " (no tracker file)";
  } catch (const UserError&) {
    return "";
  }
}

}  // namespace

bool holds_checkpoints(const std::string& root) {
  std::error_code error;
  if (fs::exists(tracker_file_path(root), error)) return true;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    if (is_iteration_entry(entry.path().filename().string())) return true;
  }
  return false;
}

LoadState inspect_load_directory(const std::string& load_root) {
  if (load_root.empty()) throw UserError("--load is empty; give the checkpoint directory to resume from");
  std::error_code error;
  const fs::file_status status = fs::status(load_root, error);
  if (!fs::exists(status)) {
    throw UserError("--load " + load_root +
                    " does not exist; check the path (drop --load to start a new run)");
  }
  if (!fs::is_directory(status)) {
    throw UserError("--load " + load_root + " is not a directory; give the directory --save wrote into");
  }
  if (fs::exists(tracker_file_path(load_root), error)) return LoadState::kCheckpoint;
  if (holds_checkpoints(load_root)) {
    const auto iterations = list_checkpoint_iterations(load_root);
    const std::string newest = iterations.empty() ? "N" : std::to_string(iterations.back());
    throw UserError("--load " + load_root + " holds iteration directories but no " + kTrackerFileName +
                    "; write the iteration to resume into it (e.g. echo " + newest + " > " +
                    tracker_file_path(load_root) + ")");
  }
  return LoadState::kNoCheckpoint;
}

std::string new_run_id() {
  std::random_device device;
  std::mt19937_64 generator((static_cast<std::uint64_t>(device()) << 32) ^ device());
  static const char* kHex = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 32; ++i) id += kHex[generator() & 15];
  return id;
}

std::string run_id_for(const CheckpointReader* loaded) {
  if (loaded != nullptr && loaded->has_metadata(kRunIdMetadataKey)) {
    const std::string& id = loaded->metadata_value(kRunIdMetadataKey);
    if (!id.empty()) return id;
  }
  return new_run_id();
}

std::string save_directory_owner(const std::string& save_root) {
  const std::string path = (fs::path(save_root) / kRunIdFileName).string();
  if (non_regular_file_reason(path) == "does not exist") return "";
  std::string text = read_regular_file(path, "checkpoint run id file", 4096);
  text.erase(text.find_last_not_of(" \t\r\n") + 1);
  return text;
}

void claim_save_directory(const std::string& save_root, const std::string& run_id,
                          const std::string& resumed_from, bool overwrite) {
  if (save_root.empty()) return;
  if (run_id.empty()) throw std::invalid_argument("claim_save_directory: empty run id");
  std::error_code error;
  const fs::file_status status = fs::status(save_root, error);
  if (fs::exists(status) && !fs::is_directory(status)) {
    throw UserError("--save " + save_root + " is not a directory; give a directory for checkpoints");
  }
  if (fs::exists(status) && holds_checkpoints(save_root)) {
    const std::string owner = save_directory_owner(save_root);
    const bool ours = owner == run_id || same_directory(save_root, resumed_from);
    if (!ours && !overwrite) {
      throw UserError("--save " + save_root + " holds checkpoints of another run" + latest_text(save_root) +
                      "; resume that run with --load " + save_root +
                      ", choose another --save directory, or "
                      "pass " +
                      kOverwriteFlag + " to replace them");
    }
  }
  fs::create_directories(save_root, error);
  if (error) {
    throw UserError("--save " + save_root + ": cannot create the directory (" + error.message() +
                    "); choose a writable path");
  }
  if (save_directory_owner(save_root) != run_id)
    replace_file_atomically((fs::path(save_root) / kRunIdFileName).string(), run_id + "\n");
}

void require_save_owner(const std::string& save_root, const std::string& run_id) {
  const std::string owner = save_directory_owner(save_root);
  if (owner.empty()) {
    // Not claimed (a writer outside a training run, or the file was removed): claim it now, which refuses a
    // directory that holds another run's checkpoints.
    claim_save_directory(save_root, run_id, "", false);
    return;
  }
  if (owner != run_id) {
    throw UserError("--save " + save_root + " was claimed by another run (run id " + owner +
                    ") while this one trained; nothing was saved over it: give this run another --save "
                    "directory");
  }
}

}  // namespace megatune::executor::checkpoint
