// JsonLine: one JSONL line parsed by nlohmann-json (RFC 8259 values; the top level must be an object).
#include "executor/data/json_line.h"

#include <nlohmann/json.hpp>

#include "base/json_syntax_error.h"

namespace megatune::executor::data {

JsonLine::JsonLine(std::string_view line) {
  auto object = std::make_shared<nlohmann::json>();
  try {
    *object = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& error) {
    const base::JsonTextPosition at = base::json_text_position(line, base::json_error_offset(error.byte));
    throw JsonLineError(base::json_error_problem(error.what()) + " at column " + std::to_string(at.column));
  } catch (const nlohmann::json::exception& error) {  // a number out of range
    throw JsonLineError(base::json_error_problem(error.what()));
  }
  if (!object->is_object())
    throw JsonLineError("a JSONL line must be a JSON object, not " + std::string(object->type_name()) +
                        " at column 1");
  object_ = std::move(object);
}

bool JsonLine::has(std::string_view key) const { return object_->contains(key); }

const nlohmann::json& JsonLine::field(std::string_view key) const {
  const auto found = object_->find(key);
  if (found == object_->end()) throw JsonLineError("no key \"" + std::string(key) + "\"");
  return *found;
}

std::string JsonLine::string_field(std::string_view key) const {
  const nlohmann::json& value = field(key);
  if (!value.is_string()) throw JsonLineError("key \"" + std::string(key) + "\" is not a string");
  return value.get<std::string>();
}

std::vector<int64_t> JsonLine::integer_array_field(std::string_view key) const {
  const nlohmann::json& value = field(key);
  if (!value.is_array()) {
    throw JsonLineError("key \"" + std::string(key) + "\" is not an array of token ids");
  }
  std::vector<int64_t> ids;
  ids.reserve(value.size());
  for (const nlohmann::json& id : value) {
    const bool fits =
        id.is_number_integer() && (!id.is_number_unsigned() || id.get<uint64_t>() <= uint64_t{INT64_MAX});
    if (!fits) {
      throw JsonLineError("key \"" + std::string(key) + "\" holds '" +
                          id.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                          "', not an integer token id");
    }
    ids.push_back(id.get<int64_t>());
  }
  return ids;
}

}  // namespace megatune::executor::data
