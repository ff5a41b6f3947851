// Checks for numeric flags as CLI11 validators: a value that makes no sense (NaN, infinity, zero or negative
// where a size or rate is asked, a fraction outside its interval) is refused while parsing with one line
// naming the flag, the value and what to give, instead of being silently accepted. The messages state the
// real bound ("must be at least 1"), never a range running to the largest double.
#pragma once
#include <CLI/CLI.hpp>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace megatune::tools {

CLI::Validator finite_number();                                            // any finite number
CLI::Validator positive_number();                                          // finite and > 0
CLI::Validator non_negative_number();                                      // finite and >= 0
CLI::Validator fraction_in(double low, double high, bool high_inclusive);  // low <= x < high (or <= high)
CLI::Validator integer_at_least(long long minimum);                        // an integer >= minimum
CLI::Validator integer_between(long long minimum, long long maximum);      // minimum <= n <= maximum

// A flag whose value is one of `choices`' names (Megatron's spelling): CLI11's IsMember refuses any other
// value while parsing with one line listing the names; the chosen enum is stored in `target`.
template <typename Enum>
CLI::Option* add_choice_option(CLI::App& app, const std::string& names, std::optional<Enum>& target,
                               const std::map<std::string, Enum>& choices, const std::string& help) {
  std::vector<std::string> keys;
  for (const auto& choice : choices) keys.push_back(choice.first);
  return app
      .add_option_function<std::string>(
          names, [&target, choices](const std::string& name) { target = choices.at(name); }, help)
      ->check(CLI::IsMember(keys));
}

// Parses a floating-point flag value; NaN / inf / garbage give a one-line reason (for code that reads a
// flag as text).
double parse_finite(const std::string& text, const std::string& flag);

}  // namespace megatune::tools
