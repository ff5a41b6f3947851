// Text placed in HTML (the HTML pages of `compare` and `report`): &, <, > and " as their entities.
#pragma once
#include <string>

namespace megatune::base {

std::string html_escape(const std::string& text);

}  // namespace megatune::base
