// Pre-tokenizers of byte-level BPE tokenizers: the regular expressions of GPT-2, of cl100k_base (also Llama
// 3's) and of Megatron's TikTokenizer "v1", hand-coded (std::regex has neither \p{L} / \p{N} nor the
// lookahead they use). Each splits UTF-8 text into the pieces that regex's successive matches give.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::executor::data {

enum class PreTokenizerPattern {
  kGpt2,       // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kCl100k,     // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
               // \s*[\r\n]+|\s+(?!\S)|\s+
  kTiktokenV1  // [^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
};

// The regular expression text of a pattern, as the tokenizer files write it.
std::string pretokenizer_regex(PreTokenizerPattern pattern);
// The pattern whose regular expression is `regex` exactly; none for any other expression.
std::optional<PreTokenizerPattern> pretokenizer_pattern_of(std::string_view regex);

// The pieces of `text` (views into it), in order; together they are the whole text. Bytes that are not
// valid UTF-8 count as one code point each of no letter or number category.
std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizerPattern pattern);

}  // namespace megatune::executor::data
