// Tests the Megatron indexed dataset writer and reader against files built byte by byte from
// megatron.md §7, and every kind of damaged file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "base/user_error.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/indexed_dataset_writer.h"

namespace megatune::executor::data {
namespace {

namespace fs = std::filesystem;

class IndexedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        fs::temp_directory_path() / ("megatune_idx_test_" + std::to_string(::getpid()) + "_" +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  std::string prefix(const std::string& name) const { return (directory_ / name).string(); }
  fs::path directory_;
};

std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void append_le(std::vector<unsigned char>& bytes, T value) {
  unsigned char raw[sizeof(T)];
  std::memcpy(raw, &value, sizeof(T));  // the test machine is little-endian, as the format
  bytes.insert(bytes.end(), raw, raw + sizeof(T));
}

// Two documents: doc 0 = sequences {[1, 2, 3]}, doc 1 = sequences {[65535, 7], [256]} in uint16.
struct ExpectedFiles {
  std::vector<unsigned char> idx;
  std::vector<unsigned char> bin;
};

ExpectedFiles hand_built_files() {
  ExpectedFiles files;
  files.idx = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};  // magic
  append_le<uint64_t>(files.idx, 1);                      // version
  append_le<uint8_t>(files.idx, 8);                       // dtype code: uint16
  append_le<uint64_t>(files.idx, 3);                      // sequence count
  append_le<uint64_t>(files.idx, 3);                      // document count = documents + 1
  for (int32_t length : {3, 2, 1}) append_le<int32_t>(files.idx, length);
  for (int64_t pointer : {0, 6, 10}) append_le<int64_t>(files.idx, pointer);  // cumulative length * 2 bytes
  for (int64_t document : {0, 1, 3}) append_le<int64_t>(files.idx, document);
  for (uint16_t token : {1, 2, 3, 65535, 7, 256}) append_le<uint16_t>(files.bin, token);
  return files;
}

void write_example(IndexedDatasetWriter& writer) {
  writer.add_document(std::vector<int32_t>{1, 2, 3});
  writer.add_sequence(std::span<const int32_t>(std::vector<int32_t>{65535, 7}));
  writer.add_sequence(std::span<const int64_t>(std::vector<int64_t>{256}));
  writer.end_document();
}

TEST_F(IndexedDatasetTest, WriterIsByteExactWithTheFormat) {
  const auto p = prefix("example");
  IndexedDatasetWriter writer(data_file_path(p), index_file_path(p), IndexDType::uint16);
  write_example(writer);
  writer.finalize();
  const auto expected = hand_built_files();
  EXPECT_EQ(read_bytes(index_file_path(p)), expected.idx);
  EXPECT_EQ(read_bytes(data_file_path(p)), expected.bin);
  EXPECT_EQ(writer.num_documents(), 2);
  EXPECT_EQ(writer.num_sequences(), 3);
  EXPECT_EQ(writer.num_tokens(), 6);
}

TEST_F(IndexedDatasetTest, ReaderReadsHandBuiltFiles) {
  const auto p = prefix("hand");
  const auto files = hand_built_files();
  write_bytes(index_file_path(p), files.idx);
  write_bytes(data_file_path(p), files.bin);
  const IndexedDataset dataset(p);
  EXPECT_EQ(dataset.dtype(), IndexDType::uint16);
  EXPECT_EQ(dataset.num_sequences(), 3);
  EXPECT_EQ(dataset.num_documents(), 2);
  EXPECT_EQ(dataset.num_tokens(), 6);
  EXPECT_EQ(dataset.sequence_lengths(), (std::vector<int32_t>{3, 2, 1}));
  EXPECT_EQ(dataset.sequence_pointer_bytes(2), 10);
  EXPECT_EQ(dataset.document_index(1), 1);
  EXPECT_EQ(dataset.document_index(2), 3);
  EXPECT_FALSE(dataset.has_sequence_modes());
  EXPECT_EQ(dataset.sequence(0), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(dataset.sequence(1), (std::vector<int32_t>{65535, 7}));
  EXPECT_EQ(dataset.sequence(2), (std::vector<int32_t>{256}));
  int32_t part[1];
  dataset.read_tokens(0, 1, 1, part);
  EXPECT_EQ(part[0], 2);
  EXPECT_THROW(dataset.read_tokens(0, 2, 2, part), UserError);
  EXPECT_THROW(dataset.read_tokens(3, 0, 1, part), UserError);
}

TEST_F(IndexedDatasetTest, RoundTripsEveryIntegerDtype) {
  for (const IndexDType dtype : {IndexDType::uint8, IndexDType::int8, IndexDType::int16, IndexDType::uint16,
                                 IndexDType::int32, IndexDType::int64}) {
    const auto p = prefix("dtype_" + index_dtype_name(dtype));
    const int64_t top = std::min<int64_t>(index_dtype_max_value(dtype), 100000);
    const int64_t bottom = std::max<int64_t>(index_dtype_min_value(dtype), -100000);
    const std::vector<int32_t> tokens{0, 1, static_cast<int32_t>(top), static_cast<int32_t>(bottom)};
    {
      IndexedDatasetWriter writer(data_file_path(p), index_file_path(p), dtype);
      writer.add_document(tokens);
      writer.add_document(std::vector<int32_t>{});
      writer.finalize();
    }
    const IndexedDataset dataset(p);
    EXPECT_EQ(dataset.dtype(), dtype);
    EXPECT_EQ(dataset.sequence(0), tokens) << index_dtype_name(dtype);
    EXPECT_EQ(dataset.sequence(1).size(), 0u);
    EXPECT_EQ(fs::file_size(data_file_path(p)), 4 * static_cast<size_t>(index_dtype_size_bytes(dtype)));
  }
}

TEST_F(IndexedDatasetTest, WriterRejectsTokensOutsideTheDtype) {
  const auto p = prefix("range");
  IndexedDatasetWriter writer(data_file_path(p), index_file_path(p), IndexDType::uint16);
  EXPECT_THROW(writer.add_document(std::vector<int32_t>{65536}), UserError);
  EXPECT_THROW(writer.add_document(std::vector<int32_t>{-1}), UserError);
}

TEST_F(IndexedDatasetTest, AppendDatasetConcatenatesDocuments) {
  const auto a = prefix("a");
  const auto merged = prefix("merged");
  {
    IndexedDatasetWriter writer(data_file_path(a), index_file_path(a), IndexDType::uint16);
    write_example(writer);
    writer.finalize();
  }
  IndexedDatasetWriter writer(data_file_path(merged), index_file_path(merged), IndexDType::uint16);
  writer.add_document(std::vector<int32_t>{9});
  writer.append_dataset(a);
  writer.finalize();
  const IndexedDataset dataset(merged);
  EXPECT_EQ(dataset.num_documents(), 3);
  EXPECT_EQ(dataset.document_index(2), 2);
  EXPECT_EQ(dataset.document_index(3), 4);
  EXPECT_EQ(dataset.sequence(3), (std::vector<int32_t>{256}));
}

// Every corruption must be one UserError line naming the damaged file.
struct Corruption {
  std::string name;
  std::function<void(ExpectedFiles&)> damage;
  std::string damaged_file;  // "idx" or "bin"
  std::string message_part;  // what the message must say
};

TEST_F(IndexedDatasetTest, EveryCorruptionIsAClearError) {
  const std::vector<Corruption> corruptions{
      {"magic", [](ExpectedFiles& f) { f.idx[0] = 'X'; }, "idx", "wrong magic"},
      {"version", [](ExpectedFiles& f) { f.idx[9] = 2; }, "idx", "unsupported version 2"},
      {"dtype zero", [](ExpectedFiles& f) { f.idx[17] = 0; }, "idx", "unknown dtype code 0"},
      {"dtype nine", [](ExpectedFiles& f) { f.idx[17] = 9; }, "idx", "unknown dtype code 9"},
      {"short header", [](ExpectedFiles& f) { f.idx.resize(20); }, "idx", "shorter than the 34-byte header"},
      {"truncated idx", [](ExpectedFiles& f) { f.idx.pop_back(); }, "idx", "(truncated)"},
      {"extra idx bytes",
       [](ExpectedFiles& f) {
         f.idx.push_back(0);
         f.idx.push_back(0);
       },
       "idx", "extra bytes"},
      {"sequence count too large", [](ExpectedFiles& f) { f.idx[18] = 4; }, "idx", "needs"},
      {"huge count", [](ExpectedFiles& f) { f.idx[25] = 0x7f; }, "idx", "implausible counts"},
      {"zero documents", [](ExpectedFiles& f) { std::memset(&f.idx[26], 0, 8); }, "idx",
       "document count is 0"},
      {"truncated bin", [](ExpectedFiles& f) { f.bin.resize(11); }, "idx", "outside"},
      {"long bin",
       [](ExpectedFiles& f) {
         f.bin.push_back(0);
         f.bin.push_back(0);
       },
       "bin", "different runs"},
      {"negative length", [](ExpectedFiles& f) { f.idx[34 + 3] = 0x80; }, "idx", "negative length"},
      {"pointer out of range", [](ExpectedFiles& f) { f.idx[34 + 12 + 16] = 200; }, "idx", "outside"},
      {"pointer near the int64 limit",  // the message's end byte must not overflow (found by the fuzzer)
       [](ExpectedFiles& f) {
         const int64_t pointer = INT64_MAX - 1;
         std::memcpy(&f.idx[34 + 12], &pointer, sizeof(pointer));
       },
       "idx", "outside"},
      {"pointer not cumulative", [](ExpectedFiles& f) { f.idx[34 + 12 + 8] = 4; }, "idx", "cumulative"},
      {"first document index", [](ExpectedFiles& f) { f.idx[34 + 36] = 1; }, "idx", "must be 0"},
      {"document index order",
       [](ExpectedFiles& f) {
         f.idx[34 + 36 + 8] = 3;
         f.idx[34 + 36 + 16] = 2;
       },
       "idx", "non-decreasing"},
      {"document index end", [](ExpectedFiles& f) { f.idx[34 + 36 + 16] = 2; }, "idx", "last document ends"},
  };
  for (const auto& corruption : corruptions) {
    SCOPED_TRACE(corruption.name);
    auto files = hand_built_files();
    corruption.damage(files);
    const auto p = prefix("bad");
    write_bytes(index_file_path(p), files.idx);
    write_bytes(data_file_path(p), files.bin);
    try {
      IndexedDataset dataset(p);
      ADD_FAILURE() << "no error for " << corruption.name;
    } catch (const UserError& e) {
      const std::string message = e.what();
      const std::string file = corruption.damaged_file == "idx" ? index_file_path(p) : data_file_path(p);
      EXPECT_NE(message.find(file), std::string::npos) << message;
      EXPECT_NE(message.find(corruption.message_part), std::string::npos) << message;
      EXPECT_NE(message.find("preprocess"), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }
}

TEST_F(IndexedDatasetTest, MissingFilesNameThePathAndTheFix) {
  const auto p = prefix("missing");
  try {
    IndexedDataset dataset(p);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(index_file_path(p)), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("preprocess"), std::string::npos);
  }
  write_bytes(index_file_path(p), hand_built_files().idx);
  try {
    IndexedDataset dataset(p);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(data_file_path(p)), std::string::npos);
  }
}

TEST_F(IndexedDatasetTest, EmptyDatasetOpens) {
  const auto p = prefix("empty");
  {
    IndexedDatasetWriter writer(data_file_path(p), index_file_path(p), IndexDType::uint16);
    writer.finalize();
  }
  const IndexedDataset dataset(p);
  EXPECT_EQ(dataset.num_sequences(), 0);
  EXPECT_EQ(dataset.num_documents(), 0);
}

}  // namespace
}  // namespace megatune::executor::data
