// JsonValue: a document model over nlohmann-json's parser (SAX, with line:column errors) and serializer.
#include "cost_models/json_value.h"

#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>

#include "base/json_syntax_error.h"

namespace megatune::cost_models {
namespace {

constexpr int kMaxDepth = 256;

// A char iterator that records how far the parser has read, so that an error the document builder finds
// (nesting too deep) carries a position as the library's own syntax errors do.
class CountingIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator(const char* at, const char* begin, std::size_t* furthest)
      : at_(at), begin_(begin), furthest_(furthest) {}
  reference operator*() const { return *at_; }
  CountingIterator& operator++() {
    ++at_;
    const auto read = static_cast<std::size_t>(at_ - begin_);
    if (read > *furthest_) *furthest_ = read;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator before = *this;
    ++*this;
    return before;
  }
  bool operator==(const CountingIterator& other) const { return at_ == other.at_; }

 private:
  const char* at_;
  const char* begin_;
  std::size_t* furthest_;
};

// Builds a JsonValue from the parser's events; the first problem stops the parse.
class DocumentBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  DocumentBuilder(std::string_view text, const std::size_t* bytes_read)
      : text_(text), bytes_read_(bytes_read) {}

  JsonValue take() { return std::move(root_); }
  [[noreturn]] void fail(std::size_t offset, const std::string& problem) const {
    const base::JsonTextPosition at = base::json_text_position(text_, offset);
    throw JsonParseError(problem, at.line, at.column);
  }
  [[noreturn]] void fail_here(const std::string& problem) const {
    fail(base::json_error_offset(*bytes_read_), problem);
  }

  bool null() override { return add(JsonValue(nullptr)); }
  bool boolean(bool value) override { return add(JsonValue(value)); }
  bool number_integer(number_integer_t value) override { return add(JsonValue(static_cast<double>(value))); }
  bool number_unsigned(number_unsigned_t value) override {
    return add(JsonValue(static_cast<double>(value)));
  }
  bool number_float(number_float_t value, const string_t&) override { return add(JsonValue(value)); }
  bool string(string_t& value) override { return add(JsonValue(std::move(value))); }
  bool binary(binary_t&) override { return false; }  // JSON text has no binary values
  bool start_object(std::size_t) override { return open(JsonValue(JsonValue::Object{})); }
  bool key(string_t& name) override {
    key_ = std::move(name);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(JsonValue(JsonValue::Array{})); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t bytes_read, const std::string&,
                   const nlohmann::detail::exception& error) override {
    fail(base::json_error_offset(bytes_read), base::json_error_problem(error.what()));
  }

 private:
  // Places a finished value into the innermost open container (or as the document).
  JsonValue* place(JsonValue value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    JsonValue& parent = *open_.back();
    if (parent.is_array()) return &parent.push_back(std::move(value));
    return &parent.set(std::move(key_), std::move(value));  // a repeated key keeps the last value
  }
  bool add(JsonValue value) {
    place(std::move(value));
    return true;
  }
  bool open(JsonValue container) {
    if (static_cast<int>(open_.size()) >= kMaxDepth)
      fail_here("nesting deeper than " + std::to_string(kMaxDepth));
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    open_.pop_back();
    return true;
  }

  std::string_view text_;
  const std::size_t* bytes_read_;
  JsonValue root_;
  std::vector<JsonValue*> open_;  // the containers being filled, outermost first
  std::string key_;
};

// The library's document for one value; integral numbers print without a fraction or exponent.
nlohmann::ordered_json to_library(const JsonValue& value) {
  if (value.is_null()) return nullptr;
  if (value.is_bool()) return value.as_bool();
  if (value.is_string()) return value.as_string();
  if (value.is_number()) {
    const double number = value.as_number();
    if (number == std::floor(number) && std::fabs(number) < 9.007199254740992e15) {
      return static_cast<std::int64_t>(number);
    }
    return number;  // the shortest text that round-trips; NaN and infinities print as null
  }
  if (value.is_array()) {
    nlohmann::ordered_json items = nlohmann::ordered_json::array();
    for (const JsonValue& item : value.as_array()) items.push_back(to_library(item));
    return items;
  }
  nlohmann::ordered_json members = nlohmann::ordered_json::object();
  for (const auto& [name, member] : value.as_object()) members[name] = to_library(member);
  return members;
}

}  // namespace

JsonValue JsonValue::parse(std::string_view text) {
  std::size_t bytes_read = 0;
  DocumentBuilder builder(text, &bytes_read);
  const CountingIterator first(text.data(), text.data(), &bytes_read);
  const CountingIterator last(text.data() + text.size(), text.data(), &bytes_read);
  nlohmann::json::sax_parse(first, last, &builder);
  return builder.take();
}

const char* JsonValue::type_name() const {
  switch (value_.index()) {
    case 0:
      return "null";
    case 1:
      return "boolean";
    case 2:
      return "number";
    case 3:
      return "string";
    case 4:
      return "array";
    default:
      return "object";
  }
}

namespace {
[[noreturn]] void wrong_type(const char* expected, const char* actual) {
  throw std::runtime_error(std::string("expected a JSON ") + expected + ", found " + actual);
}
}  // namespace

bool JsonValue::as_bool() const {
  if (!is_bool()) wrong_type("boolean", type_name());
  return std::get<bool>(value_);
}

double JsonValue::as_number() const {
  if (!is_number()) wrong_type("number", type_name());
  return std::get<double>(value_);
}

std::int64_t JsonValue::as_int64() const {
  const double value = as_number();
  if (value != std::floor(value) || std::fabs(value) > 9.2e18) {
    throw std::runtime_error("expected an integer, found " + std::to_string(value));
  }
  return static_cast<std::int64_t>(value);
}

const std::string& JsonValue::as_string() const {
  if (!is_string()) wrong_type("string", type_name());
  return std::get<std::string>(value_);
}

const JsonValue::Array& JsonValue::as_array() const {
  if (!is_array()) wrong_type("array", type_name());
  return std::get<Array>(value_);
}

JsonValue::Array& JsonValue::as_array() {
  if (!is_array()) wrong_type("array", type_name());
  return std::get<Array>(value_);
}

const JsonValue::Object& JsonValue::as_object() const {
  if (!is_object()) wrong_type("object", type_name());
  return std::get<Object>(value_);
}

JsonValue::Object& JsonValue::as_object() {
  if (!is_object()) wrong_type("object", type_name());
  return std::get<Object>(value_);
}

const JsonValue* JsonValue::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  for (const auto& [name, value] : std::get<Object>(value_)) {
    if (name == key) return &value;
  }
  return nullptr;
}

const JsonValue& JsonValue::at(std::string_view key) const {
  const JsonValue* value = find(key);
  if (value == nullptr) throw std::runtime_error("missing key \"" + std::string(key) + "\"");
  return *value;
}

JsonValue& JsonValue::set(std::string key, JsonValue value) {
  if (is_null()) value_ = Object{};
  Object& members = as_object();
  for (auto& [name, slot] : members) {
    if (name == key) {
      slot = std::move(value);
      return slot;
    }
  }
  members.emplace_back(std::move(key), std::move(value));
  return members.back().second;
}

JsonValue& JsonValue::push_back(JsonValue value) {
  if (is_null()) value_ = Array{};
  Array& items = as_array();
  items.push_back(std::move(value));
  return items.back();
}

std::string JsonValue::dump(int indent) const {
  return to_library(*this).dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace megatune::cost_models
