// json_quote: a JSON string literal by nlohmann-json's serializer (invalid UTF-8 becomes U+FFFD, so the
// output is always valid JSON).
#include "base/json_quote.h"

#include <nlohmann/json.hpp>

namespace megatune::base {

std::string json_quote(std::string_view text) {
  return nlohmann::json(std::string(text)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace megatune::base
