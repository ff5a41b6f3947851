// Tests `preprocess_data` (text, JSONL, token-id JSONL, bad input, overwrite protection) and the JSON
// line reader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/user_error.h"
#include "executor/data/byte_tokenizer.h"
#include "executor/data/indexed_dataset.h"
#include "executor/data/json_line.h"
#include "executor/data/preprocess.h"

namespace megatune::executor::data {
namespace {

namespace fs = std::filesystem;

class PreprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ =
        fs::temp_directory_path() / ("megatune_preprocess_test_" + std::to_string(::getpid()) + "_" +
                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(directory_);
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  std::string write(const std::string& name, const std::string& contents) const {
    const std::string path = (directory_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  std::string path(const std::string& name) const { return (directory_ / name).string(); }
  static std::vector<int32_t> bytes(const std::string& text) {
    std::vector<int32_t> tokens;
    ByteTokenizer::tokenize(text, tokens);
    return tokens;
  }
  fs::path directory_;
};

TEST_F(PreprocessTest, JsonlWithByteTokenizerAndEod) {
  PreprocessConfig config;
  config.input_path =
      write("in.jsonl", "{\"text\": \"ab\", \"id\": 1}\n\n{\"text\": \"\\u00e9\\n\"}\n{\"text\": \"\"}\n");
  config.output_prefix = path("out/corpus");
  config.append_eod = true;
  const auto result = preprocess_data(config);
  ASSERT_EQ(result.outputs.size(), 1u);
  EXPECT_EQ(result.outputs[0].path_prefix, path("out/corpus") + "_text_document");
  EXPECT_EQ(result.outputs[0].dtype, IndexDType::uint16);
  EXPECT_EQ(result.skipped_empty_documents, 1);
  const IndexedDataset dataset(result.outputs[0].path_prefix);
  EXPECT_EQ(dataset.num_documents(), 3);  // the empty document has no sequence, as in Megatron
  ASSERT_EQ(dataset.num_sequences(), 2);
  EXPECT_EQ(dataset.sequence(0), (std::vector<int32_t>{'a', 'b', 256}));
  EXPECT_EQ(dataset.sequence(1), (std::vector<int32_t>{0xC3, 0xA9, '\n', 256}));  // é in UTF-8
  EXPECT_EQ(dataset.document_index(3), 2);
}

TEST_F(PreprocessTest, SeveralJsonKeysGiveSeveralOutputs) {
  PreprocessConfig config;
  config.input_path = write("in.jsonl", "{\"text\": \"x\", \"title\": \"yz\"}\n");
  config.output_prefix = path("multi");
  config.json_keys = {"text", "title"};
  const auto result = preprocess_data(config);
  ASSERT_EQ(result.outputs.size(), 2u);
  EXPECT_EQ(IndexedDataset(path("multi_title_document")).sequence(0), bytes("yz"));
}

TEST_F(PreprocessTest, AKeyGivenTwiceIsRefusedBeforeAnythingIsWritten) {
  PreprocessConfig config;
  config.input_path = write("in.jsonl", "{\"text\": \"x\", \"title\": \"yz\"}\n");
  config.output_prefix = path("dup");
  config.json_keys = {"text", "title", "text"};
  try {
    preprocess_data(config);
    FAIL() << "no UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--json-keys names 'text' twice"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(directory_), fs::directory_iterator()), 1);  // the input
}

TEST_F(PreprocessTest, PlainTextParagraphsLinesAndWholeFile) {
  const std::string text = "first line\nsame doc\n\n\nsecond\r\n";
  PreprocessConfig config;
  config.input_path = write("book.txt", text);
  config.output_prefix = path("para");
  const auto para = preprocess_data(config);
  const IndexedDataset paragraphs(para.outputs[0].path_prefix);
  ASSERT_EQ(paragraphs.num_sequences(), 2);
  EXPECT_EQ(paragraphs.sequence(0), bytes("first line\nsame doc"));
  EXPECT_EQ(paragraphs.sequence(1), bytes("second"));

  config.output_prefix = path("lines");
  config.text_document_mode = TextDocumentMode::line;
  EXPECT_EQ(IndexedDataset(preprocess_data(config).outputs[0].path_prefix).num_sequences(), 3);

  config.output_prefix = path("file");
  config.text_document_mode = TextDocumentMode::file;
  const IndexedDataset whole(preprocess_data(config).outputs[0].path_prefix);
  ASSERT_EQ(whole.num_sequences(), 1);
  EXPECT_EQ(whole.sequence(0), bytes("first line\nsame doc\n\n\nsecond\n"));
}

TEST_F(PreprocessTest, TokenIdsPickTheDtypeFromTheVocabulary) {
  PreprocessConfig config;
  config.input_path = write("ids.jsonl", "{\"ids\": [1, 2, 70000]}\n{\"ids\": []}\n{\"ids\": [5]}\n");
  config.output_prefix = path("ids");
  config.json_keys = {"ids"};
  config.tokenizer.type = "ids";
  const auto result = preprocess_data(config);
  EXPECT_EQ(result.outputs[0].dtype, IndexDType::int32);  // max id + 1 >= 65500
  const IndexedDataset dataset(result.outputs[0].path_prefix);
  EXPECT_EQ(dataset.sequence(0), (std::vector<int32_t>{1, 2, 70000}));
  EXPECT_EQ(dataset.num_documents(), 3);

  config.input_path = write("small.jsonl", "{\"ids\": [1, 2]}\n");
  config.output_prefix = path("small");
  config.vocab_size = 1000;
  config.append_eod = true;
  config.eod_token = 999;
  const auto small = preprocess_data(config);
  EXPECT_EQ(small.outputs[0].dtype, IndexDType::uint16);
  EXPECT_EQ(IndexedDataset(small.outputs[0].path_prefix).sequence(0), (std::vector<int32_t>{1, 2, 999}));

  config.input_path = write("big.jsonl", "{\"ids\": [1, 2000]}\n");
  config.output_prefix = path("big");
  EXPECT_THROW(preprocess_data(config), UserError);  // 2000 >= --vocab-size 1000
  EXPECT_FALSE(fs::exists(path("big_ids_document.bin")));
}

TEST_F(PreprocessTest, BadJsonNamesFileAndLine) {
  PreprocessConfig config;
  config.input_path = write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"unterminated}\n");
  config.output_prefix = path("bad");
  try {
    preprocess_data(config);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(config.input_path + ":2:"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path("bad_text_document.bin")));
  EXPECT_FALSE(fs::exists(path("bad_text_document.idx")));
  EXPECT_EQ(std::distance(fs::directory_iterator(directory_), fs::directory_iterator()),
            1);  // no temporaries

  config.input_path = write("nokey.jsonl", "{\"body\": \"x\"}\n");
  try {
    preprocess_data(config);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("nokey.jsonl:1: no key \"text\""), std::string::npos) << e.what();
  }
  config.input_path = path("does_not_exist.jsonl");
  EXPECT_THROW(preprocess_data(config), UserError);
}

TEST_F(PreprocessTest, RefusesToOverwriteUnlessAsked) {
  PreprocessConfig config;
  config.input_path = write("a.jsonl", "{\"text\": \"one\"}\n");
  config.output_prefix = path("keep");
  preprocess_data(config);
  config.input_path = write("b.jsonl", "{\"text\": \"two!\"}\n");
  EXPECT_THROW(preprocess_data(config), UserError);
  EXPECT_EQ(IndexedDataset(path("keep_text_document")).sequence(0), bytes("one"));
  config.overwrite = true;
  preprocess_data(config);
  EXPECT_EQ(IndexedDataset(path("keep_text_document")).sequence(0), bytes("two!"));
}

TEST_F(PreprocessTest, ReportsProgress) {
  std::string lines;
  for (int i = 0; i < 25; ++i) lines += "{\"text\": \"doc " + std::to_string(i) + "\"}\n";
  PreprocessConfig config;
  config.input_path = write("many.jsonl", lines);
  config.output_prefix = path("many");
  config.log_interval_documents = 10;
  std::vector<int64_t> reported;
  preprocess_data(config, [&](const PreprocessProgress& progress) {
    reported.push_back(progress.documents);
    EXPECT_GT(progress.tokens, 0);
    EXPECT_LE(progress.input_bytes_read, progress.input_bytes_total);
  });
  EXPECT_EQ(reported, (std::vector<int64_t>{10, 20}));
}

TEST_F(PreprocessTest, WorkersWriteTheSameBytesAsOneThread) {
  // More documents than one batch holds, of varied lengths, so that several batches are split over workers.
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "document " + std::to_string(i) + std::string(i % 37, 'x') + "\n";
  PreprocessConfig config;
  config.input_path = write("lines.txt", text);
  config.text_document_mode = TextDocumentMode::line;
  config.append_eod = true;
  const auto read = [](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  config.output_prefix = path("one");
  const auto one = preprocess_data(config).outputs.at(0).path_prefix;
  config.output_prefix = path("four");
  config.workers = 4;
  const auto four = preprocess_data(config).outputs.at(0).path_prefix;
  EXPECT_EQ(IndexedDataset(four).num_documents(), 20000);
  EXPECT_EQ(read(four + ".bin"), read(one + ".bin"));
  EXPECT_EQ(read(four + ".idx"), read(one + ".idx"));
  config.workers = 0;
  EXPECT_THROW(preprocess_data(config), UserError);
}

TEST(JsonLine, ParsesAndRejects) {
  const JsonLine line(
      R"( {"a": [1, -2, 3], "s": "x\"\\\/\b\f\n\r\t\ud83d\ude00", "n": null, "o": {"k": [true, false]}, "f": 1.5e3} )");
  EXPECT_EQ(line.integer_array_field("a"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(line.string_field("s"), "x\"\\/\b\f\n\r\t\xF0\x9F\x98\x80");
  EXPECT_TRUE(line.has("o"));
  EXPECT_THROW(line.string_field("a"), JsonLineError);
  EXPECT_THROW(line.string_field("missing"), JsonLineError);
  EXPECT_THROW(JsonLine(R"({"a": [1.5]})").integer_array_field("a"), JsonLineError);
  EXPECT_THROW(JsonLine(R"({"a": [18446744073709551615]})").integer_array_field("a"), JsonLineError);
  try {
    JsonLine(R"({"a": 1, "b" 2})");
    FAIL();
  } catch (const JsonLineError& e) {
    EXPECT_NE(std::string(e.what()).find("expected ':' at column 14"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("json.exception"), std::string::npos) << e.what();
  }
  for (const char* bad :
       {"", "[1]", "{", "{\"a\" 1}", "{\"a\": 1,}", "{\"a\": tru}", "{\"a\": \"\\x\"}", "{\"a\": 1} x",
        "{\"a\": \"\\ud800\"}", "{\"a\": 01}", "{\"a\": -}", "{\"a\": 1e999}"}) {
    EXPECT_THROW(JsonLine{bad}, JsonLineError) << bad;
  }
}

TEST(ByteTokenizer, RoundTrips) {
  std::vector<int32_t> tokens;
  ByteTokenizer::tokenize("h\xFFi", tokens);
  EXPECT_EQ(tokens, (std::vector<int32_t>{'h', 255, 'i'}));
  tokens.push_back(ByteTokenizer::kEodToken);
  EXPECT_EQ(ByteTokenizer::detokenize(tokens), "h\xFFi\n<|eod|>\n");
}

}  // namespace
}  // namespace megatune::executor::data
