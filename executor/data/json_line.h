// Minimal JSON reader for one JSONL line: parses an object and extracts a string field (escapes and
// \u surrogate pairs decoded to UTF-8) or an array of integers. Errors carry a message without location;
// the caller names the file and line.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::executor::data {

struct JsonLineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The top-level fields of one JSON object line (values kept as raw JSON text). Throws JsonLineError if
// the line is not one complete, valid JSON object.
class JsonLine {
 public:
  explicit JsonLine(std::string_view line);
  bool has(std::string_view key) const;
  // The field as a string; throws JsonLineError if it is missing or not a string.
  std::string string_field(std::string_view key) const;
  // The field as an array of integers; throws JsonLineError if missing, not an array or not integers.
  std::vector<int64_t> integer_array_field(std::string_view key) const;

 private:
  std::optional<std::string_view> raw(std::string_view key) const;
  std::vector<std::pair<std::string, std::string_view>> fields_;  // key -> raw value text
};

}  // namespace megatune::executor::data
