// Progress bar rendering and durations; the log mode prints one line per 10%.
#include "tools/progress_bar.h"

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <thread>

namespace megatune::tools {
namespace {

TEST(ProgressBar, Render) {
  EXPECT_EQ(ProgressBar::render(0, 10, 0.0, 10), "[          ] 0/10   0%");
  EXPECT_EQ(ProgressBar::render(4, 10, 8.0, 10), "[####      ] 4/10  40% eta 12s");
  EXPECT_EQ(ProgressBar::render(10, 10, 65.0, 10), "[##########] 10/10 100% in 1m05s");
  EXPECT_EQ(format_duration(0.25), "250ms");
  EXPECT_EQ(format_duration(7300), "2h02m");
}

TEST(ProgressBar, LogModePrintsEachDecileOnce) {
  std::ostringstream out;
  ProgressBar bar(out, "profile", 100, false);
  for (std::size_t i = 0; i <= 100; ++i) bar.update(i, "item");
  bar.finish();
  const std::string text = out.str();
  int lines = 0;
  for (const char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 11);  // 0%, 10%, ..., 100%
  EXPECT_NE(text.find("100/100 100%"), std::string::npos);
  EXPECT_NE(text.find("  item\n"), std::string::npos);  // the detail in log lines too
  EXPECT_EQ(ProgressBar::render(2500000, 10000000, 1.0, 4, ProgressBar::Units::kBytes),
            "[#   ] 2.5/10.0 MB  25% eta 3s");
}

// A bar told to wait draws nothing (and ends no line) while the work is younger than the wait.
TEST(ProgressBar, ShowsNothingBeforeItsDelay) {
  for (bool interactive : {false, true}) {
    std::ostringstream out;
    ProgressBar bar(out, "searching", 10, interactive);
    bar.show_after(0.05);
    for (std::size_t i = 0; i < 10; ++i) bar.update(i, "bounding");
    EXPECT_EQ(out.str(), "");
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    bar.update(10, "simulating");
    bar.finish();
    EXPECT_NE(out.str().find("10/10 100%"), std::string::npos) << out.str();
  }
  std::ostringstream out;
  ProgressBar quick(out, "searching", 10, true);
  quick.show_after(60.0);
  quick.update(10);
  quick.finish();
  EXPECT_EQ(out.str(), "");
}

}  // namespace
}  // namespace megatune::tools
