// A save never replaces another run's checkpoints: run ids recorded in --save directories and manifests,
// the explicit overwrite, resuming, a deleted tracker; --load paths that do not exist or hold no checkpoint;
// FIFOs in place of checkpoint files fail instead of hanging; of runs claiming one --save directory at once,
// exactly one wins.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/checkpoint/run_lineage.h"

namespace megatune::executor::checkpoint {
namespace {

namespace fs = std::filesystem;

class LineageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "megatune-lineage-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    base_ = pattern;
    root_ = base_ + "/ckpt";
  }
  void TearDown() override { fs::remove_all(base_); }
  // One save of `iteration` by `run_id`, the way a training run does it.
  void save(const std::string& root, int64_t iteration, const std::string& run_id, float value = 1.0f) {
    CheckpointWriter writer(root, iteration, {.run_id = run_id});
    std::vector<float> weights(4, value);
    writer.add_tensor("w", TensorDType::fp32, {4}, weights.data());
    writer.commit();
  }
  static std::string error_of(const std::function<void()>& action) {
    try {
      action();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
  std::string base_, root_;
};

TEST_F(LineageTest, FreshDirectoryIsClaimedAndSavedInto) {
  const std::string run = new_run_id();
  EXPECT_EQ(run.size(), 32u);
  EXPECT_NE(run, new_run_id());
  claim_save_directory(root_, run, "", false);
  EXPECT_EQ(save_directory_owner(root_), run);
  save(root_, 10, run);
  save(root_, 20, run);
  const CheckpointReader reader = CheckpointReader::open_latest(root_);
  EXPECT_EQ(reader.iteration(), 20);
  EXPECT_EQ(run_id_for(&reader), run);  // a resumed run continues under the same id
}

TEST_F(LineageTest, AnotherRunsCheckpointsAreNeverReplaced) {
  const std::string first = new_run_id();
  claim_save_directory(root_, first, "", false);
  save(root_, 100, first, 1.0f);
  const std::string second = new_run_id();
  const std::string message = error_of([&] { claim_save_directory(root_, second, "", false); });
  EXPECT_NE(message.find("another run"), std::string::npos) << message;
  EXPECT_NE(message.find("latest iteration 100"), std::string::npos) << message;
  EXPECT_NE(message.find(kOverwriteFlag), std::string::npos) << message;
  // A writer of the second run is refused too, and the first run's checkpoint and tracker are untouched.
  EXPECT_NE(error_of([&] { save(root_, 10, second, 2.0f); }).find("another run"), std::string::npos);
  EXPECT_EQ(CheckpointReader::open_latest(root_).iteration(), 100);
  EXPECT_EQ(save_directory_owner(root_), first);
}

TEST_F(LineageTest, ExplicitOverwriteReplaces) {
  const std::string first = new_run_id();
  claim_save_directory(root_, first, "", false);
  save(root_, 100, first);
  const std::string second = new_run_id();
  claim_save_directory(root_, second, "", true);
  save(root_, 10, second);
  EXPECT_EQ(CheckpointReader::open_latest(root_).iteration(), 10);
  // Meanwhile the first run, still training, may no longer save there.
  EXPECT_NE(error_of([&] { save(root_, 200, first); }).find("claimed by another run"), std::string::npos);
}

TEST_F(LineageTest, ResumingFromTheSameDirectoryIsAllowedEvenWithoutRecordedIds) {
  CheckpointWriter legacy(root_, 50);  // a checkpoint from before run ids
  legacy.commit();
  const CheckpointReader reader = CheckpointReader::open_latest(root_);
  const std::string run = run_id_for(&reader);
  claim_save_directory(root_, run, root_, false);
  save(root_, 60, run);
  EXPECT_EQ(CheckpointReader::open_latest(root_).iteration(), 60);
}

TEST_F(LineageTest, DeletedTrackerIsNotAFreshStart) {
  const std::string run = new_run_id();
  claim_save_directory(root_, run, "", false);
  save(root_, 100, run);
  fs::remove(tracker_file_path(root_));
  const std::string load = error_of([&] { inspect_load_directory(root_); });
  EXPECT_NE(load.find("no latest_checkpointed_iteration.txt"), std::string::npos) << load;
  EXPECT_NE(load.find("echo 100"), std::string::npos) << load;
  // A run that started fresh anyway (no load) may not save over those iterations.
  EXPECT_NE(error_of([&] { claim_save_directory(root_, new_run_id(), "", false); }).find("another run"),
            std::string::npos);
}

// `claimers` processes claim `root` at once (each with its own run id) and hold their claims until all have
// tried. Returns the winners' run ids; every loser must have been refused with a clear line.
std::vector<std::string> race_for(const std::string& root, int claimers) {
  int go[2], done[2], release[2];
  if (::pipe(go) != 0 || ::pipe(done) != 0 || ::pipe(release) != 0) return {"pipe failed"};
  std::vector<std::string> ids;
  std::vector<pid_t> children;
  for (int c = 0; c < claimers; ++c) {
    ids.push_back(new_run_id());
    const pid_t pid = ::fork();
    if (pid == 0) {
      char byte = 0;
      ::close(go[1]);
      ::close(release[1]);
      (void)!::read(go[0], &byte, 1);  // every claimer starts at the same moment
      char verdict = 'F';
      SaveDirectoryClaim claim;
      try {
        claim = claim_save_directory(root, ids.back(), "", false);
        verdict = 'W';
      } catch (const UserError& e) {
        const std::string message = e.what();
        const bool clear = message.find("another --save directory") != std::string::npos &&
                           message.find('\n') == std::string::npos;
        verdict = clear ? 'L' : 'U';
      }
      (void)!::write(done[1], &verdict, 1);
      (void)!::read(release[0], &byte, 1);  // hold the claim until every claimer has tried
      ::_exit(0);
    }
    children.push_back(pid);
  }
  ::close(go[0]);
  ::close(go[1]);
  ::close(release[0]);
  std::vector<std::string> winners;
  for (int c = 0; c < claimers; ++c) {
    char verdict = 0;
    if (::read(done[0], &verdict, 1) != 1) verdict = '?';
    if (verdict != 'W' && verdict != 'L') winners.push_back(std::string("bad verdict ") + verdict);
    if (verdict == 'W') winners.push_back("winner");
  }
  ::close(release[1]);
  for (const pid_t pid : children) ::waitpid(pid, nullptr, 0);
  ::close(done[0]);
  ::close(done[1]);
  const std::string owner = save_directory_owner(root);
  for (std::string& w : winners)
    if (w == "winner") w = owner;
  return winners;
}

TEST_F(LineageTest, OfRunsClaimingAFreshDirectoryAtOnceExactlyOneWinsAndSaves) {
  for (int trial = 0; trial < 8; ++trial) {
    const std::string root = base_ + "/race" + std::to_string(trial);
    const std::vector<std::string> winners = race_for(root, 3);
    ASSERT_EQ(winners.size(), 1u) << "trial " << trial << ": " << (winners.empty() ? "" : winners[0]);
    ASSERT_EQ(winners[0].size(), 32u) << winners[0];  // the owner file holds the winner's id
    save(root, 1, winners[0]);                        // the winner saves; nothing of a loser's is there
    EXPECT_EQ(CheckpointReader::open_latest(root).iteration(), 1);
  }
}

TEST_F(LineageTest, AHeldClaimRefusesASecondRunUntilReleased) {
  const std::string first = new_run_id(), second = new_run_id();
  std::optional<SaveDirectoryClaim> claim = claim_save_directory(root_, first, "", false);
  EXPECT_TRUE(claim->held());
  const std::string message = error_of([&] { claim_save_directory(root_, second, "", true); });
  EXPECT_NE(message.find("in use by another run"), std::string::npos) << message;
  EXPECT_NE(message.find("process " + std::to_string(::getpid())), std::string::npos) << message;
  EXPECT_EQ(save_directory_owner(root_), first);
  // The first run ends (or crashes) before its first save: a new run may take the empty directory.
  claim.reset();
  const SaveDirectoryClaim next = claim_save_directory(root_, second, "", false);
  EXPECT_EQ(save_directory_owner(root_), second);
}

TEST_F(LineageTest, LoadPathsAreChecked) {
  const std::string missing = error_of([&] { inspect_load_directory(base_ + "/typo"); });
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;
  std::ofstream(base_ + "/file") << "x";
  EXPECT_NE(error_of([&] { inspect_load_directory(base_ + "/file"); }).find("not a directory"),
            std::string::npos);
  fs::create_directories(base_ + "/empty");
  EXPECT_EQ(inspect_load_directory(base_ + "/empty"), LoadState::kNoCheckpoint);
  const std::string run = new_run_id();
  claim_save_directory(root_, run, "", false);
  save(root_, 1, run);
  EXPECT_EQ(inspect_load_directory(root_), LoadState::kCheckpoint);
}

TEST_F(LineageTest, SaveIntoAFileIsRefused) {
  std::ofstream(base_ + "/file") << "x";
  EXPECT_NE(error_of([&] {
              claim_save_directory(base_ + "/file", new_run_id(), "", false);
            }).find("not a directory"),
            std::string::npos);
}

TEST_F(LineageTest, FifosInPlaceOfCheckpointFilesFailFast) {
  const std::string run = new_run_id();
  claim_save_directory(root_, run, "", false);
  save(root_, 1, run);
  const auto start = std::chrono::steady_clock::now();
  const std::string manifest =
      (fs::path(iteration_directory(root_, 1)) / kDefaultShardName / kManifestFileName).string();
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { CheckpointReader::open_latest(root_); }).find("FIFO"), std::string::npos);
  fs::remove(tracker_file_path(root_));
  ASSERT_EQ(::mkfifo(tracker_file_path(root_).c_str(), 0644), 0);
  EXPECT_NE(error_of([&] { read_latest_iteration(root_); }).find("FIFO"), std::string::npos);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0);
}

TEST_F(LineageTest, DamageAdviceNamesNoMissingFlag) {
  const std::string run = new_run_id();
  claim_save_directory(root_, run, "", false);
  save(root_, 1, run);
  fs::remove_all(iteration_directory(root_, 1));
  const std::string message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_EQ(message.find("--ckpt-step"), std::string::npos) << message;
  EXPECT_NE(message.find(kTrackerFileName), std::string::npos) << message;
}

}  // namespace
}  // namespace megatune::executor::checkpoint
