// BytePairEncoder: merge tables from vocabularies or ranks, and the merge loop of one piece.
#include "executor/data/byte_pair_encoder.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace megatune::executor::data {

template <typename Table>
void BytePairEncoder::require_single_bytes(const Table& tokens, std::int32_t* byte_ids, std::int32_t offset) {
  for (int b = 0; b < 256; ++b) {
    const auto it = tokens.find(std::string(1, static_cast<char>(b)));
    if (it == tokens.end())
      throw std::invalid_argument("the vocabulary lacks the single byte " + std::to_string(b) +
                                  " (not a byte-level BPE vocabulary)");
    byte_ids[b] = it->second + offset;
  }
}

BytePairEncoder BytePairEncoder::from_merges(std::unordered_map<std::string, std::int32_t> vocabulary,
                                             const std::vector<std::pair<std::string, std::string>>& merges) {
  BytePairEncoder e;
  e.tokens_.reserve(vocabulary.size());
  for (auto& [bytes, id] : vocabulary) e.tokens_.emplace(std::move(bytes), id);
  require_single_bytes(e.tokens_, e.byte_ids_, 0);
  for (const auto& [bytes, id] : e.tokens_) e.max_id_ = std::max(e.max_id_, id);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::int32_t l = e.find(left), r = e.find(right), merged = e.find(left + right);
    if (l < 0 || r < 0 || merged < 0)
      throw std::invalid_argument("merge " + std::to_string(rank + 1) + " ('" + left + "' '" + right +
                                  "') uses a token that is not in the vocabulary");
    e.merges_.emplace(key(l, r), Merge{static_cast<std::int32_t>(rank), merged});  // the first rank wins
  }
  return e;
}

BytePairEncoder BytePairEncoder::from_ranks(const std::unordered_map<std::string, std::int32_t>& ranks,
                                            std::int32_t id_offset) {
  BytePairEncoder e;
  e.tokens_.reserve(ranks.size());
  for (const auto& [bytes, rank] : ranks) {
    e.tokens_.emplace(bytes, rank + id_offset);
    e.max_id_ = std::max(e.max_id_, rank + id_offset);
  }
  require_single_bytes(ranks, e.byte_ids_, id_offset);
  // Every split of a token into two tokens is a merge of the token's rank (the split's halves are looked up
  // as views: cl100k's 100k tokens make about 700k lookups).
  e.merges_.reserve(2 * ranks.size());
  for (const auto& [bytes, id] : e.tokens_) {
    const std::string_view whole(bytes);
    for (std::size_t cut = 1; cut < whole.size(); ++cut) {
      const auto left = e.tokens_.find(whole.substr(0, cut)), right = e.tokens_.find(whole.substr(cut));
      if (left == e.tokens_.end() || right == e.tokens_.end()) continue;
      e.merges_.emplace(key(left->second, right->second), Merge{id - id_offset, id});
    }
  }
  e.whole_piece_first_ = true;
  return e;
}

std::int32_t BytePairEncoder::find(std::string_view bytes) const {
  const auto it = tokens_.find(bytes);
  return it == tokens_.end() ? -1 : it->second;
}

void BytePairEncoder::merge_parts(std::vector<std::int32_t>& parts) const {
  constexpr std::int32_t kNone = std::numeric_limits<std::int32_t>::max();
  while (parts.size() > 1) {
    std::int32_t best_rank = kNone, best_id = 0;
    std::size_t best = 0;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto it = merges_.find(key(parts[i], parts[i + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_id = it->second.id;
        best = i;
      }
    }
    if (best_rank == kNone) return;
    parts[best] = best_id;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
}

void BytePairEncoder::encode(std::string_view piece, std::vector<std::int32_t>& ids) const {
  if (piece.empty()) return;
  if (whole_piece_first_ || piece.size() == 1) {
    const std::int32_t whole = find(piece);
    if (whole >= 0) {
      ids.push_back(whole);
      return;
    }
  }
  std::vector<std::int32_t> parts(piece.size());
  for (std::size_t i = 0; i < piece.size(); ++i) parts[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  merge_parts(parts);
  ids.insert(ids.end(), parts.begin(), parts.end());
}

}  // namespace megatune::executor::data
