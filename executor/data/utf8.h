// UTF-8 decoding and encoding of single code points.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace megatune::executor::data {

// The code point starting at byte `i` of `text` and its length in bytes. An invalid, overlong or truncated
// sequence (or a surrogate) yields U+FFFD for its first byte alone (length 1).
char32_t decode_utf8_at(std::string_view text, std::size_t i, std::size_t& length);
// Appends the UTF-8 bytes of `code_point`.
void append_utf8(std::string& out, char32_t code_point);

}  // namespace megatune::executor::data
