// JsonValue: parsing, errors with line and column, and round-trips of the writer.
#include "cost_models/json_value.h"

#include <gtest/gtest.h>

namespace megatune::cost_models {
namespace {

TEST(JsonValue, ParsesAndDumpsRoundTrip) {
  const std::string text =
      R"({"a": [1, 2.5, -3e-7, true, false, null], "b": {"c": "x\"y\\z\n\u00e9\ud83d\ude00"}, "d": 123456789012})";
  const JsonValue value = JsonValue::parse(text);
  EXPECT_EQ(value.at("a").as_array().size(), 6u);
  EXPECT_DOUBLE_EQ(value.at("a").as_array()[2].as_number(), -3e-7);
  EXPECT_EQ(value.at("b").at("c").as_string(), "x\"y\\z\n\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(value.at("d").as_int64(), 123456789012);
  EXPECT_EQ(JsonValue::parse(value.dump()).dump(), value.dump());
  EXPECT_EQ(JsonValue::parse(value.dump(2)).dump(), value.dump());
  EXPECT_EQ(JsonValue(0.1).dump(), "0.1");
  EXPECT_EQ(JsonValue(1e-12).dump(), "1e-12");
  EXPECT_EQ(JsonValue(std::int64_t{85520809984}).dump(), "85520809984");
  for (const double x : {1.0 / 3, 989.4, 4.8e12, 1.234567890123e-4, -2.5e-300}) {
    EXPECT_EQ(JsonValue::parse(JsonValue(x).dump()).as_number(), x);
  }
}

TEST(JsonValue, ErrorsCarryLineAndColumn) {
  try {
    JsonValue::parse("{\n  \"a\": 1,\n  \"b\": tru\n}");
    FAIL();
  } catch (const JsonParseError& error) {
    EXPECT_EQ(error.line(), 3);
    EXPECT_EQ(error.column(), 11);  // the byte the parser stopped at: the newline after "tru"
    EXPECT_EQ(std::string(error.what()).rfind("line 3, column 11: syntax error", 0), 0u) << error.what();
  }
  try {
    JsonValue::parse("[1,\n 2e999]");
    FAIL();
  } catch (const JsonParseError& error) {
    EXPECT_EQ(error.line(), 2);
    EXPECT_NE(std::string(error.what()).find("column 6: number overflow parsing '2e999'"), std::string::npos)
        << error.what();
  }
  for (const char* bad : {"", "[1,]", "{\"a\" 1}", "01", "1.", "\"abc", "[1] 2", "{\"a\":1,}", "\"\\x\"",
                          "nul", "\"\\ud800\"", "1e999"}) {
    EXPECT_THROW(JsonValue::parse(bad), JsonParseError) << bad;
  }
  std::string deep(1000, '[');
  EXPECT_THROW(JsonValue::parse(deep), JsonParseError);
  EXPECT_EQ(JsonValue::parse(std::string(200, '[') + std::string(200, ']')).as_array().size(), 1u);
  EXPECT_EQ(JsonValue::parse(R"({"k": 1, "k": 2})").at("k").as_number(), 2);  // the last value wins
}

TEST(JsonValue, TypedAccessorsRefuseOtherTypes) {
  const JsonValue value = JsonValue::parse(R"({"n": 1.5, "s": "x"})");
  EXPECT_THROW(value.at("n").as_string(), std::runtime_error);
  EXPECT_THROW(value.at("n").as_int64(), std::runtime_error);
  EXPECT_THROW(value.at("missing"), std::runtime_error);
  EXPECT_EQ(value.find("missing"), nullptr);
  JsonValue built;
  built.set("k", 1).as_number();
  built.set("k", "v");
  EXPECT_EQ(built.dump(), R"({"k":"v"})");
}

}  // namespace
}  // namespace megatune::cost_models
