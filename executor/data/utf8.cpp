// UTF-8: one code point at a time.
#include "executor/data/utf8.h"

namespace megatune::executor::data {

char32_t decode_utf8_at(std::string_view text, std::size_t i, std::size_t& length) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  std::size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  char32_t value = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
  for (std::size_t k = 1; k < n; ++k) {
    if (i + k >= text.size() || (byte(i + k) >> 6) != 2) {
      n = 0;
      break;
    }
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  const bool overlong = (n == 2 && value < 0x80) || (n == 3 && value < 0x800) ||
                        (n == 4 && (value < 0x10000 || value > 0x10FFFF));
  if (n == 0 || overlong || (value >= 0xD800 && value <= 0xDFFF)) {
    length = 1;
    return 0xFFFD;
  }
  length = n;
  return value;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

}  // namespace megatune::executor::data
