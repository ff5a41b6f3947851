// make_tokenizer: Megatron's --tokenizer-type names to tokenizers, and the byte and SentencePiece ones.
#include "executor/data/tokenizer.h"

#include "base/user_error.h"
#include "executor/data/bpe_tokenizer.h"
#include "executor/data/byte_tokenizer.h"
#include "executor/data/sentencepiece_tokenizer.h"

namespace megatune::executor::data {
namespace {

class BytesTokenizer : public TextTokenizer {
 public:
  void tokenize(std::string_view text, std::vector<std::int32_t>& ids) const override {
    ByteTokenizer::tokenize(text, ids);
  }
  std::int64_t vocab_size() const override { return ByteTokenizer::kVocabSize; }
  std::int32_t eod_id() const override { return ByteTokenizer::kEodToken; }
};

}  // namespace

std::unique_ptr<TextTokenizer> make_tokenizer(const TokenizerFiles& files) {
  if (files.type == "byte") return std::make_unique<BytesTokenizer>();
  if (files.type == "GPT2BPETokenizer")
    return std::make_unique<ByteLevelBpeTokenizer>(gpt2_bpe_spec(files.vocab_file, files.merge_file));
  if (files.type == "HuggingFaceTokenizer")
    return std::make_unique<ByteLevelBpeTokenizer>(hugging_face_spec(files.tokenizer_model));
  if (files.type == "TikTokenizer") return std::make_unique<ByteLevelBpeTokenizer>(tiktoken_spec(files));
  if (files.type == "SentencePieceTokenizer") return make_sentencepiece_tokenizer(files.tokenizer_model);
  if (files.type == "Llama2Tokenizer") return make_llama2_tokenizer(files.tokenizer_model);
  throw UserError("--tokenizer-type " + files.type +
                  " is not a text tokenizer here; give byte, GPT2BPETokenizer, "
                  "HuggingFaceTokenizer, TikTokenizer, SentencePieceTokenizer or Llama2Tokenizer");
}

}  // namespace megatune::executor::data
