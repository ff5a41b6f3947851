// Tests the .npy writer against bytes numpy 1.24 writes with numpy.save, and the index dump.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "executor/data/npy_file.h"

namespace megatune::executor::data {
namespace {

std::string header_of(const std::vector<unsigned char>& bytes) {
  return std::string(bytes.begin(), bytes.begin() + 128);
}

std::string numpy_header(const std::string& dict) {
  // numpy.save: magic, version 1.0, little-endian header length 118, dict padded to 127 bytes, '\n'.
  std::string header("\x93NUMPY\x01\x00\x76\x00", 10);
  header += dict;
  header.append(127 - header.size(), ' ');
  header.push_back('\n');
  return header;
}

TEST(NpyFile, HeadersMatchNumpySave) {
  const std::vector<int32_t> a{1, 2, 3};
  const std::vector<int64_t> shape_a{3};
  const auto bytes_a = npy_bytes(NpyDType::int32, shape_a, a.data());
  ASSERT_EQ(bytes_a.size(), 140u);  // len(numpy.save(int32 [1, 2, 3]))
  EXPECT_EQ(header_of(bytes_a), numpy_header("{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }"));
  EXPECT_EQ(bytes_a[128], 1);
  EXPECT_EQ(bytes_a[136], 3);

  const std::vector<int64_t> b(4, 0);
  const std::vector<int64_t> shape_b{2, 2};
  const auto bytes_b = npy_bytes(NpyDType::int64, shape_b, b.data());
  ASSERT_EQ(bytes_b.size(), 160u);
  EXPECT_EQ(header_of(bytes_b), numpy_header("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }"));

  const std::vector<int64_t> shape_c{0};
  const auto bytes_c = npy_bytes(NpyDType::uint32, shape_c, nullptr);
  ASSERT_EQ(bytes_c.size(), 128u);
  EXPECT_EQ(header_of(bytes_c), numpy_header("{'descr': '<u4', 'fortran_order': False, 'shape': (0,), }"));
}

TEST(NpyFile, DumpsTheThreeIndices) {
  const std::vector<int32_t> lengths{5, 3, 7, 2, 6, 4, 8, 1};
  const std::vector<int32_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
  GPTIndexConfig config;
  config.sequence_length = 4;
  const auto indices = build_gpt_dataset_indices(lengths, ids, 5, config, "test");
  const auto prefix =
      (std::filesystem::temp_directory_path() / ("megatune_npy_" + std::to_string(::getpid()))).string();
  write_gpt_dataset_indices(prefix, indices);
  for (const char* suffix : {"-document_index.npy", "-sample_index.npy", "-shuffle_index.npy"}) {
    std::ifstream in(prefix + suffix, std::ios::binary);
    const std::vector<unsigned char> bytes{std::istreambuf_iterator<char>(in),
                                           std::istreambuf_iterator<char>()};
    ASSERT_GE(bytes.size(), 128u) << suffix;
    EXPECT_EQ(bytes[0], 0x93);
    std::filesystem::remove(prefix + suffix);
  }
  // sample index (9, 2) int32 = 72 data bytes after the 128-byte header
  const auto sample = npy_bytes(NpyDType::int32, std::vector<int64_t>{9, 2}, std::vector<int32_t>(18).data());
  EXPECT_NE(std::string(sample.begin(), sample.begin() + 128).find("'shape': (9, 2)"), std::string::npos);
  EXPECT_EQ(sample.size(), 128u + 72u);
}

}  // namespace
}  // namespace megatune::executor::data
