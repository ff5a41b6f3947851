// JsonLine: a small strict JSON parser for one JSONL line (RFC 8259 values; top level must be an object).
#include "executor/data/json_line.h"

#include <cerrno>
#include <cstdlib>

namespace megatune::executor::data {

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\t' || text_[at_] == '\r' || text_[at_] == '\n')) {
      ++at_;
    }
  }
  bool done() const { return at_ >= text_.size(); }
  char peek() const { return done() ? '\0' : text_[at_]; }
  [[noreturn]] void fail(const std::string& what) const {
    throw JsonLineError(what + " at column " + std::to_string(at_ + 1));
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }

  // Parses a string starting at '"' and returns its decoded UTF-8 bytes.
  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (done()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character inside a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (done()) fail("unterminated escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t code = parse_hex4();
          if (code >= 0xD800 && code <= 0xDBFF) {
            if (peek() != '\\' || at_ + 1 >= text_.size() || text_[at_ + 1] != 'u')
              fail("unpaired surrogate");
            at_ += 2;
            const uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) fail("invalid low surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            fail("unpaired surrogate");
          }
          append_utf8(code, out);
          break;
        }
        default:
          fail(std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  // Skips any value, returning its raw text.
  std::string_view skip_value(int depth = 0) {
    if (depth > 512) fail("nesting too deep");
    skip_space();
    const size_t start = at_;
    const char c = peek();
    if (c == '"') {
      parse_string();
    } else if (c == '{') {
      ++at_;
      skip_space();
      if (peek() == '}') {
        ++at_;
      } else {
        while (true) {
          skip_space();
          parse_string();
          skip_space();
          expect(':');
          skip_value(depth + 1);
          skip_space();
          if (peek() == ',') {
            ++at_;
            continue;
          }
          expect('}');
          break;
        }
      }
    } else if (c == '[') {
      ++at_;
      skip_space();
      if (peek() == ']') {
        ++at_;
      } else {
        while (true) {
          skip_value(depth + 1);
          skip_space();
          if (peek() == ',') {
            ++at_;
            continue;
          }
          expect(']');
          break;
        }
      }
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      skip_number();
    } else if (text_.substr(at_, 4) == "true" || text_.substr(at_, 4) == "null") {
      at_ += 4;
    } else if (text_.substr(at_, 5) == "false") {
      at_ += 5;
    } else {
      fail(done() ? "unexpected end of line" : std::string("unexpected character '") + c + "'");
    }
    return text_.substr(start, at_ - start);
  }

  size_t position() const { return at_; }

 private:
  uint32_t parse_hex4() {
    if (at_ + 4 > text_.size()) fail("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char h = text_[at_++];
      value <<= 4;
      if (h >= '0' && h <= '9')
        value |= static_cast<uint32_t>(h - '0');
      else if (h >= 'a' && h <= 'f')
        value |= static_cast<uint32_t>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F')
        value |= static_cast<uint32_t>(h - 'A' + 10);
      else
        fail("invalid hex digit in \\u escape");
    }
    return value;
  }
  static void append_utf8(uint32_t code, std::string& out) {
    if (code < 0x80) {
      out.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (code >> 6)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else if (code < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (code >> 12)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (code >> 18)));
      out.push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }
  void skip_number() {
    if (peek() == '-') ++at_;
    if (peek() == '0') {
      ++at_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++at_;
    } else {
      fail("invalid number");
    }
    if (peek() == '.') {
      ++at_;
      if (!(peek() >= '0' && peek() <= '9')) fail("invalid number");
      while (peek() >= '0' && peek() <= '9') ++at_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++at_;
      if (peek() == '+' || peek() == '-') ++at_;
      if (!(peek() >= '0' && peek() <= '9')) fail("invalid number");
      while (peek() >= '0' && peek() <= '9') ++at_;
    }
  }

  std::string_view text_;
  size_t at_ = 0;
};

}  // namespace

JsonLine::JsonLine(std::string_view line) {
  Parser parser(line);
  parser.skip_space();
  if (parser.peek() != '{') parser.fail("a JSONL line must be a JSON object");
  parser.expect('{');
  parser.skip_space();
  if (parser.peek() == '}') {
    parser.expect('}');
  } else {
    while (true) {
      parser.skip_space();
      std::string key = parser.parse_string();
      parser.skip_space();
      parser.expect(':');
      const std::string_view value = parser.skip_value();
      fields_.emplace_back(std::move(key), value);
      parser.skip_space();
      if (parser.peek() == ',') {
        parser.expect(',');
        continue;
      }
      parser.expect('}');
      break;
    }
  }
  parser.skip_space();
  if (!parser.done()) parser.fail("trailing characters after the JSON object");
}

std::optional<std::string_view> JsonLine::raw(std::string_view key) const {
  for (const auto& [name, value] : fields_) {
    if (name == key) return value;
  }
  return std::nullopt;
}

bool JsonLine::has(std::string_view key) const { return raw(key).has_value(); }

std::string JsonLine::string_field(std::string_view key) const {
  const auto value = raw(key);
  if (!value) throw JsonLineError("no key \"" + std::string(key) + "\"");
  if (value->empty() || value->front() != '"')
    throw JsonLineError("key \"" + std::string(key) + "\" is not a string");
  Parser parser(*value);
  return parser.parse_string();
}

std::vector<int64_t> JsonLine::integer_array_field(std::string_view key) const {
  const auto value = raw(key);
  if (!value) throw JsonLineError("no key \"" + std::string(key) + "\"");
  if (value->empty() || value->front() != '[') {
    throw JsonLineError("key \"" + std::string(key) + "\" is not an array of token ids");
  }
  std::vector<int64_t> ids;
  std::string_view rest = value->substr(1);
  while (true) {
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t' || rest.front() == ',' ||
                             rest.front() == '\r' || rest.front() == '\n')) {
      rest.remove_prefix(1);
    }
    if (rest.empty() || rest.front() == ']') break;
    const std::string number(rest.substr(0, rest.find_first_of(", \t\r\n]")));
    char* end = nullptr;
    errno = 0;
    const long long id = std::strtoll(number.c_str(), &end, 10);
    if (number.empty() || end != number.c_str() + number.size() || errno == ERANGE) {
      throw JsonLineError("key \"" + std::string(key) + "\" holds '" + number + "', not an integer token id");
    }
    ids.push_back(id);
    rest.remove_prefix(number.size());
  }
  return ids;
}

}  // namespace megatune::executor::data
