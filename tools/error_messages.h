// The CLI boundary's error lines: every exception that reaches `main` becomes one line for the user.
// Bad input (UserError) is printed as it is; a database or CUDA failure is said in words without the
// internal source location (file:line) it was raised at; running out of host memory names what to lower;
// anything else is an internal bug and keeps its location so that it can be reported.
#pragma once
#include <exception>
#include <string>

namespace megatune::tools {

// The message for `error` (without the "megatune <command>: " prefix or a newline).
std::string user_facing_message(const std::exception& error);

// "src/x.cpp:12: text" -> "text"; other text unchanged.
std::string without_source_location(const std::string& message);

}  // namespace megatune::tools
