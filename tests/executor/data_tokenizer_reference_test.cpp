// Token ids of GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer and SentencePieceTokenizer against the
// reference implementations on one corpus (non-ASCII scripts, digits, whitespace runs, contractions): the
// npm packages gpt-3-encoder and tiktoken and Hugging Face's tokenizers.js (installed into the build tree
// on first use), Debian's spm_train / spm_encode. Also through `preprocess_data` with several workers and
// --append-eod. Skips, saying why, when npm or the SentencePiece tools are unreachable.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "executor/data/indexed_dataset.h"
#include "executor/data/preprocess.h"
#include "executor/data/sentencepiece_tokenizer.h"
#include "executor/data/tokenizer.h"

namespace megatune::executor::data {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::vector<std::int32_t>>;

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> documents = {
      "Hello world! It's 2024; they're here, we've seen I'm sure you'll say he'd agree.",
      "Naïve café résumé — Zürich, São Paulo, Kraków. Ελληνικά: Γειά σου κόσμε. Русский текст.",
      "東京都は日本の首都です。中文：你好，世界！한국어 문장입니다. タイ語: สวัสดีครับ",
      "numbers 1 12 123 1234 12345 3.14159 -42 1,000,000 ٣٤٥ Ⅻ ½",
      "whitespace   runs\t\ttabs  \n\n  newlines\r\n\r\nand trailing   ",
      "CAPS DON'T WE'LL I'D YOU'VE SHE'S Mixed'Case ſ's 'quoted' \"double\" (parens) [brackets] {braces}",
      "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // comment\n    return x;",
      "emoji 😀🎉👍🏽 and symbols ©®™ ∑∫√ ←→ ★☆ \u00e9 e\u0301 combining marks",
      "a",
      "  leading spaces and a URL https://example.com/path?q=1&r=two#frag user@example.org",
  };
  return documents;
}

std::string run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[65536];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) out.append(buffer, n);
  return ::pclose(pipe) == 0 ? out : std::string();
}

class TokenizerReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::path(MEGATUNE_BINARY_DIR) / "tokenizer_references";
    files_ = root_ / "files";
    fs::create_directories(files_);
    corpus_json_ = (root_ / "corpus.json").string();
    std::ofstream(corpus_json_) << nlohmann::json(corpus()).dump();
    const std::string script =
        std::string(MEGATUNE_SOURCE_DIR) + "/tests/executor/reference/tokenizer_reference.js";
    node_ = "node " + script + " " + root_.string() + " ";
    // ctest runs each case as its own process, two at a time: one installs, the others wait for it (two npm
    // installs into one folder remove each other's packages).
    const int lock = ::open((root_ / "install.lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    if (!fs::exists(root_ / "node_modules" / "@huggingface" / "tokenizers")) {
      run("cd " + root_.string() +
          " && npm install --no-audit --no-fund --no-save gpt-3-encoder@1.1.4 tiktoken@1.0.22 "
          "@huggingface/tokenizers@0.2.0 > npm.log 2>&1 && echo ok");
    }
    if (!fs::exists(files_ / "cl100k_base.tiktoken")) run(node_ + "write-files " + files_.string());
    npm_ready_ = fs::exists(files_ / "cl100k_base.tiktoken");
    if (lock >= 0) ::close(lock);  // releases the lock
  }
  void SetUp() override {
    if (!npm_ready_)
      GTEST_SKIP() << "reference npm packages unreachable (node/npm missing or no network; see "
                   << (root_ / "npm.log").string() << ")";
  }
  static Ids reference(const std::string& arguments) {
    return nlohmann::json::parse(run(node_ + arguments)).get<Ids>();
  }
  static void expect_equal(const TextTokenizer& tokenizer, const Ids& expected) {
    ASSERT_EQ(expected.size(), corpus().size());
    for (std::size_t d = 0; d < corpus().size(); ++d) {
      std::vector<std::int32_t> ids;
      tokenizer.tokenize(corpus()[d], ids);
      EXPECT_EQ(ids, expected[d]) << "document " << d << ": " << corpus()[d];
    }
  }
  // The corpus as JSONL through preprocess_data with 3 workers and --append-eod: every document's ids
  // followed by the tokenizer's EOD.
  static void expect_preprocessed(const TokenizerFiles& files, const Ids& expected, std::int32_t eod_id) {
    const fs::path dir = root_ / ("preprocess_" + files.type + "_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    {
      std::ofstream jsonl(dir / "corpus.jsonl");
      for (int copy = 0; copy < 30; ++copy)  // several batches' worth of documents for the workers
        for (const std::string& d : corpus()) jsonl << nlohmann::json({{"text", d}}).dump() << "\n";
    }
    PreprocessConfig config;
    config.input_path = (dir / "corpus.jsonl").string();
    config.output_prefix = (dir / "out").string();
    config.tokenizer = files;
    config.workers = 3;
    config.append_eod = true;
    const auto result = preprocess_data(config);
    const IndexedDataset dataset(result.outputs.at(0).path_prefix);
    ASSERT_EQ(dataset.num_sequences(), static_cast<std::int64_t>(30 * corpus().size()));
    for (std::int64_t s = 0; s < dataset.num_sequences(); ++s) {
      std::vector<std::int32_t> want = expected[static_cast<std::size_t>(s) % corpus().size()];
      want.push_back(eod_id);
      ASSERT_EQ(dataset.sequence(s), want) << "sequence " << s;
    }
    fs::remove_all(dir);
  }
  static inline fs::path root_, files_;
  static inline std::string corpus_json_, node_;
  static inline bool npm_ready_ = false;
};

TEST_F(TokenizerReference, Gpt2BpeEqualsGpt3EncoderAndTiktoken) {
  const nlohmann::json both = nlohmann::json::parse(run(node_ + "gpt2 " + corpus_json_));
  const Ids gpt3_encoder = both.at("gpt_3_encoder").get<Ids>(), tiktoken = both.at("tiktoken").get<Ids>();
  EXPECT_EQ(gpt3_encoder, tiktoken);  // the two references agree
  TokenizerFiles files;
  files.type = "GPT2BPETokenizer";
  files.vocab_file = (files_ / "vocab.json").string();
  files.merge_file = (files_ / "merges.txt").string();
  const auto tokenizer = make_tokenizer(files);
  EXPECT_EQ(tokenizer->vocab_size(), 50257);
  EXPECT_EQ(tokenizer->eod_id(), 50256);
  expect_equal(*tokenizer, tiktoken);
  expect_preprocessed(files, tiktoken, tokenizer->eod_id());
}

TEST_F(TokenizerReference, HuggingFaceTokenizerJsonEqualsTokenizersJs) {
  for (const char* name : {"gpt2.tokenizer.json", "llama3-style.tokenizer.json"}) {
    SCOPED_TRACE(name);
    TokenizerFiles files;
    files.type = "HuggingFaceTokenizer";
    files.tokenizer_model = (files_ / name).string();
    const Ids expected = reference("hf " + files.tokenizer_model + " " + corpus_json_);
    const auto tokenizer = make_tokenizer(files);
    EXPECT_EQ(tokenizer->eod_id(), 50256);
    expect_equal(*tokenizer, expected);
    // Added tokens are split out of the text first.
    std::vector<std::int32_t> ids;
    tokenizer->tokenize("a<|endoftext|>b", ids);
    EXPECT_NE(std::find(ids.begin(), ids.end(), 50256), ids.end());
  }
}

TEST_F(TokenizerReference, TikTokenizerEqualsTiktokenWithMegatronsIdOffset) {
  for (const char* pattern : {"v1", "v2", "cl100k"}) {
    SCOPED_TRACE(pattern);
    Ids expected = reference(std::string("tiktoken ") + corpus_json_ + " " + pattern);
    for (auto& ids : expected)
      for (auto& id : ids) id += 1000;  // Megatron: 1000 special-token ids come first
    TokenizerFiles files;
    files.type = "TikTokenizer";
    files.tokenizer_model = (files_ / "cl100k_base.tiktoken").string();
    files.tiktoken_pattern = pattern;
    const auto tokenizer = make_tokenizer(files);
    EXPECT_EQ(tokenizer->eod_id(), 2);  // </s> of <unk> <s> </s>
    EXPECT_EQ(tokenizer->vocab_size(), 1000 + 100256);
    expect_equal(*tokenizer, expected);
    if (std::string(pattern) == "v1") expect_preprocessed(files, expected, tokenizer->eod_id());
  }
}

TEST(SentencePieceReference, EqualsSpmEncode) {
  if (!sentencepiece_available()) GTEST_SKIP() << "built without libsentencepiece-dev";
  if (run("command -v spm_train && command -v spm_encode").empty())
    GTEST_SKIP() << "spm_train / spm_encode not found (Debian package sentencepiece)";
  const fs::path dir =
      fs::path(MEGATUNE_BINARY_DIR) / ("sentencepiece_reference_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream text(dir / "corpus.txt");
    for (int copy = 0; copy < 20; ++copy)
      for (const std::string& d : corpus())
        if (d.find('\n') == std::string::npos) text << d << "\n";
  }
  const std::string d = dir.string();
  ASSERT_FALSE(run("spm_train --input=" + d + "/corpus.txt --model_prefix=" + d +
                   "/sp --vocab_size=300 --model_type=bpe --character_coverage=1.0 --minloglevel=2 "
                   "> /dev/null 2>&1 && echo ok")
                   .empty());
  const std::string reference =
      run("spm_encode --model=" + d + "/sp.model --output_format=id < " + d + "/corpus.txt");
  TokenizerFiles files;
  files.type = "SentencePieceTokenizer";
  files.tokenizer_model = d + "/sp.model";
  const auto tokenizer = make_tokenizer(files);
  std::ifstream text(dir / "corpus.txt");
  std::istringstream expected_lines(reference);
  std::string line, expected;
  int compared = 0;
  while (std::getline(text, line) && std::getline(expected_lines, expected)) {
    std::vector<std::int32_t> ids;
    tokenizer->tokenize(line, ids);
    std::string ours;
    for (const std::int32_t id : ids) ours += (ours.empty() ? "" : " ") + std::to_string(id);
    EXPECT_EQ(ours, expected) << line;
    ++compared;
  }
  EXPECT_GT(compared, 100);
  // Megatron's special tokens come after the model's 300 pieces: <CLS> <SEP> <EOD> <MASK> <PAD>.
  EXPECT_EQ(tokenizer->eod_id(), 302);
  EXPECT_EQ(tokenizer->vocab_size(), 305);
  // Megatron's Llama2Tokenizer on the same model: its own 300 pieces, EOD = </s> (spm_train's id 2), and
  // each document after <s> (id 1).
  files.type = "Llama2Tokenizer";
  const auto llama2 = make_tokenizer(files);
  EXPECT_EQ(llama2->vocab_size(), 300);
  EXPECT_EQ(llama2->eod_id(), 2);
  std::ifstream again(dir / "corpus.txt");
  std::istringstream expected_again(reference);
  ASSERT_TRUE(std::getline(again, line) && std::getline(expected_again, expected));
  std::vector<std::int32_t> ids;
  llama2->tokenize(line, ids);
  std::string ours;
  for (const std::int32_t id : ids) ours += (ours.empty() ? "" : " ") + std::to_string(id);
  EXPECT_EQ(ours, "1 " + expected);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megatune::executor::data
