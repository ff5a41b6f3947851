// ByteLevelBpeTokenizer: pre-tokenizer regex + byte-level BPE, with a tokenizer's added (special) tokens
// matched literally in the text first and the ids a template puts around every document (a tokenizer.json
// post-processor's BOS). GPT2BPETokenizer, HuggingFaceTokenizer and TikTokenizer are instances of it.
#pragma once
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "executor/data/byte_pair_encoder.h"
#include "executor/data/pretokenizer.h"
#include "executor/data/tokenizer.h"

namespace megatune::executor::data {

struct ByteLevelBpeSpec {
  BytePairEncoder encoder;
  PreTokenizerPattern pattern = PreTokenizerPattern::kGpt2;
  std::vector<std::pair<std::string, std::int32_t>> added_tokens;  // text -> id, split out before BPE
  std::vector<std::int32_t> prefix_ids, suffix_ids;  // around every document (template post-processing)
  bool add_prefix_space = false;                     // a space before text that does not start with one
  std::int64_t vocab_size = 0;
  std::int32_t eod_id = -1;
};

class ByteLevelBpeTokenizer : public TextTokenizer {
 public:
  explicit ByteLevelBpeTokenizer(ByteLevelBpeSpec spec);
  void tokenize(std::string_view text, std::vector<std::int32_t>& ids) const override;
  std::int64_t vocab_size() const override { return spec_.vocab_size; }
  std::int32_t eod_id() const override { return spec_.eod_id; }

 private:
  void tokenize_plain(std::string_view text, std::vector<std::int32_t>& ids) const;
  ByteLevelBpeSpec spec_;
  std::uint64_t instance_;
  bool added_first_byte_[256] =
      {};  // bytes an added token starts with  // keys this tokenizer's entries of the per-thread piece cache
};

// GPT-2's byte-to-unicode table (bytes_to_unicode in GPT-2's encoder.py): the printable character that
// stands for each byte in vocab.json / merges.txt / tokenizer.json. Returns false for text holding a
// character that stands for no byte.
bool byte_level_to_bytes(std::string_view byte_level_text, std::string& bytes);

// The ids of a vocabulary file's tokens as written (vocab.json, tokenizer.json's model.vocab, tiktoken
// ranks): two tokens with one id would encode as one, so the second is a UserError naming `where` (the flag
// and file), both tokens and the id.
class VocabularyIds {
 public:
  explicit VocabularyIds(std::string where) : where_(std::move(where)) {}
  void add(const std::string& token, std::int32_t id);

 private:
  std::string where_;
  std::unordered_map<std::int32_t, std::string> token_of_id_;
};

// Builders of the Megatron tokenizer types (UserErrors name the flag and file).
ByteLevelBpeSpec gpt2_bpe_spec(const std::string& vocab_file, const std::string& merge_file);
ByteLevelBpeSpec hugging_face_spec(const std::string& tokenizer_json);
ByteLevelBpeSpec tiktoken_spec(const TokenizerFiles& files);

}  // namespace megatune::executor::data
