// The hand-coded pre-tokenizers split as their regular expressions do (expected pieces as Python's `regex`
// module's findall gives them), the Unicode table classifies letters, marks and numbers of several scripts,
// byte-level BPE merges by rank, and malformed tokenizer files are refused with one line naming the flag.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "base/user_error.h"
#include "executor/data/bpe_tokenizer.h"
#include "executor/data/pretokenizer.h"
#include "executor/data/tokenizer.h"
#include "executor/data/unicode_category.h"

namespace megatune::executor::data {
namespace {

std::vector<std::string> pieces(std::string_view text, PreTokenizerPattern pattern) {
  std::vector<std::string> out;
  for (const std::string_view piece : pretokenize(text, pattern)) out.emplace_back(piece);
  return out;
}

using Pieces = std::vector<std::string>;
constexpr std::string_view kText = "I'LL don't  x\n\n  y\t\"quoted\"!! 12345 ab";

TEST(PreTokenizer, Gpt2SplitsAsItsRegex) {
  EXPECT_EQ(pieces(kText, PreTokenizerPattern::kGpt2),
            (Pieces{"I", "'", "LL", " don", "'t", " ", " x", "\n\n ", " y", "\t", "\"", "quoted", "\"!!",
                    " 12345", " ab"}));
  EXPECT_EQ(pieces("Hello   world  ", PreTokenizerPattern::kGpt2), (Pieces{"Hello", "  ", " world", "  "}));
  EXPECT_EQ(pieces("naïve 東京 ١٢", PreTokenizerPattern::kGpt2), (Pieces{"naïve", " 東京", " ١٢"}));
}

TEST(PreTokenizer, Cl100kSplitsAsItsRegex) {
  EXPECT_EQ(pieces(kText, PreTokenizerPattern::kCl100k),
            (Pieces{"I", "'LL", " don", "'t", " ", " x", "\n\n", " ", " y", "\t", "\"quoted", "\"!!", " ",
                    "123", "45", " ab"}));
  EXPECT_EQ(pieces("a ſ's\r\n\r\n b", PreTokenizerPattern::kCl100k),
            (Pieces{"a", " ſ", "'s", "\r\n\r\n", " b"}));
  EXPECT_EQ(pieces("x'ſt x'S", PreTokenizerPattern::kCl100k), (Pieces{"x", "'ſ", "t", " x", "'S"}));
}

TEST(PreTokenizer, MegatronV1SplitsAsItsRegex) {
  EXPECT_EQ(pieces(kText, PreTokenizerPattern::kTiktokenV1),
            (Pieces{"I", "'LL", " don", "'t", " ", " x", "\n\n", " ", " y", "\t", "\"quoted", "\"!!", " ",
                    "1", "2", "3", "4", "5", " ab"}));
}

TEST(PreTokenizer, MegatronV2SplitsAsItsRegex) {
  // Words split at case changes; marks belong to both cased classes; '/' and newlines end punctuation.
  EXPECT_EQ(pieces("HelloWorld ABCdef XML naïve \u0301e\u0301x a/b//\n 12 ÀÉÎõ 東京",
                   PreTokenizerPattern::kTiktokenV2),
            (Pieces{"Hello", "World", " ABCdef", " XML", " naïve", " \u0301e\u0301x", " a", "/b", "//\n", " ",
                    "1", "2", " ÀÉÎõ", " 東京"}));
}

TEST(PreTokenizer, PiecesCoverTheTextAndPatternsAreRecognized) {
  const std::string invalid = "a\xff\xc3(b\xe2\x82";  // invalid and truncated UTF-8
  std::string joined;
  for (const std::string& p : pieces(invalid, PreTokenizerPattern::kCl100k)) joined += p;
  EXPECT_EQ(joined, invalid);
  for (PreTokenizerPattern p : {PreTokenizerPattern::kGpt2, PreTokenizerPattern::kCl100k,
                                PreTokenizerPattern::kTiktokenV1, PreTokenizerPattern::kTiktokenV2})
    EXPECT_EQ(pretokenizer_pattern_of(pretokenizer_regex(p)), p);
  EXPECT_FALSE(pretokenizer_pattern_of("\\w+"));
}

TEST(UnicodeCategories, LettersMarksNumbersAndSpaces) {
  EXPECT_EQ(unicode_category(U'A'), UnicodeCategory::kLu);
  EXPECT_EQ(unicode_category(U'ß'), UnicodeCategory::kLl);
  EXPECT_EQ(unicode_category(U'東'), UnicodeCategory::kLo);
  EXPECT_EQ(unicode_category(U'\u0301'), UnicodeCategory::kMn);  // combining acute accent
  EXPECT_EQ(unicode_category(U'٣'), UnicodeCategory::kNd);
  EXPECT_EQ(unicode_category(U'Ⅻ'), UnicodeCategory::kNl);
  EXPECT_EQ(unicode_category(U'½'), UnicodeCategory::kNo);
  EXPECT_EQ(unicode_category(U'!'), UnicodeCategory::kOther);
  EXPECT_EQ(unicode_category(U'😀'), UnicodeCategory::kOther);
  EXPECT_TRUE(is_white_space(U'\u3000'));
  EXPECT_TRUE(is_white_space(U'\u0085'));
  EXPECT_FALSE(is_white_space(U'\u200B'));  // zero-width space is not White_Space
}

TEST(BytePairEncoder, MergesTheLowestRankFirst) {
  std::unordered_map<std::string, std::int32_t> vocab;
  for (int b = 0; b < 256; ++b) vocab[std::string(1, static_cast<char>(b))] = b;
  vocab["ab"] = 256;
  vocab["bc"] = 257;
  vocab["abc"] = 258;
  // "bc" ranks before "ab": "abc" -> a + bc, and (a, bc) has no merge.
  const BytePairEncoder encoder = BytePairEncoder::from_merges(vocab, {{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  std::vector<std::int32_t> ids;
  encoder.encode("abc", ids);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{'a', 257}));
  ids.clear();
  encoder.encode("abab", ids);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{256, 256}));
  EXPECT_THROW(BytePairEncoder::from_merges(vocab, {{"x", "y"}}), std::invalid_argument);  // "xy" unknown
}

class BadTokenizerFiles : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("megatune_bad_tokenizer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  }
  void TearDown() override {
    std::filesystem::remove_all(std::filesystem::temp_directory_path() /
                                ("megatune_bad_tokenizer_" + std::to_string(::getpid())));
  }
  static std::string error_of(const TokenizerFiles& files) {
    try {
      make_tokenizer(files);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
};

TEST_F(BadTokenizerFiles, AreOneLineNamingTheFlag) {
  TokenizerFiles gpt2{.type = "GPT2BPETokenizer"};
  EXPECT_NE(error_of(gpt2).find("needs --vocab-file"), std::string::npos);
  gpt2.vocab_file = write("vocab.json", "{\"a\": ");
  gpt2.merge_file = write("merges.txt", "a b\n");
  EXPECT_NE(error_of(gpt2).find("--vocab-file " + gpt2.vocab_file + " is not valid JSON"), std::string::npos);
  gpt2.vocab_file = write("vocab2.json", "{\"a\": 0}");
  EXPECT_NE(error_of(gpt2).find("lacks the single byte"), std::string::npos);

  TokenizerFiles hf{.type = "HuggingFaceTokenizer",
                    .tokenizer_model = write("t.json", "{\"model\": {\"type\": \"WordPiece\"}}")};
  EXPECT_NE(
      error_of(hf).find("--tokenizer-model " + hf.tokenizer_model + ": model type WordPiece is not BPE"),
      std::string::npos);
  hf.tokenizer_model = write("dir-missing.json", "[1, 2]");
  EXPECT_NE(error_of(hf).find("--tokenizer-model"), std::string::npos);

  TokenizerFiles tiktoken{.type = "TikTokenizer",
                          .tokenizer_model = write("r.tiktoken", "IQ== 0\nnot a line\n")};
  EXPECT_NE(error_of(tiktoken).find(tiktoken.tokenizer_model + ":2: not a 'BASE64 RANK' line"),
            std::string::npos);
  tiktoken.tiktoken_pattern = "v3";
  EXPECT_NE(error_of(tiktoken).find("--tiktoken-pattern v3 is not available"), std::string::npos);

  TokenizerFiles sp{.type = "SentencePieceTokenizer", .tokenizer_model = write("m.model", "not a model")};
  EXPECT_NE(error_of(sp).find("SentencePiece"), std::string::npos);
  EXPECT_EQ(error_of(sp).find(".cc"), std::string::npos);  // no library source locations
  hf.tokenizer_model = write("vocab-like.json", "{\"model\": 3}");
  EXPECT_NE(error_of(hf).find("\"model\" is not an object"), std::string::npos);
  for (const auto& files : {gpt2, hf, tiktoken, sp}) EXPECT_EQ(error_of(files).find('\n'), std::string::npos);
}

// Two tokens with one id would encode as one: each reader refuses it, naming the file, both tokens and the
// id.
TEST_F(BadTokenizerFiles, TwoTokensSharingAnIdAreRefused) {
  TokenizerFiles gpt2{.type = "GPT2BPETokenizer",
                      .vocab_file = write("shared.json", "{\"a\": 0, \"b\": 1, \"c\": 1}"),
                      .merge_file = write("merges.txt", "a b\n")};
  const std::string message = error_of(gpt2);
  EXPECT_NE(message.find("--vocab-file " + gpt2.vocab_file + ": tokens 'b' and 'c' share id 1"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos);

  TokenizerFiles hf{.type = "HuggingFaceTokenizer",
                    .tokenizer_model = write("shared-tokenizer.json",
                                             "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"x\": 7, "
                                             "\"y\": 7}, \"merges\": []}}")};
  EXPECT_NE(error_of(hf).find("--tokenizer-model " + hf.tokenizer_model + ": tokens 'x' and 'y' share id 7"),
            std::string::npos)
      << error_of(hf);

  TokenizerFiles tiktoken{.type = "TikTokenizer",
                          .tokenizer_model = write("shared.tiktoken", "YQ== 3\nYg== 3\n")};
  EXPECT_NE(error_of(tiktoken).find("tokens 'YQ==' and 'Yg==' share id 3"), std::string::npos)
      << error_of(tiktoken);
}

}  // namespace
}  // namespace megatune::executor::data
