// JsonValue: a small JSON document model with a strict parser (errors carry line:column) and a writer.
// Used for the hardware catalog, cluster files, fitted-model parameters and table import/export.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace megatune::cost_models {

// A parse error: what() is "line L, column C: <problem>".
// what(): "line L, column C: problem"; problem() alone, for a caller that states the position its own way.
class JsonParseError : public std::runtime_error {
 public:
  JsonParseError(const std::string& problem, int line, int column)
      : std::runtime_error("line " + std::to_string(line) + ", column " + std::to_string(column) + ": " +
                           problem),
        problem_(problem),
        line_(line),
        column_(column) {}
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string problem_;
  int line_, column_;
};

class JsonValue {
 public:
  using Array = std::vector<JsonValue>;
  // Keys keep insertion order for readable output; lookups are linear (objects here are small).
  using Object = std::vector<std::pair<std::string, JsonValue>>;

  JsonValue() = default;  // null
  JsonValue(std::nullptr_t) {}
  JsonValue(bool value) : value_(value) {}
  JsonValue(double value) : value_(value) {}
  JsonValue(int value) : value_(static_cast<double>(value)) {}
  JsonValue(std::int64_t value) : value_(static_cast<double>(value)) {}
  JsonValue(const char* value) : value_(std::string(value)) {}
  JsonValue(std::string value) : value_(std::move(value)) {}
  JsonValue(Array value) : value_(std::move(value)) {}
  JsonValue(Object value) : value_(std::move(value)) {}

  static JsonValue parse(std::string_view text);  // throws JsonParseError

  bool is_null() const { return std::holds_alternative<std::monostate>(value_); }
  bool is_bool() const { return std::holds_alternative<bool>(value_); }
  bool is_number() const { return std::holds_alternative<double>(value_); }
  bool is_string() const { return std::holds_alternative<std::string>(value_); }
  bool is_array() const { return std::holds_alternative<Array>(value_); }
  bool is_object() const { return std::holds_alternative<Object>(value_); }

  // Accessors throw std::runtime_error naming the expected type when the type differs.
  bool as_bool() const;
  double as_number() const;
  std::int64_t as_int64() const;  // throws when the number is not integral
  const std::string& as_string() const;
  const Array& as_array() const;
  Array& as_array();
  const Object& as_object() const;
  Object& as_object();

  // Object member or nullptr.
  const JsonValue* find(std::string_view key) const;
  // Object member; throws naming the key when missing.
  const JsonValue& at(std::string_view key) const;
  // Adds or replaces an object member (turns null into an object).
  JsonValue& set(std::string key, JsonValue value);
  // Appends to an array (turns null into an array).
  JsonValue& push_back(JsonValue value);

  // indent < 0: one line; otherwise pretty-printed with `indent` spaces. Numbers round-trip (%.17g,
  // integers without exponent).
  std::string dump(int indent = -1) const;
  const char* type_name() const;

 private:
  std::variant<std::monostate, bool, double, std::string, Array, Object> value_;
};

}  // namespace megatune::cost_models
