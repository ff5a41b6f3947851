// Which training run a checkpoint directory belongs to, so that a save never replaces another run's
// checkpoints, and what a --load path holds, so that a typo is refused instead of silently starting over.
//
// Every run has a run id: the one recorded in the checkpoint it resumed from (metadata "run_id"), else a
// new random one. A --save directory records the id of the run that saves into it in megatune_run_id.txt.
// A run may save into a directory that holds no checkpoint, that its own id owns, or that it resumed from;
// any other directory holding checkpoints (another run's, or ones whose tracker was deleted) is refused
// unless the user passes the explicit overwrite flag. While a run trains, it holds an exclusive lock on the
// directory's megatune_save.lock, so that of two runs started with the same --save exactly one saves there.
#pragma once
#include <string>

namespace megatune::executor::checkpoint {

inline constexpr const char* kRunIdFileName = "megatune_run_id.txt";
inline constexpr const char* kSaveLockFileName = "megatune_save.lock";
inline constexpr const char* kRunIdMetadataKey = "run_id";
// The flag a user passes to save over another run's checkpoints anyway (named in messages).
inline constexpr const char* kOverwriteFlag = "--overwrite-checkpoints";

enum class LoadState {
  kNoCheckpoint,  // an existing directory without checkpoints: the run starts fresh (say so)
  kCheckpoint,    // a tracker file naming a saved iteration
};

// What --load `load_root` holds. Throws UserError (naming --load and the fix) when it does not exist, is
// not a directory, or holds iteration directories but no tracker file (a deleted tracker would silently
// restart from iteration 0).
LoadState inspect_load_directory(const std::string& load_root);

// True when `root` holds a tracker file, an iteration directory or a staging directory.
bool holds_checkpoints(const std::string& root);

// A new random run id (32 hex digits).
std::string new_run_id();

class CheckpointReader;
// The id a run continues under: the loaded checkpoint's "run_id" metadata when it has one, else a new id.
std::string run_id_for(const CheckpointReader* loaded);

// The run id that owns `save_root` ("" when none is recorded).
std::string save_directory_owner(const std::string& save_root);

// A run's hold on its --save directory: an exclusive flock on megatune_save.lock, released when the claim
// is destroyed or the process ends (a crashed run leaves no stale hold). Movable, not copyable.
class SaveDirectoryClaim {
 public:
  SaveDirectoryClaim() = default;  // holds nothing
  explicit SaveDirectoryClaim(int lock_fd) : lock_fd_(lock_fd) {}
  SaveDirectoryClaim(SaveDirectoryClaim&& other) noexcept;
  SaveDirectoryClaim& operator=(SaveDirectoryClaim&& other) noexcept;
  ~SaveDirectoryClaim();
  bool held() const { return lock_fd_ >= 0; }

 private:
  int lock_fd_ = -1;
};

// Claims `save_root` for the run `run_id` before training starts: locks it (held by the returned claim;
// keep it while the run saves), then records run_id in it. resumed_from: the --load directory whose
// checkpoint this run loaded ("" when it starts fresh). Throws UserError when another run holds the lock
// now, when save_root holds checkpoints of another run and `overwrite` is false, or is not a directory.
// On a file system without flock the lock is skipped; the run id file is still created atomically.
SaveDirectoryClaim claim_save_directory(const std::string& save_root, const std::string& run_id,
                                        const std::string& resumed_from, bool overwrite);

// At each save: throws UserError when save_root now belongs to another run (a second run claimed it).
void require_save_owner(const std::string& save_root, const std::string& run_id);

}  // namespace megatune::executor::checkpoint
