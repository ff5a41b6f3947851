// add_tokenizer_flags: the flag set of executor::data::TokenizerFiles.
#include "tools/tokenizer_flags.h"

#include <string>
#include <vector>

#include "tools/input_checks.h"

namespace megatune::tools {

void add_tokenizer_flags(CLI::App& command, executor::data::TokenizerFiles& t, bool with_ids) {
  std::vector<std::string> types = {"byte", "GPT2BPETokenizer", "HuggingFaceTokenizer", "TikTokenizer",
                                    "SentencePieceTokenizer", "Llama2Tokenizer"};
  if (with_ids) types.insert(types.begin() + 1, "ids");
  if (!with_ids) types.push_back("NullTokenizer");  // train: ids 0..--vocab-size-1 and EOD --vocab-size
  command
      .add_option(
          "--tokenizer-type", t.type,
          std::string("byte (default): one token per byte, EOD 256, vocab 257 (Megatron pads it to a "
                      "multiple of 128 x TP: 384 at TP 1); ") +
              (with_ids ? "ids: the key holds token id arrays; " : "") +
              "Megatron's GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, SentencePieceTokenizer, Llama2Tokenizer" +
              (with_ids ? "" : ", NullTokenizer (with --vocab-size N: ids below N, EOD N, vocabulary N + 1)"))
      ->check(CLI::IsMember(types));
  command.add_option("--vocab-file", t.vocab_file, "GPT2BPETokenizer: GPT-2's vocab.json");
  command.add_option("--merge-file", t.merge_file, "GPT2BPETokenizer: GPT-2's merges.txt");
  command.add_option("--tokenizer-model", t.tokenizer_model,
                     "HuggingFaceTokenizer: tokenizer.json; TikTokenizer: tiktoken ranks (.tiktoken "
                     "lines or Megatron's .json); SentencePieceTokenizer: the .model file");
  command
      .add_option("--tiktoken-pattern", t.tiktoken_pattern,
                  "TikTokenizer pre-tokenizer: v2 (default) or v1 (Megatron's), cl100k (cl100k_base's, "
                  "Llama 3's)")
      ->default_val("v2");
  command
      .add_option("--tiktoken-num-special-tokens", t.tiktoken_num_special_tokens,
                  "TikTokenizer: ids below it are special tokens, a rank r is id r + it (default 1000)")
      ->check(integer_at_least(3));
  command.add_option("--tiktoken-special-tokens", t.tiktoken_special_tokens,
                     "TikTokenizer: the special tokens in id order (default <unk> <s> </s>)");
}

}  // namespace megatune::tools
