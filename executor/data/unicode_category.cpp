// Unicode category lookup: binary search over the generated range table, a direct table for ASCII.
#include "executor/data/unicode_category.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace megatune::executor::data {
namespace {

struct CategoryRange {
  char32_t first, last;
  UnicodeCategory category;
};

constexpr UnicodeCategory kLu = UnicodeCategory::kLu, kLl = UnicodeCategory::kLl, kLt = UnicodeCategory::kLt,
                          kLm = UnicodeCategory::kLm, kLo = UnicodeCategory::kLo, kMn = UnicodeCategory::kMn,
                          kMc = UnicodeCategory::kMc, kMe = UnicodeCategory::kMe, kNd = UnicodeCategory::kNd,
                          kNl = UnicodeCategory::kNl, kNo = UnicodeCategory::kNo;

constexpr CategoryRange kRanges[] = {
#include "executor/data/unicode_category_table.inc"
};

UnicodeCategory search(char32_t code_point) {
  const auto* end = std::end(kRanges);
  const auto* it = std::upper_bound(std::begin(kRanges), end, code_point,
                                    [](char32_t c, const CategoryRange& r) { return c < r.first; });
  if (it == std::begin(kRanges)) return UnicodeCategory::kOther;
  --it;
  return code_point <= it->last ? it->category : UnicodeCategory::kOther;
}

const std::array<UnicodeCategory, 128>& ascii_table() {
  static const std::array<UnicodeCategory, 128> table = [] {
    std::array<UnicodeCategory, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = search(c);
    return t;
  }();
  return table;
}

}  // namespace

UnicodeCategory unicode_category(char32_t code_point) {
  return code_point < 128 ? ascii_table()[code_point] : search(code_point);
}

bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace megatune::executor::data
