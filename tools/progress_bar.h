// ProgressBar: one line on a terminal redrawn in place ("[#####     ] 120/480 25% eta 1m20s  gemm ..."),
// or, when the stream is not a terminal (logs), one line per 10% so logs stay short; optionally only once
// the work has run a while. The one progress bar
// of the CLI: profile sweeps, the plan search, data preprocessing.
#pragma once
#include <chrono>
#include <cstddef>
#include <iosfwd>
#include <string>

namespace megatune::tools {

class ProgressBar {
 public:
  enum class Units { kItems, kBytes };  // "40/100" or "40.0/100.0 MB"

  // `interactive`: redraw in place (pass isatty(fileno(stderr)) for std::cerr).
  ProgressBar(std::ostream& out, std::string label, std::size_t total, bool interactive,
              Units units = Units::kItems);
  void set_total(std::size_t total) { total_ = total; }  // when the total is known only once work runs
  // Draw nothing until the work has run this long (work that ends sooner shows no bar at all).
  void show_after(double seconds) { show_after_s_ = seconds; }
  void update(std::size_t done, const std::string& detail = "");
  void finish();  // ends the line (idempotent)
  // "[####      ] 40/100  40% eta 12s" for `done` of `total` after `elapsed_s` (pure, for tests).
  static std::string render(std::size_t done, std::size_t total, double elapsed_s, int width = 30,
                            Units units = Units::kItems);

 private:
  std::ostream& out_;
  std::string label_;
  std::size_t total_;
  bool interactive_;
  Units units_;
  bool finished_ = false;
  bool drawn_ = false;
  double show_after_s_ = 0.0;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

std::string format_duration(double seconds);  // "850ms", "12s", "3m05s", "1h02m"

}  // namespace megatune::tools
