// Tests checkpoint storage: round trip, Megatron-style layout, atomicity under an interrupted save,
// corruption and mismatch detection, keep-last-N, the CRC-32C, and the shard index that binds every shard of
// an iteration to its manifest checksum (a shard copied from another iteration, swapped, replaced, missing
// or damaged is refused naming that shard and the cause; a save without the index still loads).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>

#include "base/user_error.h"
#include "executor/checkpoint/checkpoint_reader.h"
#include "executor/checkpoint/checkpoint_writer.h"
#include "executor/checkpoint/crc32c.h"
#include "executor/checkpoint/saved_iteration.h"

namespace megatune::executor::checkpoint {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() / ("megatune_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                          ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Saves iteration `iteration` whose weights are all `value`.
  void save(int64_t iteration, float value, int64_t keep_last = 0) {
    CheckpointWriter writer(root_, iteration, {.keep_last = keep_last});
    std::vector<float> weights(12, value);
    writer.add_tensor("weights", TensorDType::fp32, {3, 4}, weights.data());
    writer.add_metadata_int("iteration", iteration);
    writer.commit();
  }
  float weight_of(const CheckpointReader& reader) {
    std::vector<float> weights(12);
    reader.read_tensor("weights", TensorDType::fp32, {3, 4}, weights.data());
    return weights[0];
  }
  std::string shard_file(int64_t iteration, const char* name) const {
    return (fs::path(iteration_directory(root_, iteration)) / kDefaultShardName / name).string();
  }
  static std::string error_of(const std::function<void()>& action) {
    try {
      action();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
  std::string root_;
};

TEST(Crc32c, MatchesTheStandardCheckValue) {
  const char* text = "123456789";
  EXPECT_EQ(crc32c_update(0, text, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_update_portable(0, text, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_update(crc32c_update(0, text, 4), text + 4, 5), 0xE3069283u);
  EXPECT_EQ(crc32c_update(0, "", 0), 0u);
  // RFC 3720 B.4: 32 bytes of zeros -> 0x8A9136AA, 32 bytes of 0xFF -> 0x62A8AB43.
  const std::vector<unsigned char> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(crc32c_update(0, zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c_update(0, ones.data(), 32), 0x62A8AB43u);
}

TEST(Crc32c, HardwareAndTablePathsAgreeAtEveryLengthAndAlignment) {
  std::vector<unsigned char> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t start = 0; start < 9; ++start) {
    for (size_t length = 0; length + start <= 200; length += 7) {
      ASSERT_EQ(crc32c_update(0, &bytes[start], length), crc32c_update_portable(0, &bytes[start], length));
    }
  }
  uint32_t piecewise = 0;
  for (size_t i = 0; i < bytes.size(); i += 7) {
    piecewise = crc32c_update(piecewise, &bytes[i], std::min<size_t>(7, bytes.size() - i));
  }
  EXPECT_EQ(piecewise, crc32c_update_portable(0, bytes.data(), bytes.size()));
}

TEST_F(CheckpointTest, RoundTripsTensorsAndMetadata) {
  std::vector<float> main_weights(6);
  std::iota(main_weights.begin(), main_weights.end(), 0.5f);
  const std::vector<uint16_t> bf16{0x3F80, 0xC000, 0x7FC0};
  const int64_t step = 123456789012345;
  const std::vector<uint8_t> rng{0, 1, 2, 255, ' ', '%', '\n'};
  {
    CheckpointWriter writer(root_, 100);
    writer.add_tensor("layers.0.weight", TensorDType::fp32, {2, 3}, main_weights.data());
    writer.add_tensor("layers.0.weight.bf16", TensorDType::bf16, {3}, bf16.data());
    writer.add_tensor("scheduler.step", TensorDType::int64, {}, &step);
    writer.add_tensor("rng.state", TensorDType::uint8, {7}, rng.data());
    writer.add_tensor("empty", TensorDType::fp32, {0, 5}, nullptr);
    writer.add_metadata_int("consumed_samples", 51200);
    writer.add_metadata("model", "gpt-125m hidden=768 layers=12");
    writer.add_metadata("note", "");
    writer.add_metadata_bytes("rng.cpu", rng);
    writer.commit();
  }
  EXPECT_TRUE(fs::is_directory(fs::path(root_) / "iter_0000100" / "mp_rank_00"));
  std::ifstream tracker(fs::path(root_) / "latest_checkpointed_iteration.txt");
  std::string tracked;
  tracker >> tracked;
  EXPECT_EQ(tracked, "100");
  EXPECT_FALSE(fs::exists(staging_directory(root_, 100)));

  const CheckpointReader reader = CheckpointReader::open_latest(root_);
  EXPECT_EQ(reader.iteration(), 100);
  ASSERT_EQ(reader.tensors().size(), 5u);
  EXPECT_EQ(reader.tensors()[1].name, "layers.0.weight.bf16");
  EXPECT_EQ(reader.tensors()[1].offset_bytes % kTensorAlignmentBytes, 0);
  std::vector<float> weights(6);
  reader.read_tensor("layers.0.weight", TensorDType::fp32, {2, 3}, weights.data());
  EXPECT_EQ(weights, main_weights);
  std::vector<uint16_t> bf16_back(3);
  reader.read_tensor("layers.0.weight.bf16", TensorDType::bf16, {3}, bf16_back.data());
  EXPECT_EQ(bf16_back, bf16);
  int64_t step_back = 0;
  reader.read_tensor("scheduler.step", TensorDType::int64, {}, &step_back);
  EXPECT_EQ(step_back, step);
  reader.read_tensor("empty", TensorDType::fp32, {0, 5}, nullptr);
  EXPECT_EQ(reader.metadata_int("consumed_samples"), 51200);
  EXPECT_EQ(reader.metadata_value("model"), "gpt-125m hidden=768 layers=12");
  EXPECT_EQ(reader.metadata_value("note"), "");
  EXPECT_EQ(reader.metadata_bytes("rng.cpu"), rng);
  EXPECT_NO_THROW(reader.require_metadata_equal("model", "gpt-125m hidden=768 layers=12"));
  EXPECT_NO_THROW(reader.verify_all());
}

TEST_F(CheckpointTest, LatestFollowsTheTrackerAndOlderIterationsStayLoadable) {
  save(10, 1.0f);
  save(20, 2.0f);
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 2.0f);
  EXPECT_EQ(weight_of(CheckpointReader::open(root_, 10)), 1.0f);
  EXPECT_EQ(list_checkpoint_iterations(root_), (std::vector<int64_t>{10, 20}));
  save(10, 3.0f);  // re-saving an existing iteration replaces it atomically
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 3.0f);
  EXPECT_EQ(read_latest_iteration(root_), 10);
}

TEST_F(CheckpointTest, AnInterruptedSaveLeavesThePreviousCheckpoint) {
  save(10, 1.0f);
  {
    // Crash after the shard is fully written but before it is renamed into place.
    CheckpointWriter writer(root_, 20);
    std::vector<float> weights(12, 2.0f);
    writer.add_tensor("weights", TensorDType::fp32, {3, 4}, weights.data());
    writer.commit_shard();
  }
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 1.0f);
  EXPECT_EQ(list_checkpoint_iterations(root_), (std::vector<int64_t>{10}));
  {
    // Crash (an exception) in the middle of writing tensors: nothing of it stays.
    CheckpointWriter writer(root_, 30);
    std::vector<float> weights(12, 3.0f);
    writer.add_tensor("weights", TensorDType::fp32, {3, 4}, weights.data());
  }
  EXPECT_FALSE(fs::exists(fs::path(staging_directory(root_, 30)) / kDefaultShardName));
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 1.0f);
  // Re-saving an iteration over a half-written staging directory and over the same final iteration works.
  {
    CheckpointWriter writer(root_, 10);
    std::vector<float> weights(12, 9.0f);
    writer.add_tensor("weights", TensorDType::fp32, {3, 4}, weights.data());
    writer.commit_shard();
  }
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 1.0f);  // not finalized: the old 10 stays
  save(20, 2.0f);
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 2.0f);
}

TEST_F(CheckpointTest, FinalizeWaitsForEveryShard) {
  {
    CheckpointWriter writer(root_, 5, {.shard_name = "mp_rank_00"});
    writer.add_metadata("rank", "0");
    writer.commit_shard();
  }
  const std::string message = error_of([&] {
    CheckpointWriter::finalize_iteration(root_, 5, {"mp_rank_00", "mp_rank_01"});
  });
  EXPECT_NE(message.find("mp_rank_01 is missing"), std::string::npos) << message;
  EXPECT_FALSE(read_latest_iteration(root_).has_value());
  {
    CheckpointWriter writer(root_, 5, {.shard_name = "mp_rank_01"});
    writer.add_metadata("rank", "1");
    writer.commit_shard();
  }
  CheckpointWriter::finalize_iteration(root_, 5, {"mp_rank_00", "mp_rank_01"});
  EXPECT_EQ(CheckpointReader::open_latest(root_, "mp_rank_01").metadata_value("rank"), "1");
}

TEST_F(CheckpointTest, KeepLastRemovesOlderIterations) {
  for (int64_t iteration = 1; iteration <= 4; ++iteration) save(iteration, static_cast<float>(iteration), 2);
  EXPECT_EQ(list_checkpoint_iterations(root_), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(weight_of(CheckpointReader::open_latest(root_)), 4.0f);
}

TEST_F(CheckpointTest, CorruptedTensorBytesFailTheCrc) {
  save(7, 1.5f);
  {
    std::fstream file(shard_file(7, kTensorsFileName), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(5);
    file.put('\x42');
  }
  const CheckpointReader reader = CheckpointReader::open_latest(root_);
  const std::string message = error_of([&] { weight_of(reader); });
  EXPECT_NE(message.find("fails its CRC-32C check"), std::string::npos) << message;
  EXPECT_NE(message.find(shard_file(7, kTensorsFileName)), std::string::npos) << message;
  EXPECT_THROW(reader.verify_all(), UserError);
}

TEST_F(CheckpointTest, TruncatedOrDamagedFilesAreClearErrors) {
  save(7, 1.5f);
  const std::string tensors = shard_file(7, kTensorsFileName);
  const std::string manifest = shard_file(7, kManifestFileName);
  const std::string original_manifest = [&] {
    std::ifstream in(manifest, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }();
  const auto write_manifest = [&](const std::string& text) {
    std::ofstream(manifest, std::ios::binary) << text;
  };

  fs::resize_file(tensors, fs::file_size(tensors) - 4);
  std::string message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("(truncated)"), std::string::npos) << message;
  fs::remove(tensors);
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("is missing"), std::string::npos) << message;

  std::string edited = original_manifest;
  edited[edited.find("iteration 7") + 10] = '8';
  write_manifest(edited);
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("fails its checksum"), std::string::npos) << message;
  write_manifest(original_manifest.substr(0, original_manifest.size() / 2));
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  fs::remove(manifest);
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find(manifest), std::string::npos) << message;
  EXPECT_NE(message.find("is missing"), std::string::npos) << message;
}

TEST_F(CheckpointTest, MissingCheckpointsAndBadTrackersAreClearErrors) {
  std::string message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("does not exist; check --load"), std::string::npos) << message;
  fs::create_directories(root_);
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("latest_checkpointed_iteration.txt is missing"), std::string::npos) << message;
  std::ofstream(tracker_file_path(root_)) << "12\n";
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("iter_0000012 does not exist"), std::string::npos) << message;
  std::ofstream(tracker_file_path(root_)) << "twelve\n";
  message = error_of([&] { CheckpointReader::open_latest(root_); });
  EXPECT_NE(message.find("instead of an iteration number"), std::string::npos) << message;
  std::ofstream(tracker_file_path(root_)) << "release\n";
  EXPECT_THROW(CheckpointReader::open_latest(root_), UserError);
  save(3, 1.0f);
  message = error_of([&] { CheckpointReader::open_latest(root_, "mp_rank_01"); });
  EXPECT_NE(message.find("has no shard mp_rank_01"), std::string::npos) << message;
}

TEST_F(CheckpointTest, MismatchesNameBothSides) {
  save(3, 1.0f);
  const CheckpointReader reader = CheckpointReader::open_latest(root_);
  std::vector<float> buffer(12);
  std::string message = error_of([&] {
    reader.read_tensor("weights", TensorDType::fp32, {4, 3}, buffer.data());
  });
  EXPECT_NE(message.find("fp32 [3,4] but the model expects fp32 [4,3]"), std::string::npos) << message;
  message = error_of([&] { reader.read_tensor("weights", TensorDType::bf16, {3, 4}, buffer.data()); });
  EXPECT_NE(message.find("expects bf16 [3,4]"), std::string::npos) << message;
  message = error_of([&] { reader.read_tensor("bias", TensorDType::fp32, {3}, buffer.data()); });
  EXPECT_NE(message.find("has no tensor bias"), std::string::npos) << message;
  message = error_of([&] { reader.require_metadata_equal("iteration", "4"); });
  EXPECT_NE(message.find("iteration=3 but this run has iteration=4"), std::string::npos) << message;
  EXPECT_THROW(reader.metadata_value("absent"), UserError);
}

TEST_F(CheckpointTest, BadNamesAreRejected) {
  CheckpointWriter writer(root_, 1);
  float value = 1.0f;
  EXPECT_THROW(writer.add_tensor("", TensorDType::fp32, {1}, &value), UserError);
  EXPECT_THROW(writer.add_tensor("a b", TensorDType::fp32, {1}, &value), UserError);
  writer.add_tensor("a", TensorDType::fp32, {1}, &value);
  EXPECT_THROW(writer.add_tensor("a", TensorDType::fp32, {1}, &value), UserError);
  EXPECT_THROW(writer.add_metadata("bad key", "x"), UserError);
  EXPECT_THROW(CheckpointWriter(root_, 1, {.shard_name = "a/b"}), UserError);
}

// Two shards ("rank_0", "rank_1") of `iteration` under `root`, each holding weights `value` + its rank.
void save_two_shards(const std::string& root, int64_t iteration, float value) {
  for (int rank = 0; rank < 2; ++rank) {
    CheckpointWriter writer(root, iteration, {.shard_name = "rank_" + std::to_string(rank)});
    std::vector<float> weights(12, value + static_cast<float>(rank));
    writer.add_tensor("weights", TensorDType::fp32, {3, 4}, weights.data());
    writer.commit_shard();
  }
  CheckpointWriter::finalize_iteration(root, iteration, {"rank_0", "rank_1"});
}

class ShardIndexTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    save_two_shards(root_, 2, 20.0f);
    save_two_shards(root_, 4, 40.0f);
  }
  fs::path shard(int64_t iteration, const std::string& name) const {
    return fs::path(iteration_directory(root_, iteration)) / name;
  }
  void replace_shard(const fs::path& from, const fs::path& to) const {
    fs::remove_all(to);
    fs::copy(from, to, fs::copy_options::recursive);
  }
  std::string open_error(const std::string& name) const {
    return error_of([&] { SavedIteration::open_latest(root_).open_shard(name); });
  }
};

TEST_F(ShardIndexTest, EveryShardOpensAsTheSaveWroteIt) {
  const SavedIteration saved = SavedIteration::open_latest(root_);
  EXPECT_EQ(saved.iteration(), 4);
  EXPECT_TRUE(saved.indexed());
  EXPECT_FALSE(saved.single_shard());
  EXPECT_EQ(weight_of(saved.open_shard("rank_1")), 41.0f);
  EXPECT_NE(open_error("rank_2").find("has no shard rank_2: its shards.txt lists 2 shards, rank_0 .. rank_1"),
            std::string::npos);
  save(7, 1.0f);  // a single-process save
  EXPECT_TRUE(SavedIteration::open_latest(root_).single_shard());
}

TEST_F(ShardIndexTest, AShardOfAnotherIterationIsRefused) {
  replace_shard(shard(2, "rank_1"), shard(4, "rank_1"));
  for (const bool indexed : {true, false}) {  // saves from before shards.txt are checked by iteration too
    SCOPED_TRACE(indexed);
    if (!indexed) fs::remove(fs::path(iteration_directory(root_, 4)) / kShardIndexFileName);
    const std::string message = open_error("rank_1");
    EXPECT_NE(message.find(shard(4, "rank_1").string() + " records iteration 2 but lies in the directory of "
                                                         "iteration 4"),
              std::string::npos)
        << message;
  }
}

TEST_F(ShardIndexTest, SwappedOrReplacedShardsAreRefused) {
  const fs::path aside = fs::path(root_) / "aside";
  fs::rename(shard(4, "rank_0"), aside);
  fs::rename(shard(4, "rank_1"), shard(4, "rank_0"));
  fs::rename(aside, shard(4, "rank_1"));
  const std::string swapped = open_error("rank_0");
  EXPECT_NE(swapped.find(shard(4, "rank_0").string() + " holds the shard this save wrote as rank_1"),
            std::string::npos)
      << swapped;
  // Another save of the same iteration (another run's) in place of rank_1.
  const std::string other = root_ + "_other";
  save_two_shards(other, 4, 90.0f);
  replace_shard(fs::path(iteration_directory(other, 4)) / "rank_1", shard(4, "rank_1"));
  const std::string replaced = open_error("rank_1");
  fs::remove_all(other);
  EXPECT_NE(replaced.find(shard(4, "rank_1").string() + " is not the one this save wrote"), std::string::npos)
      << replaced;
}

TEST_F(ShardIndexTest, AMissingOrDamagedShardIsNamedWithItsCause) {
  fs::remove_all(shard(4, "rank_0"));
  const std::string missing = open_error("rank_0");
  EXPECT_NE(missing.find("checkpoint shard " + shard(4, "rank_0").string() + " is missing"),
            std::string::npos)
      << missing;
  save_two_shards(root_, 4, 40.0f);
  std::ofstream(shard(4, "rank_0") / kManifestFileName, std::ios::app) << "tensor extra\n";
  const std::string damaged = open_error("rank_0");
  EXPECT_NE(damaged.find((shard(4, "rank_0") / kManifestFileName).string() + " is truncated"),
            std::string::npos)
      << damaged;
  std::ofstream(fs::path(iteration_directory(root_, 4)) / kShardIndexFileName, std::ios::app) << "x\n";
  EXPECT_NE(open_error("rank_0").find("shards.txt is truncated (no end line)"), std::string::npos);
}

}  // namespace
}  // namespace megatune::executor::checkpoint
