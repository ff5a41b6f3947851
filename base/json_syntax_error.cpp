// json_syntax_error: byte offsets to line:column and nlohmann-json messages without their prefix.
#include "base/json_syntax_error.h"

namespace megatune::base {

JsonTextPosition json_text_position(std::string_view text, std::size_t offset) {
  JsonTextPosition position;
  const std::size_t end = offset < text.size() ? offset : text.size();
  for (std::size_t i = 0; i < end; ++i) {
    if (text[i] == '\n') {
      ++position.line;
      position.column = 1;
    } else {
      ++position.column;
    }
  }
  return position;
}

std::size_t json_error_offset(std::size_t bytes_read) { return bytes_read > 0 ? bytes_read - 1 : 0; }

std::string json_error_problem(std::string_view library_message) {
  std::string_view problem = library_message;
  if (problem.starts_with('[')) {  // "[json.exception.parse_error.101] "
    const std::size_t bracket = problem.find("] ");
    if (bracket != std::string_view::npos) problem.remove_prefix(bracket + 2);
  }
  if (problem.starts_with("parse error")) {  // "parse error at line 1, column 2: "
    const std::size_t colon = problem.find(": ");
    if (colon != std::string_view::npos) problem.remove_prefix(colon + 2);
  }
  return std::string(problem);
}

}  // namespace megatune::base
