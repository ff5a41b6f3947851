// ByteLevelBpeTokenizer: added-token splitting, pre-tokenization, BPE per piece with a per-thread cache.
#include "executor/data/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <unordered_map>

#include "executor/data/utf8.h"

namespace megatune::executor::data {
namespace {

std::atomic<std::uint64_t> next_instance{1};

// Per thread: piece ids keyed by (tokenizer instance, piece bytes); cleared when it grows large.
std::unordered_map<std::string, std::vector<std::int32_t>>& piece_cache() {
  thread_local std::unordered_map<std::string, std::vector<std::int32_t>> cache;
  return cache;
}
constexpr std::size_t kCacheEntries = 1 << 18;
constexpr std::size_t kLongestCachedPiece = 64;

// bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for 256 + n in byte order.
const std::array<char32_t, 256>& byte_to_code_point() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

}  // namespace

bool byte_level_to_bytes(std::string_view text, std::string& bytes) {
  static const std::unordered_map<char32_t, unsigned char> inverse = [] {
    std::unordered_map<char32_t, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_code_point()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  bytes.clear();
  for (std::size_t i = 0, length = 0; i < text.size(); i += length) {
    const auto it = inverse.find(decode_utf8_at(text, i, length));
    if (it == inverse.end()) return false;
    bytes.push_back(static_cast<char>(it->second));
  }
  return true;
}

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(ByteLevelBpeSpec spec)
    : spec_(std::move(spec)), instance_(next_instance++) {
  // Longest first, so that at one position the longest added token wins.
  std::sort(spec_.added_tokens.begin(), spec_.added_tokens.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::erase_if(spec_.added_tokens, [](const auto& token) { return token.first.empty(); });
  for (const auto& [token, id] : spec_.added_tokens)
    added_first_byte_[static_cast<unsigned char>(token[0])] = true;
}

void ByteLevelBpeTokenizer::tokenize_plain(std::string_view text, std::vector<std::int32_t>& ids) const {
  auto& cache = piece_cache();
  std::string key(sizeof(instance_), '\0');
  std::copy_n(reinterpret_cast<const char*>(&instance_), sizeof(instance_), key.begin());
  for (const std::string_view piece : pretokenize(text, spec_.pattern)) {
    if (piece.size() > kLongestCachedPiece) {
      spec_.encoder.encode(piece, ids);
      continue;
    }
    key.resize(sizeof(instance_));
    key.append(piece);
    const auto it = cache.find(key);
    if (it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      continue;
    }
    const std::size_t first = ids.size();
    spec_.encoder.encode(piece, ids);
    if (cache.size() >= kCacheEntries) cache.clear();
    cache.emplace(key,
                  std::vector<std::int32_t>(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end()));
  }
}

void ByteLevelBpeTokenizer::tokenize(std::string_view text, std::vector<std::int32_t>& ids) const {
  ids.insert(ids.end(), spec_.prefix_ids.begin(), spec_.prefix_ids.end());
  std::string prefixed;
  if (spec_.add_prefix_space && !text.empty() && text.front() != ' ') {
    prefixed = " " + std::string(text);
    text = prefixed;
  }
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size() && !spec_.added_tokens.empty(); ++i) {
    if (!added_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    for (const auto& [token, id] : spec_.added_tokens) {
      if (text.compare(i, token.size(), token) != 0) continue;
      tokenize_plain(text.substr(start, i - start), ids);
      ids.push_back(id);
      start = i + token.size();
      i = start - 1;
      break;
    }
  }
  tokenize_plain(text.substr(start), ids);
  ids.insert(ids.end(), spec_.suffix_ids.begin(), spec_.suffix_ids.end());
}

}  // namespace megatune::executor::data
