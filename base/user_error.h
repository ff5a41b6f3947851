// UserError: bad user input (flags, layout strings, model/cluster files, databases, datasets, checkpoints).
// Its message is one line that names the input and says how to fix it; the CLI prints it and exits 1.
#pragma once
#include <stdexcept>
#include <string>

namespace megatune {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& one_line_message) : std::runtime_error(one_line_message) {}
};

}  // namespace megatune
