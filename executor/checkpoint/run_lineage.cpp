// Run ids of checkpoint directories and the checks of --load and --save paths.
#include "executor/checkpoint/run_lineage.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include "base/input_file.h"
#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_format.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/durable_file.h"

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

// "process 1234 on host-a": who holds a lock, from what the holder wrote into the lock file.
std::string lock_holder_text(int fd) {
  char text[256] = {};
  const ssize_t got = ::pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = got > 0 ? std::string(text, static_cast<size_t>(got)) : "";
  holder.erase(holder.find_last_not_of(" \t\r\n") + 1);
  return holder.empty() ? "" : " (" + holder + ")";
}

// Takes the exclusive lock on save_root's lock file without waiting; UserError when another run holds it.
SaveDirectoryClaim lock_save_directory(const std::string& save_root) {
  const std::string path = (fs::path(save_root) / kSaveLockFileName).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw UserError("--save " + save_root + ": cannot open " + path + " (" + std::strerror(errno) +
                    "); choose a writable directory");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      const std::string holder = lock_holder_text(fd);
      ::close(fd);
      throw UserError("--save " + save_root + " is in use by another run that is training now" + holder +
                      "; wait for it to end or give this run another --save directory");
    }
    ::close(fd);
    if (error == ENOLCK || error == EOPNOTSUPP || error == ENOSYS || error == EINVAL)
      return SaveDirectoryClaim();  // no flock here: the run id file's atomic creation still decides
    throw UserError("--save " + save_root + ": cannot lock " + path + " (" + std::strerror(error) +
                    "); choose another --save directory");
  }
  char host[128] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string holder = "process " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, holder.data(), holder.size(), 0);
  return SaveDirectoryClaim(fd);
}

// Records run_id as save_root's owner. A directory nobody owns gets the file created atomically, so of
// two runs racing for it without a lock one wins; the loser is refused.
void record_owner(const std::string& save_root, const std::string& run_id) {
  const std::string path = (fs::path(save_root) / kRunIdFileName).string();
  const std::string owner = save_directory_owner(save_root);
  if (owner == run_id) return;
  if (!owner.empty()) {
    replace_file_atomically(path, run_id + "\n");  // ours to replace: checked by the caller
    return;
  }
  if (create_file_exclusively(path, run_id + "\n")) return;
  const std::string winner = save_directory_owner(save_root);
  if (winner != run_id) {
    throw UserError("--save " + save_root + " was claimed by another run (run id " + winner +
                    ") as this one started; give this run another --save directory");
  }
}

}  // namespace

SaveDirectoryClaim::SaveDirectoryClaim(SaveDirectoryClaim&& other) noexcept
    : lock_fd_(std::exchange(other.lock_fd_, -1)) {}

SaveDirectoryClaim& SaveDirectoryClaim::operator=(SaveDirectoryClaim&& other) noexcept {
  if (this != &other) {
    if (lock_fd_ >= 0) ::close(lock_fd_);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
  }
  return *this;
}

SaveDirectoryClaim::~SaveDirectoryClaim() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing the descriptor releases the flock
}

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

SaveDirectoryClaim claim_save_directory(const std::string& save_root, const std::string& run_id,
                                        const std::string& resumed_from, bool overwrite) {
  if (save_root.empty()) return SaveDirectoryClaim();
  if (run_id.empty()) throw std::invalid_argument("claim_save_directory: empty run id");
  std::error_code error;
  const fs::file_status status = fs::status(save_root, error);
  if (fs::exists(status) && !fs::is_directory(status)) {
    throw UserError("--save " + save_root + " is not a directory; give a directory for checkpoints");
  }
  fs::create_directories(save_root, error);
  if (error) {
    throw UserError("--save " + save_root + ": cannot create the directory (" + error.message() +
                    "); choose a writable path");
  }
  SaveDirectoryClaim claim = lock_save_directory(save_root);
  if (holds_checkpoints(save_root)) {
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
  record_owner(save_root, run_id);
  return claim;
}

void require_save_owner(const std::string& save_root, const std::string& run_id) {
  const std::string owner = save_directory_owner(save_root);
  if (owner.empty()) {
    // Not claimed (a writer outside a training run, or the file was removed): claim it now, which refuses a
    // directory that holds another run's checkpoints or that another run holds.
    (void)claim_save_directory(save_root, run_id, "", false);
    return;
  }
  if (owner != run_id) {
    throw UserError("--save " + save_root + " was claimed by another run (run id " + owner +
                    ") while this one trained; nothing was saved over it: give this run another --save "
                    "directory");
  }
}

}  // namespace megatune::executor::checkpoint
