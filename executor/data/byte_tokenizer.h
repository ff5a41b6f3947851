// ByteTokenizer: megatune's byte-level tokenizer: token = byte value 0..255, EOD = 256, vocabulary 257
// (Megatron pads it to a multiple of 128 * tensor-parallel size at model build time, e.g. 384).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::executor::data {

struct ByteTokenizer {
  static constexpr int32_t kEodToken = 256;
  static constexpr int64_t kVocabSize = 257;
  // UTF-8 (or any) bytes -> tokens, one per byte.
  static void tokenize(std::string_view text, std::vector<int32_t>& tokens);
  // Tokens -> bytes; EOD becomes "\n<|eod|>\n"; ids >= 257 become "<|id|>".
  static std::string detokenize(const std::vector<int32_t>& tokens);
};

}  // namespace megatune::executor::data
