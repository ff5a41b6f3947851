// `megatune train` takes Megatron's tokenizer flags: the vocabulary size and the end-of-document id come
// from the tokenizer (here a TikTokenizer over the 256 single-byte ranks, 1000 special ids first), as in
// Megatron; a --vocab-size below the tokenizer's is one line.
#include <gtest/gtest.h>

#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

std::string base64_of_byte(unsigned char byte) {
  static const char* digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out += digits[byte >> 2];
  out += digits[(byte & 3) << 4];
  return out + "==";
}

std::string write_byte_ranks(const TempDir& dir) {
  std::string ranks;
  for (int b = 0; b < 256; ++b)
    ranks += base64_of_byte(static_cast<unsigned char>(b)) + " " + std::to_string(b) + "\n";
  write_text(dir / "bytes.tiktoken", ranks);
  return dir / "bytes.tiktoken";
}

TEST(CliTrainTokenizer, VocabularyAndEndOfDocumentComeFromTheTokenizerFlags) {
  const TempDir dir;
  const std::string ranks = write_byte_ranks(dir);
  std::string text;
  for (int i = 0; i < 120; ++i) text += "line " + std::to_string(i) + " of a small corpus\n\n";
  write_text(dir / "corpus.txt", text);
  const std::vector<std::string> tokenizer = {"--tokenizer-type", "TikTokenizer", "--tokenizer-model", ranks};
  std::vector<std::string> preprocess = {
      "data", "preprocess", "--input", dir / "corpus.txt", "--output-prefix", dir / "corpus", "--append-eod"};
  preprocess.insert(preprocess.end(), tokenizer.begin(), tokenizer.end());
  const CliResult p = run_megatune(preprocess, 60);
  ASSERT_EQ(p.exit_code, 0) << p.err;

  std::vector<std::string> train = {"train",
                                    "--model",
                                    "tiny",
                                    "--device",
                                    "cpu",
                                    "--data-path",
                                    dir / "corpus_text_document",
                                    "--split",
                                    "1,0,0",
                                    "--train-iters",
                                    "3",
                                    "--gbs",
                                    "4",
                                    "--mbs",
                                    "2",
                                    "--eod-mask-loss"};
  train.insert(train.end(), tokenizer.begin(), tokenizer.end());
  std::vector<std::string> traced = train;
  traced.insert(traced.end(), {"--trace-dir", dir / "trace"});
  const CliResult ok = run_megatune(traced, 120);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("iteration        3/       3"), std::string::npos) << ok.out;
  // The trace records the vocabulary the tokenizer chose: compare rebuilds the same model from it.
  const CliResult compare = run_megatune({"compare", "--run", dir / "trace", "--top", "0"}, 60);
  EXPECT_EQ(compare.exit_code, 0) << compare.err;

  // The tiny preset's own vocabulary (the byte tokenizer's) is smaller than the TikTokenizer's 1256 ids.
  train.insert(train.end(), {"--vocab-size", "384"});
  const CliResult small = run_megatune(train, 60);
  EXPECT_NE(small.exit_code, 0);
  EXPECT_EQ(small.error_lines(), 1) << small.err;
  EXPECT_NE(small.err.find("--vocab-size 384 is smaller than the TikTokenizer vocabulary (1256 ids)"),
            std::string::npos)
      << small.err;
}

}  // namespace
}  // namespace megatune::tests
