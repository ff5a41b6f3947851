// JsonLine: one JSONL line read by nlohmann-json: an object whose string fields (escapes and \u surrogate
// pairs decoded to UTF-8) or integer-array fields the caller asks for. Errors carry the column; the caller
// names the file and line.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace megatune::executor::data {

struct JsonLineError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The top-level fields of one JSON object line. Throws JsonLineError if the line is not one complete,
// valid JSON object.
class JsonLine {
 public:
  explicit JsonLine(std::string_view line);
  bool has(std::string_view key) const;
  // The field as a string; throws JsonLineError if it is missing or not a string.
  std::string string_field(std::string_view key) const;
  // The field as an array of integers; throws JsonLineError if missing, not an array or not integers.
  std::vector<int64_t> integer_array_field(std::string_view key) const;

 private:
  const nlohmann::json& field(std::string_view key) const;  // throws when missing
  std::shared_ptr<const nlohmann::json> object_;
};

}  // namespace megatune::executor::data
