// Unicode general categories (letters, marks and numbers by subcategory) and the White_Space property of a
// code point, as the pre-tokenizers' \p{L}, \p{N} and \s ask them; table in unicode_category_table.inc.
#pragma once
#include <cstdint>

namespace megatune::executor::data {

enum class UnicodeCategory : std::uint8_t { kOther, kLu, kLl, kLt, kLm, kLo, kMn, kMc, kMe, kNd, kNl, kNo };

UnicodeCategory unicode_category(char32_t code_point);
inline bool is_letter(UnicodeCategory c) { return c >= UnicodeCategory::kLu && c <= UnicodeCategory::kLo; }
inline bool is_number(UnicodeCategory c) { return c >= UnicodeCategory::kNd && c <= UnicodeCategory::kNo; }
// Unicode's White_Space property (what \s matches in the Rust and Python regex engines).
bool is_white_space(char32_t code_point);

}  // namespace megatune::executor::data
