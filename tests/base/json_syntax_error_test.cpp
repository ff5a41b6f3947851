// json_syntax_error: byte offsets as line:column, nlohmann-json messages without the library's prefix.
#include "base/json_syntax_error.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace megatune::base {
namespace {

TEST(JsonSyntaxError, OffsetsBecomeLineAndColumn) {
  const std::string text = "{\n  \"a\": 1,\n  \"b\": x\n}";
  EXPECT_EQ(json_text_position(text, 0).line, 1);
  EXPECT_EQ(json_text_position(text, 0).column, 1);
  const JsonTextPosition x = json_text_position(text, text.find('x'));
  EXPECT_EQ(x.line, 3);
  EXPECT_EQ(x.column, 8);
  const JsonTextPosition past_end = json_text_position(text, text.size() + 5);
  EXPECT_EQ(past_end.line, 4);
  EXPECT_EQ(past_end.column, 2);
  EXPECT_EQ(json_error_offset(0), 0u);
  EXPECT_EQ(json_error_offset(7), 6u);
}

TEST(JsonSyntaxError, LibraryMessagesLoseTheirPrefix) {
  try {
    const nlohmann::json parsed = nlohmann::json::parse("[1, x]");
    FAIL() << parsed.dump();
  } catch (const nlohmann::json::parse_error& error) {
    EXPECT_EQ(json_text_position("[1, x]", json_error_offset(error.byte)).column, 5);
    const std::string problem = json_error_problem(error.what());
    EXPECT_EQ(problem.rfind("syntax error while parsing value", 0), 0u) << problem;
  }
  EXPECT_EQ(json_error_problem("[json.exception.out_of_range.406] number overflow parsing '1e999'"),
            "number overflow parsing '1e999'");
  EXPECT_EQ(json_error_problem("plain text"), "plain text");
}

}  // namespace
}  // namespace megatune::base
