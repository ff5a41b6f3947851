// `megatune train`'s flags that make no sense are refused with one line naming the flag; --load paths that
// do not exist are refused and an empty one starts fresh with a line that says so.
#include "tools/train_option_checks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include "base/user_error.h"

namespace megatune::tools {
namespace {

std::string refusal(const std::function<void(executor::TrainOptions&)>& change) {
  executor::TrainOptions options;
  change(options);
  try {
    validate_train_options(options);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(TrainOptionChecks, DefaultsPass) {
  EXPECT_EQ(refusal([](executor::TrainOptions&) {}), "");
}

TEST(TrainOptionChecks, NonsenseIsRefusedNamingTheFlag) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::string, std::function<void(executor::TrainOptions&)>>> cases = {
      {"--lr", [&](auto& o) { o.lr = nan; }},
      {"--lr", [&](auto& o) { o.lr = inf; }},
      {"--lr", [](auto& o) { o.lr = -1e-3; }},
      {"--min-lr", [](auto& o) { o.min_lr = 1.0; }},
      {"--adam-eps", [](auto& o) { o.adam_eps = 0; }},
      {"--adam-beta1", [](auto& o) { o.adam_beta1 = 2; }},
      {"--adam-beta2", [&](auto& o) { o.adam_beta2 = nan; }},
      {"--weight-decay", [](auto& o) { o.weight_decay = -0.1; }},
      {"--clip-grad", [&](auto& o) { o.clip_grad = nan; }},
      {"--init-method-std", [](auto& o) { o.init_method_std = 0; }},
      {"--norm-epsilon", [](auto& o) { o.norm_epsilon = -1; }},
      {"--rotary-base", [&](auto& o) { o.rotary_base = inf; }},
      {"--lr-warmup-fraction", [](auto& o) { o.lr_warmup_fraction = 1.5; }},
      {"--train-iters", [](auto& o) { o.train_iters = 0; }},
      {"--log-interval", [](auto& o) { o.log_interval = 0; }},
      {"--save-interval", [](auto& o) { o.save_interval = -1; }},
      {"--save-interval", [](auto& o) { o.save_interval = 10; }},  // without --save it would be ignored
  };
  for (const auto& [flag, change] : cases) {
    const std::string message = refusal(change);
    EXPECT_EQ(message.rfind(flag, 0), 0u) << flag << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

TEST(TrainOptionChecks, LoadPaths) {
  std::string pattern = (std::filesystem::temp_directory_path() / "megatune-load-XXXXXX").string();
  ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
  EXPECT_EQ(check_load_path(""), "");
  EXPECT_NE(check_load_path(pattern).find("starting a new run"), std::string::npos);
  EXPECT_THROW(check_load_path(pattern + "/typo"), UserError);
  std::filesystem::remove_all(pattern);
}

}  // namespace
}  // namespace megatune::tools
