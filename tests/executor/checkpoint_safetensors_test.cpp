// Safetensors files and folders: round trips of F32 / BF16 / F16 (values and bytes), sharding by size with
// the index, and each class of bad file refused with one UserError line naming the file.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/user_error.h"
#include "executor/checkpoint/safetensors.h"
#include "executor/checkpoint/safetensors_folder.h"

namespace megatune::executor::checkpoint {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("megatune_safetensors_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // A file whose header is `header` (JSON text) followed by `data_bytes` bytes.
  std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                        int64_t length_override = -1) {
    std::ofstream out(path(name), std::ios::binary);
    const uint64_t length = length_override >= 0 ? static_cast<uint64_t>(length_override) : header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>(length >> (8 * i)));
    out << header << std::string(data_bytes, '\1');
    return path(name);
  }
  // The UserError message of opening `file` (fails the test when it opens).
  std::string open_error(const std::string& file) {
    try {
      SafetensorsFile opened(file);
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      EXPECT_NE(message.find(file), std::string::npos) << message;
      return message;
    }
    ADD_FAILURE() << file << " opened";
    return "";
  }
  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEachFloatDtypeAndMetadata) {
  const std::vector<float> values = {0.0f, -1.5f, 3.14159f, 1e-3f, -65504.0f, 1e-6f, 2.5e-8f, 7.0f};
  const std::vector<uint8_t> f32 = encode_floats(values, TensorDType::fp32);
  const std::vector<uint8_t> bf16 = encode_floats(values, TensorDType::bf16);
  const std::vector<uint8_t> f16 = encode_floats(values, TensorDType::fp16);
  write_safetensors(path("a.safetensors"),
                    {{"w.f32", TensorDType::fp32, {2, 4}, f32},
                     {"w.bf16", TensorDType::bf16, {8}, bf16},
                     {"w.f16", TensorDType::fp16, {4, 2}, f16}},
                    {{"format", "pt"}});
  const SafetensorsFile file(path("a.safetensors"));
  ASSERT_EQ(file.entries().size(), 3u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.find("w.f16")->shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(file.read_floats("w.f32"), values);
  EXPECT_EQ(file.read_bytes("w.bf16"), bf16);
  EXPECT_EQ(file.read_bytes("w.f16"), f16);
  const std::vector<float> from_bf16 = file.read_floats("w.bf16"), from_f16 = file.read_floats("w.f16");
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_NEAR(from_bf16[i], values[i], std::fabs(values[i]) * 4e-3f) << i;
    EXPECT_NEAR(from_f16[i], values[i], std::fabs(values[i]) * 1e-3f + 6e-8f) << i;
  }
  EXPECT_EQ(encode_floats(from_bf16, TensorDType::bf16), bf16);  // exact after one rounding
  EXPECT_EQ(encode_floats(from_f16, TensorDType::fp16), f16);
  // Known encodings: 1.0 is 0x3F80 in bf16 and 0x3C00 in f16; 1 + 2^-8 rounds to even (down) in bf16.
  const std::vector<float> one = {1.0f, 1.0f + 1.0f / 256.0f};
  EXPECT_EQ(encode_floats(one, TensorDType::bf16), (std::vector<uint8_t>{0x80, 0x3F, 0x80, 0x3F}));
  EXPECT_EQ(encode_floats(std::vector<float>{1.0f}, TensorDType::fp16), (std::vector<uint8_t>{0x00, 0x3C}));
  // The header is padded to 8 bytes.
  std::ifstream in(path("a.safetensors"), std::ios::binary);
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  EXPECT_EQ(length % 8, 0u);
}

TEST_F(Safetensors, ShardsAboveTheSizeLimitWithAnIndex) {
  std::vector<std::vector<float>> data;
  std::vector<std::vector<uint8_t>> bytes;
  for (int i = 0; i < 5; ++i) {
    data.push_back(std::vector<float>(100, static_cast<float>(i) + 0.5f));
    bytes.push_back(encode_floats(data.back(), TensorDType::fp32));
  }
  std::vector<SafetensorsTensor> tensors;
  for (int i = 0; i < 5; ++i)
    tensors.push_back({"t" + std::to_string(i), TensorDType::fp32, {10, 10}, bytes[i]});
  const std::vector<std::string> files = write_safetensors_folder(dir_.string(), tensors, 900);
  ASSERT_EQ(files.size(), 4u);  // 2 + 2 + 1 tensors of 400 bytes, and the index
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(files.back(), kSafetensorsIndexFileName);
  const nlohmann::json index = nlohmann::json::parse(std::ifstream(path(kSafetensorsIndexFileName)));
  EXPECT_EQ(index["metadata"]["total_size"], 2000);
  EXPECT_EQ(index["weight_map"]["t4"], "model-00003-of-00003.safetensors");
  const SafetensorsFolder folder(dir_.string());
  EXPECT_EQ(folder.tensor_names().size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(folder.read_floats("t" + std::to_string(i)), data[i]);
  // Under the limit: one model.safetensors and no index.
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  EXPECT_EQ(write_safetensors_folder(dir_.string(), tensors, parse_byte_size("5GB", "--max-shard-size")),
            std::vector<std::string>{kSafetensorsSingleFileName});
  EXPECT_EQ(SafetensorsFolder(dir_.string()).read_floats("t2"), data[2]);
}

TEST_F(Safetensors, ParsesHuggingFaceShardSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "--max-shard-size"), 5'000'000'000);
  EXPECT_EQ(parse_byte_size("2GiB", "--max-shard-size"), int64_t{2} << 30);
  EXPECT_EQ(parse_byte_size("500mb", "--max-shard-size"), 500'000'000);
  EXPECT_EQ(parse_byte_size("4096", "--max-shard-size"), 4096);
  EXPECT_THROW(parse_byte_size("5XB", "--max-shard-size"), UserError);
  EXPECT_THROW(parse_byte_size("-1GB", "--max-shard-size"), UserError);
}

TEST_F(Safetensors, RefusesEachClassOfBadFile) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(SafetensorsFile(write_raw("good.safetensors", good, 8)));
  {
    std::ofstream(path("short.safetensors")) << "abc";
    EXPECT_NE(open_error(path("short.safetensors")).find("truncated"), std::string::npos);
  }
  EXPECT_NE(open_error(write_raw("length.safetensors", good, 8, 1 << 20)).find("header length"),
            std::string::npos);
  EXPECT_NE(open_error(write_raw("json.safetensors", "{not json", 0)).find("JSON"), std::string::npos);
  EXPECT_NE(open_error(write_raw("data.safetensors", good, 4)).find("truncated"), std::string::npos);
  const std::string outside = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  EXPECT_NE(open_error(write_raw("range.safetensors", outside, 8)).find("[8, 16)"), std::string::npos);
  const std::string overlap = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  EXPECT_NE(open_error(write_raw("overlap.safetensors", overlap, 12)).find("overlap"), std::string::npos);
  const std::string dtype = R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})";
  EXPECT_NE(open_error(write_raw("dtype.safetensors", dtype, 2)).find("F8_E4M3"), std::string::npos);
  const std::string mismatch = R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})";
  EXPECT_NE(open_error(write_raw("shape.safetensors", mismatch, 8)).find("8 bytes"), std::string::npos);
  const std::string negative = R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})";
  EXPECT_NE(open_error(write_raw("negative.safetensors", negative, 8)).find("dimension"), std::string::npos);
  const std::string reversed = R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})";
  open_error(write_raw("reversed.safetensors", reversed, 8));
  const std::string metadata = R"({"__metadata__":{"k":1}})";
  EXPECT_NE(open_error(write_raw("meta.safetensors", metadata, 0)).find("__metadata__"), std::string::npos);
}

TEST_F(Safetensors, RefusesAnIndexThatDisagreesWithItsShards) {
  const std::vector<float> values(4, 1.0f);
  const std::vector<uint8_t> bytes = encode_floats(values, TensorDType::fp32);
  write_safetensors(path("model-00001-of-00001.safetensors"), {{"a", TensorDType::fp32, {4}, bytes}});
  const auto index_with = [&](const std::string& weight_map) {
    std::ofstream(path(kSafetensorsIndexFileName)) << R"({"metadata":{},"weight_map":)" << weight_map << "}";
  };
  index_with(R"({"a":"model-00001-of-00001.safetensors","b":"model-00001-of-00001.safetensors"})");
  EXPECT_THROW(SafetensorsFolder{dir_.string()}, UserError);  // b is not in that shard
  index_with(R"({"a":"model-00002-of-00002.safetensors"})");
  EXPECT_THROW(SafetensorsFolder{dir_.string()}, UserError);  // a missing shard
  index_with(R"({"a":"model-00001-of-00001.safetensors"})");
  EXPECT_EQ(SafetensorsFolder(dir_.string()).read_floats("a"), values);
  EXPECT_THROW(SafetensorsFolder(dir_.string()).read_floats("missing"), UserError);
}

}  // namespace
}  // namespace megatune::executor::checkpoint
