// ProgressBar rendering.
#include "tools/progress_bar.h"

#include <algorithm>
#include <cstdio>
#include <ostream>

namespace megatune::tools {

std::string format_duration(double seconds) {
  char text[32];
  if (seconds < 1.0) {
    std::snprintf(text, sizeof text, "%.0fms", seconds * 1e3);
  } else if (seconds < 60.0) {
    std::snprintf(text, sizeof text, "%.0fs", seconds);
  } else if (seconds < 3600.0) {
    const int s = static_cast<int>(seconds + 0.5);
    std::snprintf(text, sizeof text, "%dm%02ds", s / 60, s % 60);
  } else {
    const int m = static_cast<int>(seconds / 60.0 + 0.5);
    std::snprintf(text, sizeof text, "%dh%02dm", m / 60, m % 60);
  }
  return text;
}

ProgressBar::ProgressBar(std::ostream& out, std::string label, std::size_t total, bool interactive,
                         Units units)
    : out_(out),
      label_(std::move(label)),
      total_(total),
      interactive_(interactive),
      units_(units),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

std::string ProgressBar::render(std::size_t done, std::size_t total, double elapsed_s, int width,
                                Units units) {
  const double fraction = total == 0 ? 1.0 : std::min(1.0, double(done) / double(total));
  const int filled = static_cast<int>(fraction * width + 1e-9);
  std::string bar = "[" + std::string(filled, '#') + std::string(width - filled, ' ') + "]";
  char text[96];
  if (units == Units::kBytes) {
    std::snprintf(text, sizeof text, " %.1f/%.1f MB %3.0f%%", double(done) / 1e6, double(total) / 1e6,
                  fraction * 100.0);
  } else {
    std::snprintf(text, sizeof text, " %zu/%zu %3.0f%%", done, total, fraction * 100.0);
  }
  std::string out = bar + text;
  if (done > 0 && done < total) {
    out += " eta " + format_duration(elapsed_s / double(done) * double(total - done));
  } else if (done >= total) {
    out += " in " + format_duration(elapsed_s);
  }
  return out;
}

void ProgressBar::update(std::size_t done, const std::string& detail) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < show_after_s_) return;
  drawn_ = true;
  if (interactive_) {
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    std::string line = label_ + " " + render(done, total_, elapsed, 30, units_);
    if (!detail.empty()) line += "  " + detail;
    if (line.size() > 118) line.resize(118);
    out_ << "\r" << line << "\x1b[K" << std::flush;
    return;
  }
  const int decile = total_ == 0 ? 10 : static_cast<int>(10 * std::min(done, total_) / total_);
  if (decile == last_decile_) return;
  last_decile_ = decile;
  out_ << label_ << " " << render(done, total_, elapsed, 30, units_) << (detail.empty() ? "" : "  ") << detail
       << "\n"
       << std::flush;
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (interactive_ && drawn_) out_ << "\n" << std::flush;
}

}  // namespace megatune::tools
