// CLI11 validators for numeric flags with one-line messages that name the real bound.
#include "tools/input_checks.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "base/user_error.h"

namespace megatune::tools {
namespace {

// The number in `text`, or a reason it is none; NaN and infinities are reasons too.
bool read_number(const std::string& text, double& value, std::string& reason) {
  char* end = nullptr;
  errno = 0;
  value = std::strtod(text.c_str(), &end);
  if (text.empty() || end == text.c_str() || *end != '\0') {
    reason = "'" + text + "' is not a number";
    return false;
  }
  if (std::isnan(value) || std::isinf(value) || errno == ERANGE) {
    reason = text + " is not a finite number";
    return false;
  }
  return true;
}

bool read_integer(const std::string& text, long long& value, std::string& reason) {
  char* end = nullptr;
  errno = 0;
  value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == text.c_str() || *end != '\0') {
    reason = "'" + text + "' is not an integer";
    return false;
  }
  if (errno == ERANGE) {
    reason = text + " is too large";
    return false;
  }
  return true;
}

std::string number_text(double value) {
  std::string text = std::to_string(value);
  text.erase(text.find_last_not_of('0') + 1);
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

CLI::Validator number_check(const std::string& description, bool (*ok)(double), const std::string& need) {
  return CLI::Validator(
      [ok, need](std::string& text) -> std::string {
        double value = 0;
        std::string reason;
        if (!read_number(text, value, reason)) return reason + "; give " + need;
        if (!ok(value)) return "value " + text + " is not allowed; give " + need;
        return {};
      },
      description);
}

}  // namespace

CLI::Validator finite_number() {
  return number_check(
      "FINITE", [](double) { return true; }, "a finite number");
}

CLI::Validator positive_number() {
  return number_check(
      "POSITIVE", [](double v) { return v > 0; }, "a number greater than 0");
}

CLI::Validator non_negative_number() {
  return number_check(
      "NON-NEGATIVE", [](double v) { return v >= 0; }, "a number of at least 0");
}

CLI::Validator fraction_in(double low, double high, bool high_inclusive) {
  const std::string need =
      "a number in [" + number_text(low) + ", " + number_text(high) + (high_inclusive ? "]" : ")");
  return CLI::Validator(
      [low, high, high_inclusive, need](std::string& text) -> std::string {
        double value = 0;
        std::string reason;
        if (!read_number(text, value, reason)) return reason + "; give " + need;
        if (value < low || value > high || (!high_inclusive && value == high))
          return "value " + text + " is outside " + need.substr(std::string("a number in ").size()) +
                 "; give " + need;
        return {};
      },
      "[" + number_text(low) + ", " + number_text(high) + (high_inclusive ? "]" : ")"));
}

CLI::Validator integer_at_least(long long minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        long long value = 0;
        std::string reason;
        if (!read_integer(text, value, reason))
          return reason + "; give an integer of at least " + std::to_string(minimum);
        if (value < minimum) return "value " + text + " must be at least " + std::to_string(minimum);
        return {};
      },
      "INT>=" + std::to_string(minimum));
}

CLI::Validator integer_between(long long minimum, long long maximum) {
  return CLI::Validator(
      [minimum, maximum](std::string& text) -> std::string {
        long long value = 0;
        std::string reason;
        const std::string need =
            "an integer from " + std::to_string(minimum) + " to " + std::to_string(maximum);
        if (!read_integer(text, value, reason)) return reason + "; give " + need;
        if (value < minimum || value > maximum)
          return "value " + text + " must be from " + std::to_string(minimum) + " to " +
                 std::to_string(maximum);
        return {};
      },
      "INT in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
}

double parse_finite(const std::string& text, const std::string& flag) {
  double value = 0;
  std::string reason;
  if (!read_number(text, value, reason)) throw UserError(flag + ": " + reason + "; give a finite number");
  return value;
}

}  // namespace megatune::tools
