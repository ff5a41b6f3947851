// The CLI boundary's one-line messages (database, CUDA and allocation failures without file:line) and the
// numeric flag validators (NaN, infinities, zero, negatives, ranges stated by their real bounds).
#include "tools/error_messages.h"

#include <gtest/gtest.h>

#include <new>

#include "base/user_error.h"
#include "cost_models/sqlite_database.h"
#include "tools/input_checks.h"

namespace megatune::tools {
namespace {

TEST(ErrorMessages, SqliteFailuresLoseTheirSourceLocation) {
  const cost_models::SqliteError error(
      "cost_models/sqlite_database.cpp:23: sqlite3_step(...): attempt to write "
      "a readonly database (code 8)",
      8, "attempt to write a readonly database");
  const std::string line = user_facing_message(error);
  EXPECT_EQ(line.find(".cpp"), std::string::npos) << line;
  EXPECT_NE(line.find("attempt to write a readonly database"), std::string::npos) << line;
  EXPECT_NE(line.find("--db"), std::string::npos) << line;
}

TEST(ErrorMessages, CudaOutOfMemoryBecomesAdvice) {
  const std::runtime_error error(
      "/src/megatune/executor/cuda/cuda_backend.cpp:99: cudaMalloc(&arena_, bytes) failed: out of memory");
  const std::string line = user_facing_message(error);
  EXPECT_EQ(line.find("cuda_backend.cpp"), std::string::npos) << line;
  EXPECT_NE(line.find("out of memory"), std::string::npos) << line;
  EXPECT_NE(line.find("megatune plan"), std::string::npos) << line;
}

TEST(ErrorMessages, BadAllocIsSaidInWords) {
  const std::string line = user_facing_message(std::bad_alloc());
  EXPECT_EQ(line.find("std::bad_alloc"), std::string::npos) << line;
  EXPECT_NE(line.find("out of host memory"), std::string::npos) << line;
}

TEST(ErrorMessages, UserErrorsPassThroughAndBugsKeepTheirLocation) {
  EXPECT_EQ(user_facing_message(UserError("--tp 3: use 1, 2, 4 or 8")), "--tp 3: use 1, 2, 4 or 8");
  const std::string bug = user_facing_message(std::logic_error("planner/search.cpp:12: impossible"));
  EXPECT_NE(bug.find("internal error"), std::string::npos);
  EXPECT_NE(bug.find("search.cpp:12"), std::string::npos);
  EXPECT_EQ(without_source_location("a/b.cpp:12: text"), "text");
  EXPECT_EQ(without_source_location("plain"), "plain");
  EXPECT_EQ(without_source_location("rank 3: x/cuda_backend.cpp:99: cudaMalloc failed"),
            "rank 3: cudaMalloc failed");
}

std::string check(const CLI::Validator& validator, std::string value) { return validator(value); }

TEST(InputChecks, RejectNonFiniteAndOutOfRange) {
  for (const char* bad : {"nan", "NaN", "inf", "-inf", "1e999", "abc", ""}) {
    EXPECT_FALSE(check(positive_number(), bad).empty()) << bad;
    EXPECT_FALSE(check(finite_number(), bad).empty()) << bad;
  }
  EXPECT_TRUE(check(positive_number(), "1e-4").empty());
  EXPECT_FALSE(check(positive_number(), "0").empty());
  EXPECT_FALSE(check(positive_number(), "-1").empty());
  EXPECT_TRUE(check(non_negative_number(), "0").empty());
  EXPECT_FALSE(check(non_negative_number(), "-0.1").empty());
  EXPECT_TRUE(check(fraction_in(0, 1, false), "0.999").empty());
  EXPECT_FALSE(check(fraction_in(0, 1, false), "1").empty());
  EXPECT_TRUE(check(fraction_in(0, 1, true), "1").empty());
  EXPECT_FALSE(check(fraction_in(0, 1, true), "2").empty());
  EXPECT_TRUE(check(integer_at_least(1), "3").empty());
  const std::string zero = check(integer_at_least(1), "0");
  EXPECT_NE(zero.find("at least 1"), std::string::npos) << zero;
  EXPECT_FALSE(check(integer_at_least(1), "2.5").empty());
  EXPECT_FALSE(check(integer_between(1, 8), "9").empty());
  EXPECT_FALSE(check(integer_between(1, 8), "99999999999999999999").empty());
  EXPECT_THROW(parse_finite("nan", "--lr"), UserError);
  EXPECT_EQ(parse_finite("0.5", "--lr"), 0.5);
}

}  // namespace
}  // namespace megatune::tools
