// SentencePieceTokenizer through libsentencepiece's SentencePieceProcessor (EncodeAsIds is thread-safe).
#include "executor/data/sentencepiece_tokenizer.h"

#include <utility>
#include <vector>

#include "base/input_file.h"
#include "base/user_error.h"

#ifdef MEGATUNE_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace megatune::executor::data {

#ifdef MEGATUNE_HAVE_SENTENCEPIECE
namespace {

// Megatron's _SentencePieceTokenizer adds <CLS> <SEP> <EOD> <MASK> and the pad, bos and eos pieces as
// special tokens (new ids after the model's when the model lacks them); EOD is <EOD>'s id, and the special
// tokens are split out of the text before the model encodes the rest.
class SentencePieceTokenizer : public TextTokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    require_regular_file(path, "--tokenizer-model");
    const auto status = processor_.Load(path);
    if (!status.ok())  // its message names the library's sources: not shown
      throw UserError("--tokenizer-model " + path +
                      " is not a SentencePiece model; give the .model file spm_train wrote");
    vocab_size_ = processor_.GetPieceSize();
    const auto piece_or = [&](int id, const char* fallback) {
      return id >= 0 && id < processor_.GetPieceSize() ? processor_.IdToPiece(id) : std::string(fallback);
    };
    for (const std::string& token :
         {std::string("<CLS>"), std::string("<SEP>"), std::string("<EOD>"), std::string("<MASK>"),
          piece_or(processor_.pad_id(), "<PAD>"), piece_or(processor_.bos_id(), "<BOS>"),
          piece_or(processor_.eos_id(), "<EOS>")})
      add_special(token);
    eod_id_ = special_.at(2).second;
  }
  void tokenize(std::string_view text, std::vector<std::int32_t>& ids) const override {
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t best = std::string_view::npos;
      const std::pair<std::string, std::int32_t>* found = nullptr;
      for (const auto& special : special_) {
        const std::size_t at = text.find(special.first, start);
        if (at < best) {
          best = at;
          found = &special;
        }
      }
      encode(text.substr(start, best == std::string_view::npos ? std::string_view::npos : best - start), ids);
      if (found == nullptr) break;
      ids.push_back(found->second);
      start = best + found->first.size();
    }
  }
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::int32_t eod_id() const override { return eod_id_; }

 private:
  void add_special(const std::string& token) {
    for (const auto& existing : special_)
      if (existing.first == token) return;
    const int id = processor_.PieceToId(token);
    const bool in_model = id != processor_.unk_id() || token == processor_.IdToPiece(processor_.unk_id());
    special_.emplace_back(token, in_model ? id : static_cast<std::int32_t>(vocab_size_++));
  }
  void encode(std::string_view text, std::vector<std::int32_t>& ids) const {
    if (text.empty()) return;
    std::vector<int> pieces;
    processor_.Encode(text, &pieces).IgnoreError();
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  }
  sentencepiece::SentencePieceProcessor processor_;
  std::vector<std::pair<std::string, std::int32_t>> special_;  // in Megatron's order; [2] is <EOD>
  std::int64_t vocab_size_ = 0;
  std::int32_t eod_id_ = -1;
};

// Megatron's _Llama2Tokenizer: the model's own pieces only (vocabulary = its piece count), EOD = its eos id,
// and a document tokenized with the bos id in front (tokenize(s, bos=True, eos=False)).
class Llama2Tokenizer : public TextTokenizer {
 public:
  explicit Llama2Tokenizer(const std::string& path) {
    require_regular_file(path, "--tokenizer-model");
    if (!processor_.Load(path).ok())
      throw UserError("--tokenizer-model " + path +
                      " is not a SentencePiece model; give Llama 2's tokenizer.model");
    if (processor_.eos_id() < 0)
      throw UserError("--tokenizer-model " + path +
                      " has no end-of-sentence piece, which Llama2Tokenizer takes as EOD; use "
                      "SentencePieceTokenizer");
  }
  void tokenize(std::string_view text, std::vector<std::int32_t>& ids) const override {
    if (processor_.bos_id() >= 0) ids.push_back(processor_.bos_id());
    std::vector<int> pieces;
    processor_.Encode(text, &pieces).IgnoreError();
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  }
  std::int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::int32_t eod_id() const override { return processor_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

bool sentencepiece_available() { return true; }

std::unique_ptr<TextTokenizer> make_llama2_tokenizer(const std::string& model_file) {
  if (model_file.empty())
    throw UserError("--tokenizer-type Llama2Tokenizer needs --tokenizer-model (Llama 2's tokenizer.model)");
  return std::make_unique<Llama2Tokenizer>(model_file);
}

std::unique_ptr<TextTokenizer> make_sentencepiece_tokenizer(const std::string& model_file) {
  if (model_file.empty())
    throw UserError(
        "--tokenizer-type SentencePieceTokenizer needs --tokenizer-model (a SentencePiece .model)");
  return std::make_unique<SentencePieceTokenizer>(model_file);
}
#else
bool sentencepiece_available() { return false; }

std::unique_ptr<TextTokenizer> make_llama2_tokenizer(const std::string&) {
  throw UserError(
      "--tokenizer-type Llama2Tokenizer: this megatune was built without SentencePiece; install "
      "libsentencepiece-dev and rebuild");
}

std::unique_ptr<TextTokenizer> make_sentencepiece_tokenizer(const std::string&) {
  throw UserError(
      "--tokenizer-type SentencePieceTokenizer: this megatune was built without SentencePiece; install "
      "libsentencepiece-dev and rebuild");
}
#endif

}  // namespace megatune::executor::data
