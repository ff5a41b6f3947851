// `megatune report --run DIR`: a run's TensorBoard scalars summarized and charted (HTML with inline SVG,
// checked in headless Chromium when it is installed); a directory without event files and a damaged one
// get one line.
#include <gtest/gtest.h>

#include <filesystem>

#include "tests/tools/cli_harness.h"

namespace megatune::tests {
namespace {

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(CliReport, ChartsTheRunsCurves) {
  TempDir dir;
  const CliResult trained = run_megatune({"train",
                                          "--model",
                                          "tiny",
                                          "--device",
                                          "cpu",
                                          "--mock-data",
                                          "--train-iters",
                                          "12",
                                          "--gbs",
                                          "4",
                                          "--mbs",
                                          "2",
                                          "--log-interval",
                                          "4",
                                          "--eval-interval",
                                          "4",
                                          "--eval-iters",
                                          "1",
                                          "--tensorboard-dir",
                                          dir / "tb"},
                                         120);
  ASSERT_EQ(trained.exit_code, 0) << trained.err;
  const CliResult r = run_megatune({"report", "--run", dir / "tb", "--html", dir / "run.html"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string squeezed;  // the summary with each run of spaces as one
  for (char ch : r.out)
    if (ch != ' ' || squeezed.empty() || squeezed.back() != ' ') squeezed += ch;
  for (const std::string line : {"lm loss 12 1 12 ", "lm loss validation 3 4 12 ", "throughput 3 4 12 "})
    EXPECT_NE(squeezed.find("\n " + line), std::string::npos) << line << "\n" << r.out;
  const std::string html = read_text(dir / "run.html");
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  // Loss (training, validation; the test split's one point is a dot), learning rate, grad norm,
  // throughput, iteration time, memory.
  EXPECT_EQ(count(html, "<polyline"), 7);
  EXPECT_EQ(count(html, "<circle"), 1);
  EXPECT_EQ(count(html, "<svg"), 6);

  if (std::filesystem::exists("/usr/bin/chromium")) {
    const std::string command =
        "/usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
        "--disable-background-networking --disable-component-update --disable-sync --user-data-dir=" +
        (dir / "profile") + " --dump-dom file://" + (dir / "run.html") + " 2>/dev/null";
    FILE* pipe = ::popen(command.c_str(), "r");
    ASSERT_NE(pipe, nullptr);
    std::string dom;
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) dom.append(buffer, n);
    EXPECT_EQ(::pclose(pipe), 0);
    EXPECT_EQ(count(dom, "<polyline"), 7);  // the browser parsed every curve
    EXPECT_NE(dom.find("Learning rate"), std::string::npos);
  }

  // A directory without event files, and a damaged file: one line each, naming it.
  std::filesystem::create_directories(dir / "empty");
  const CliResult empty = run_megatune({"report", "--run", dir / "empty"}, 60);
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_EQ(empty.error_lines(), 1) << empty.err;
  EXPECT_NE(empty.err.find("holds no TensorBoard event file"), std::string::npos) << empty.err;
  for (const auto& entry : std::filesystem::directory_iterator(dir / "tb")) {
    std::string bytes = read_text(entry.path().string());
    bytes[bytes.size() / 2] ^= 0x40;
    write_text(entry.path().string(), bytes);
  }
  const CliResult damaged = run_megatune({"report", "--run", dir / "tb"}, 60);
  EXPECT_EQ(damaged.exit_code, 1);
  EXPECT_EQ(damaged.error_lines(), 1) << damaged.err;
  EXPECT_NE(damaged.err.find("the event file is damaged"), std::string::npos) << damaged.err;
}

}  // namespace
}  // namespace megatune::tests
