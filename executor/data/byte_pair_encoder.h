// BytePairEncoder: byte-level BPE of one pre-tokenized piece: the piece's bytes start as single-byte tokens
// and the adjacent pair of lowest merge rank is merged (leftmost first) until no pair has a rank. Built
// from a vocabulary plus merges (GPT-2's vocab.json + merges.txt, a tokenizer.json) or from tiktoken's
// ranks, where a token's rank is its merge rank and its id.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace megatune::executor::data {

class BytePairEncoder {
 public:
  // `vocabulary`: token bytes -> id; `merges`: (left bytes, right bytes) in rank order (rank = index).
  // Every single byte must be a token. Throws std::invalid_argument (naming the token) on a merge whose
  // parts or result are not in the vocabulary.
  static BytePairEncoder from_merges(std::unordered_map<std::string, std::int32_t> vocabulary,
                                     const std::vector<std::pair<std::string, std::string>>& merges);
  // tiktoken: token bytes -> rank; id = rank + id_offset. A pair merges when its concatenation has a rank.
  static BytePairEncoder from_ranks(const std::unordered_map<std::string, std::int32_t>& ranks,
                                    std::int32_t id_offset);

  // Appends the ids of `piece`. whole_piece_first: a piece that is itself a token is that one token
  // (tiktoken, and tokenizer.json's ignore_merges).
  void encode(std::string_view piece, std::vector<std::int32_t>& ids) const;
  void set_whole_piece_first(bool on) { whole_piece_first_ = on; }
  // The id of `bytes`, or -1.
  std::int32_t find(std::string_view bytes) const;
  std::int32_t max_id() const { return max_id_; }

 private:
  struct Merge {
    std::int32_t rank, id;
  };
  static std::uint64_t key(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) |
           static_cast<std::uint32_t>(right);
  }
  void merge_parts(std::vector<std::int32_t>& parts) const;
  // Looks strings up by std::string_view without building a std::string per piece or split.
  struct BytesHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view bytes) const { return std::hash<std::string_view>{}(bytes); }
  };
  using TokenTable = std::unordered_map<std::string, std::int32_t, BytesHash, std::equal_to<>>;
  template <typename Table>
  static void require_single_bytes(const Table& tokens, std::int32_t* byte_ids, std::int32_t offset);
  TokenTable tokens_;                                // bytes -> id
  std::unordered_map<std::uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  std::int32_t byte_ids_[256] = {};
  std::int32_t max_id_ = -1;
  bool whole_piece_first_ = false;
};

}  // namespace megatune::executor::data
