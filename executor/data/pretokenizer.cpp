// Pre-tokenizers: one scanner over decoded code points, with the alternatives of each pattern tried in the
// regular expression's order at every position (leftmost-first, as the regex engines do).
#include "executor/data/pretokenizer.h"

#include <cstdint>

#include "executor/data/unicode_category.h"
#include "executor/data/utf8.h"

namespace megatune::executor::data {
namespace {

struct CodePoint {
  char32_t value;
  std::uint32_t offset;  // byte offset in the text
  bool letter, number, space;
};

std::vector<CodePoint> decode(std::string_view text) {
  std::vector<CodePoint> out;
  out.reserve(text.size());
  for (std::size_t i = 0, length = 0; i < text.size(); i += length) {
    const char32_t value = decode_utf8_at(text, i, length);
    const UnicodeCategory category = unicode_category(value);
    out.push_back({value, static_cast<std::uint32_t>(i), is_letter(category), is_number(category),
                   is_white_space(value)});
  }
  return out;
}

struct PatternRules {
  bool contractions = false, case_insensitive_contractions = false;
  bool letter_prefix_any = false;     // [^\r\n\p{L}\p{N}]?\p{L}+ (else ' ?\p{L}+')
  int max_digits = 0;                 // \p{N}{1,max} (0: ' ?\p{N}+')
  bool punctuation_newlines = false;  // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (else without [\r\n]*)
  bool newline_rule = false;          // \s*[\r\n]+
};

PatternRules rules_of(PreTokenizerPattern pattern) {
  switch (pattern) {
    case PreTokenizerPattern::kGpt2:
      return {true, false, false, 0, false, false};
    case PreTokenizerPattern::kCl100k:
      return {true, true, true, 3, true, true};
    case PreTokenizerPattern::kTiktokenV1:
      return {false, false, true, 1, true, true};
  }
  return {};
}

class Scanner {
 public:
  Scanner(const std::vector<CodePoint>& cps, const PatternRules& rules) : c_(cps), r_(rules) {}

  // The end (code point index) of the match at i; always > i.
  std::size_t match(std::size_t i) const {
    std::size_t end = 0;
    if (r_.contractions && (end = contraction(i)) > i) return end;
    if ((end = letters(i)) > i) return end;
    if ((end = numbers(i)) > i) return end;
    if ((end = punctuation(i)) > i) return end;
    return spaces(i);
  }

 private:
  bool is(std::size_t i, char32_t value) const { return i < c_.size() && c_[i].value == value; }
  bool newline(std::size_t i) const { return is(i, U'\r') || is(i, U'\n'); }
  bool other(std::size_t i) const { return i < c_.size() && !c_[i].letter && !c_[i].number && !c_[i].space; }
  bool letter(std::size_t i) const { return i < c_.size() && c_[i].letter; }
  bool number(std::size_t i) const { return i < c_.size() && c_[i].number; }
  bool space(std::size_t i) const { return i < c_.size() && c_[i].space; }

  // 's 't 're 've 'm 'll 'd (with (?i): either case; Unicode simple case folding also maps ſ to s).
  std::size_t contraction(std::size_t i) const {
    if (!is(i, U'\'')) return i;
    const auto at = [&](std::size_t k, char32_t lower) {
      if (is(k, lower)) return true;
      if (!r_.case_insensitive_contractions) return false;
      return is(k, lower - 32) || (lower == U's' && is(k, U'\u017F'));
    };
    if (at(i + 1, U's') || at(i + 1, U't') || at(i + 1, U'm') || at(i + 1, U'd')) return i + 2;
    if ((at(i + 1, U'r') || at(i + 1, U'v')) && at(i + 2, U'e')) return i + 3;
    if (at(i + 1, U'l') && at(i + 2, U'l')) return i + 3;
    return i;
  }

  std::size_t letters(std::size_t i) const {
    std::size_t j = i;
    if (r_.letter_prefix_any ? (i < c_.size() && !newline(i) && !letter(i) && !number(i)) : is(i, U' ')) ++j;
    if (!letter(j)) j = i;  // the optional prefix is given back
    if (!letter(j)) return i;
    while (letter(j)) ++j;
    return j;
  }

  std::size_t numbers(std::size_t i) const {
    std::size_t j = i;
    if (r_.max_digits == 0) {
      if (is(j, U' ') && number(j + 1)) ++j;
      while (number(j)) ++j;
      return number(i) || j > i + 1 ? j : i;
    }
    while (number(j) && j - i < static_cast<std::size_t>(r_.max_digits)) ++j;
    return j;
  }

  std::size_t punctuation(std::size_t i) const {
    std::size_t j = i;
    if (is(j, U' ') && other(j + 1)) ++j;
    if (!other(j)) return i;
    while (other(j)) ++j;
    if (r_.punctuation_newlines)
      while (newline(j)) ++j;
    return j;
  }

  std::size_t spaces(std::size_t i) const {
    std::size_t run = i;
    while (space(run)) ++run;
    if (run == i) return i + 1;  // unreachable: every code point is a letter, number, space or other
    if (r_.newline_rule) {       // \s*[\r\n]+: up to the last newline of the run
      for (std::size_t k = run; k > i; --k)
        if (newline(k - 1)) return k;
    }
    if (run == c_.size() || run == i + 1) return run;  // \s+(?!\S) at the end, or \s+ of one
    return run - 1;                                    // \s+(?!\S): the last space goes with what follows
  }

  const std::vector<CodePoint>& c_;
  const PatternRules& r_;
};

}  // namespace

std::string pretokenizer_regex(PreTokenizerPattern pattern) {
  switch (pattern) {
    case PreTokenizerPattern::kGpt2:
      return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
    case PreTokenizerPattern::kCl100k:
      return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|)"
             R"(\s*[\r\n]+|\s+(?!\S)|\s+)";
    case PreTokenizerPattern::kTiktokenV1:
      return R"([^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
  }
  return {};
}

std::optional<PreTokenizerPattern> pretokenizer_pattern_of(std::string_view regex) {
  for (PreTokenizerPattern p :
       {PreTokenizerPattern::kGpt2, PreTokenizerPattern::kCl100k, PreTokenizerPattern::kTiktokenV1})
    if (regex == pretokenizer_regex(p)) return p;
  return std::nullopt;
}

std::vector<std::string_view> pretokenize(std::string_view text, PreTokenizerPattern pattern) {
  const std::vector<CodePoint> cps = decode(text);
  const PatternRules rules = rules_of(pattern);
  const Scanner scanner(cps, rules);
  std::vector<std::string_view> pieces;
  for (std::size_t i = 0; i < cps.size();) {
    const std::size_t end = scanner.match(i);
    const std::size_t begin_byte = cps[i].offset, end_byte = end < cps.size() ? cps[end].offset : text.size();
    pieces.push_back(text.substr(begin_byte, end_byte - begin_byte));
    i = end;
  }
  return pieces;
}

}  // namespace megatune::executor::data
