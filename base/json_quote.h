// json_quote: a JSON string literal for any text (quotes included, control characters escaped, invalid
// UTF-8 replaced by U+FFFD). Shared by every room that writes JSON (layout reports, Chrome traces, plans,
// database exports).
#pragma once
#include <string>
#include <string_view>

namespace megatune::base {

std::string json_quote(std::string_view text);

}  // namespace megatune::base
