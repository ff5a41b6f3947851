// json_syntax_error: where a JSON text stopped parsing, as line and column, and what nlohmann-json said
// about it, without the library's own prefix. Shared by every room that reads JSON (cluster files, the
// hardware catalog, imports, JSONL corpora).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace megatune::base {

struct JsonTextPosition {
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in bytes
};

// The line and column of byte `offset` of `text` (an offset past the end points just after the last byte).
JsonTextPosition json_text_position(std::string_view text, std::size_t offset);

// nlohmann-json's parse_error::byte counts the bytes read, the offending one included: the offset of the
// byte the parser stopped at.
std::size_t json_error_offset(std::size_t bytes_read);

// The problem part of a nlohmann-json exception message: "[json.exception.parse_error.101] parse error at
// line 1, column 2: syntax error ..." becomes "syntax error ...", "[json.exception.out_of_range.406] number
// overflow ..." becomes "number overflow ...".
std::string json_error_problem(std::string_view library_message);

}  // namespace megatune::base
