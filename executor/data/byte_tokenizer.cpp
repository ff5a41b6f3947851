// ByteTokenizer: one token per byte, EOD = 256.
#include "executor/data/byte_tokenizer.h"

namespace megatune::executor::data {

void ByteTokenizer::tokenize(std::string_view text, std::vector<int32_t>& tokens) {
  tokens.reserve(tokens.size() + text.size());
  for (const char c : text) tokens.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
}

std::string ByteTokenizer::detokenize(const std::vector<int32_t>& tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (const int32_t token : tokens) {
    if (token >= 0 && token < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(token)));
    } else if (token == kEodToken) {
      text += "\n<|eod|>\n";
    } else {
      text += "<|" + std::to_string(token) + "|>";
    }
  }
  return text;
}

}  // namespace megatune::executor::data
