// JsonValue: strict recursive-descent parser (RFC 8259, with line:column errors) and writer.
#include "cost_models/json_value.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "layouts/json_quote.h"

namespace megatune::cost_models {
namespace {

constexpr int kMaxDepth = 256;

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  JsonValue parse_document() {
    skip_space();
    JsonValue value = parse_value(0);
    skip_space();
    if (position_ != text_.size()) fail("unexpected text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    int line = 1, column = 1;
    for (std::size_t i = 0; i < position_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw JsonParseError(
        "line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + problem, line, column);
  }

  void skip_space() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\t' ||
                                        text_[position_] == '\n' || text_[position_] == '\r')) {
      ++position_;
    }
  }

  bool consume(std::string_view literal) {
    if (text_.substr(position_, literal.size()) == literal) {
      position_ += literal.size();
      return true;
    }
    return false;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (position_ >= text_.size()) fail("unexpected end of input, expected a value");
    const char c = text_[position_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return JsonValue(parse_string());
    if (consume("true")) return JsonValue(true);
    if (consume("false")) return JsonValue(false);
    if (consume("null")) return JsonValue(nullptr);
    if (c == '-' || (c >= '0' && c <= '9')) return JsonValue(parse_number());
    fail(std::string("unexpected character '") + c + "', expected a value");
  }

  JsonValue parse_object(int depth) {
    ++position_;  // {
    JsonValue::Object members;
    skip_space();
    if (position_ < text_.size() && text_[position_] == '}') {
      ++position_;
      return JsonValue(std::move(members));
    }
    while (true) {
      skip_space();
      if (position_ >= text_.size() || text_[position_] != '"') fail("expected a string key");
      std::string key = parse_string();
      skip_space();
      if (position_ >= text_.size() || text_[position_] != ':')
        fail("expected ':' after key \"" + key + "\"");
      ++position_;
      skip_space();
      JsonValue value = parse_value(depth + 1);
      bool replaced = false;
      for (auto& [existing, slot] : members) {
        if (existing == key) {
          slot = std::move(value);
          replaced = true;
          break;
        }
      }
      if (!replaced) members.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (position_ < text_.size() && text_[position_] == ',') {
        ++position_;
        continue;
      }
      if (position_ < text_.size() && text_[position_] == '}') {
        ++position_;
        return JsonValue(std::move(members));
      }
      fail("expected ',' or '}' in object");
    }
  }

  JsonValue parse_array(int depth) {
    ++position_;  // [
    JsonValue::Array items;
    skip_space();
    if (position_ < text_.size() && text_[position_] == ']') {
      ++position_;
      return JsonValue(std::move(items));
    }
    while (true) {
      skip_space();
      items.push_back(parse_value(depth + 1));
      skip_space();
      if (position_ < text_.size() && text_[position_] == ',') {
        ++position_;
        continue;
      }
      if (position_ < text_.size() && text_[position_] == ']') {
        ++position_;
        return JsonValue(std::move(items));
      }
      fail("expected ',' or ']' in array");
    }
  }

  unsigned parse_hex4() {
    if (position_ + 4 > text_.size()) fail("truncated \\u escape");
    unsigned value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[position_++];
      value <<= 4;
      if (c >= '0' && c <= '9') {
        value |= static_cast<unsigned>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        value |= static_cast<unsigned>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        value |= static_cast<unsigned>(c - 'A' + 10);
      } else {
        fail("bad hex digit in \\u escape");
      }
    }
    return value;
  }

  static void append_utf8(std::string& out, unsigned code_point) {
    if (code_point < 0x80) {
      out += static_cast<char>(code_point);
    } else if (code_point < 0x800) {
      out += static_cast<char>(0xC0 | (code_point >> 6));
      out += static_cast<char>(0x80 | (code_point & 0x3F));
    } else if (code_point < 0x10000) {
      out += static_cast<char>(0xE0 | (code_point >> 12));
      out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code_point & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code_point >> 18));
      out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code_point & 0x3F));
    }
  }

  std::string parse_string() {
    ++position_;  // opening quote
    std::string out;
    while (true) {
      if (position_ >= text_.size()) fail("unterminated string");
      const char c = text_[position_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (position_ >= text_.size()) fail("unterminated escape");
      const char escape = text_[position_++];
      switch (escape) {
        case '"':
        case '\\':
        case '/':
          out += escape;
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned code_point = parse_hex4();
          if (code_point >= 0xD800 && code_point < 0xDC00) {
            if (!consume("\\u")) fail("unpaired surrogate in \\u escape");
            const unsigned low = parse_hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("bad low surrogate in \\u escape");
            code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
          } else if (code_point >= 0xDC00 && code_point < 0xE000) {
            fail("unpaired surrogate in \\u escape");
          }
          append_utf8(out, code_point);
          break;
        }
        default:
          fail(std::string("bad escape '\\") + escape + "'");
      }
    }
  }

  double parse_number() {
    const std::size_t start = position_;
    if (text_[position_] == '-') ++position_;
    auto digits = [&] {
      const std::size_t first = position_;
      while (position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9') ++position_;
      return position_ - first;
    };
    if (position_ < text_.size() && text_[position_] == '0') {
      ++position_;
    } else if (digits() == 0) {
      fail("bad number");
    }
    if (position_ < text_.size() && text_[position_] == '.') {
      ++position_;
      if (digits() == 0) fail("bad number: digits expected after '.'");
    }
    if (position_ < text_.size() && (text_[position_] == 'e' || text_[position_] == 'E')) {
      ++position_;
      if (position_ < text_.size() && (text_[position_] == '+' || text_[position_] == '-')) ++position_;
      if (digits() == 0) fail("bad number: digits expected in exponent");
    }
    const std::string number(text_.substr(start, position_ - start));
    const double value = std::strtod(number.c_str(), nullptr);
    if (!std::isfinite(value)) fail("number out of range: " + number);
    return value;
  }

  std::string_view text_;
  std::size_t position_ = 0;
};

void write_string(std::string& out, const std::string& text) { out += layouts::json_quote(text); }

void write_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char text[40];
  if (value == std::floor(value) && std::fabs(value) < 9.007199254740992e15) {
    std::snprintf(text, sizeof text, "%.0f", value);
  } else {
    std::snprintf(text, sizeof text, "%.17g", value);
    // Prefer the shortest form that round-trips.
    for (int precision = 6; precision < 17; ++precision) {
      char shorter[40];
      std::snprintf(shorter, sizeof shorter, "%.*g", precision, value);
      if (std::strtod(shorter, nullptr) == value) {
        std::snprintf(text, sizeof text, "%s", shorter);
        break;
      }
    }
  }
  out += text;
}

}  // namespace

JsonValue JsonValue::parse(std::string_view text) { return Parser(text).parse_document(); }

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

namespace {
void dump_to(std::string& out, const JsonValue& value, int indent, int level) {
  auto newline = [&](int depth) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * depth), ' ');
  };
  if (value.is_null()) {
    out += "null";
  } else if (value.is_bool()) {
    out += value.as_bool() ? "true" : "false";
  } else if (value.is_number()) {
    write_number(out, value.as_number());
  } else if (value.is_string()) {
    write_string(out, value.as_string());
  } else if (value.is_array()) {
    const auto& items = value.as_array();
    out += '[';
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += indent < 0 ? "," : ",";
      newline(level + 1);
      dump_to(out, items[i], indent, level + 1);
    }
    if (!items.empty()) newline(level);
    out += ']';
  } else {
    const auto& members = value.as_object();
    out += '{';
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (i > 0) out += ",";
      newline(level + 1);
      write_string(out, members[i].first);
      out += indent < 0 ? ":" : ": ";
      dump_to(out, members[i].second, indent, level + 1);
    }
    if (!members.empty()) newline(level);
    out += '}';
  }
}
}  // namespace

std::string JsonValue::dump(int indent) const {
  std::string out;
  dump_to(out, *this, indent, 0);
  return out;
}

}  // namespace megatune::cost_models
