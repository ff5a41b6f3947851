// TextTokenizer: what `megatune data preprocess` tokenizes documents with, under Megatron's
// --tokenizer-type names: GPT2BPETokenizer, HuggingFaceTokenizer, TikTokenizer, SentencePieceTokenizer, and
// megatune's byte tokenizer. make_tokenizer reads the tokenizer's files.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::executor::data {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // Appends the ids of `text` (one document) to `ids`. Thread-safe: workers share one tokenizer.
  virtual void tokenize(std::string_view text, std::vector<std::int32_t>& ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;  // ids lie below it
  virtual std::int32_t eod_id() const = 0;      // what --append-eod appends (Megatron's tokenizer.eod)
};

struct TokenizerFiles {
  std::string type = "byte";    // --tokenizer-type
  std::string vocab_file;       // --vocab-file (GPT2BPETokenizer: vocab.json)
  std::string merge_file;       // --merge-file (GPT2BPETokenizer: merges.txt)
  std::string tokenizer_model;  // --tokenizer-model (tokenizer.json, tiktoken ranks, SentencePiece model)
  std::string tiktoken_pattern = "v1";               // --tiktoken-pattern (Megatron's v1, or cl100k)
  int tiktoken_num_special_tokens = 1000;            // --tiktoken-num-special-tokens
  std::vector<std::string> tiktoken_special_tokens;  // --tiktoken-special-tokens (default <unk> <s> </s>)
};

// Reads the files the type needs; UserError naming the flag and file for a missing, unreadable or
// malformed file, a flag the type needs and lacks, or a type this build does not have.
std::unique_ptr<TextTokenizer> make_tokenizer(const TokenizerFiles& files);

}  // namespace megatune::executor::data
