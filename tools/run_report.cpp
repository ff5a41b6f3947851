// The run report: TensorBoard scalars read back, summarized as text and drawn as SVG polylines.
#include "tools/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <ostream>
#include <sstream>

#include "base/html_escape.h"
#include "base/user_error.h"
#include "executor/training/tensorboard_writer.h"

namespace megatune::tools {
namespace {

namespace fs = std::filesystem;

bool is_event_file(const fs::path& p) {
  return p.filename().string().rfind("events.out.tfevents.", 0) == 0 && fs::is_regular_file(p);
}

std::string number(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.4g", v);
  }
  return buf;
}

std::string coordinate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// The charts of the page: a title and the tags drawn in it (those the run has).
struct Chart {
  const char* title;
  std::vector<std::string> tags;
};

std::vector<Chart> charts_of(const RunCurves& run) {
  std::vector<Chart> charts = {
      {"Loss", {"lm loss", "lm loss validation", "lm loss test"}},
      {"Learning rate", {"learning-rate"}},
      {"Gradient norm", {"grad-norm"}},
      {"Throughput (TFLOP/s per GPU)", {"throughput"}},
      {"MFU (%)", {"mfu"}},
      {"Iteration time (s)", {"iteration-time"}},
      {"Memory: arena (bytes)", {"mem-arena-bytes"}},
      {"MoE load-balancing loss", {"load_balancing_loss"}},
  };
  Chart mtp{"MTP losses", {}};
  for (const auto& [tag, points] : run.series)
    if (tag.rfind("mtp_", 0) == 0 && tag.find(" vs samples") == std::string::npos) mtp.tags.push_back(tag);
  if (!mtp.tags.empty()) charts.push_back(mtp);
  std::vector<Chart> present;
  for (Chart& c : charts) {
    std::vector<std::string> have;
    for (const std::string& tag : c.tags)
      if (run.series.count(tag) > 0) have.push_back(tag);
    if (!have.empty()) present.push_back({c.title, have});
  }
  return present;
}

std::string chart_svg(const RunCurves& run, const Chart& chart) {
  static const char* colours[] = {"#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1"};
  const double width = 560, height = 200, left = 70, top = 24, right = 150, bottom = 30;
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const std::string& tag : chart.tags)
    for (const auto& [step, value] : run.series.at(tag)) {
      if (!std::isfinite(value)) continue;
      x0 = std::min(x0, static_cast<double>(step));
      x1 = std::max(x1, static_cast<double>(step));
      y0 = std::min(y0, value);
      y1 = std::max(y1, value);
    }
  if (!(x1 >= x0)) x0 = x1 = 0;
  if (!(y1 >= y0)) y0 = y1 = 0;
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) {
    y0 -= std::max(1e-12, std::fabs(y0) * 0.05);
    y1 += std::max(1e-12, std::fabs(y1) * 0.05);
  }
  const auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * width; };
  const auto py = [&](double y) { return top + (1.0 - (y - y0) / (y1 - y0)) * height; };
  std::ostringstream s;
  s << "<svg class=\"curve\" width=\"" << left + width + right << "\" height=\"" << top + height + bottom
    << "\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">\n";
  s << "<text x=\"" << left << "\" y=\"14\" font-size=\"13\">" << base::html_escape(chart.title)
    << "</text>\n";
  s << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << width << "\" height=\"" << height
    << "\" fill=\"none\" stroke=\"#999\"/>\n";
  s << "<text x=\"" << left - 4 << "\" y=\"" << top + 10 << "\" text-anchor=\"end\">" << number(y1)
    << "</text>\n";
  s << "<text x=\"" << left - 4 << "\" y=\"" << top + height << "\" text-anchor=\"end\">" << number(y0)
    << "</text>\n";
  s << "<text x=\"" << left << "\" y=\"" << top + height + 16 << "\">" << static_cast<long long>(x0)
    << "</text>\n";
  s << "<text x=\"" << left + width << "\" y=\"" << top + height + 16 << "\" text-anchor=\"end\">"
    << static_cast<long long>(x1) << "</text>\n";
  s << "<text x=\"" << left + width / 2 << "\" y=\"" << top + height + 16
    << "\" text-anchor=\"middle\">iteration</text>\n";
  for (std::size_t i = 0; i < chart.tags.size(); ++i) {
    const std::string& tag = chart.tags[i];
    const char* colour = colours[i % (sizeof colours / sizeof colours[0])];
    const auto& points = run.series.at(tag);
    std::string path;
    for (const auto& [step, value] : points)
      if (std::isfinite(value))
        path += (path.empty() ? "" : " ") + coordinate(px(static_cast<double>(step))) + "," +
                coordinate(py(value));
    if (points.size() == 1) {  // one point: a dot, a line needs two
      s << "<circle cx=\"" << coordinate(px(static_cast<double>(points.front().first))) << "\" cy=\""
        << coordinate(py(points.front().second)) << "\" r=\"3\" fill=\"" << colour << "\"/>\n";
    } else {
      s << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.5\" points=\"" << path
        << "\"/>\n";
    }
    const double ly = top + 14 + 16 * static_cast<double>(i);
    s << "<line x1=\"" << left + width + 10 << "\" y1=\"" << ly - 4 << "\" x2=\"" << left + width + 26
      << "\" y2=\"" << ly - 4 << "\" stroke=\"" << colour << "\" stroke-width=\"2\"/>\n";
    s << "<text x=\"" << left + width + 30 << "\" y=\"" << ly << "\">" << base::html_escape(tag)
      << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

// The summary and the page's table list each quantity against iterations (not its " vs samples" twin).
bool is_summarized(const std::string& tag, const std::vector<std::pair<long long, double>>& points) {
  return !points.empty() && tag.find(" vs samples") == std::string::npos;
}

std::pair<double, double> value_range(const std::vector<std::pair<long long, double>>& points) {
  const auto [lo, hi] = std::minmax_element(points.begin(), points.end(),
                                            [](const auto& a, const auto& b) { return a.second < b.second; });
  return {lo->second, hi->second};
}

}  // namespace

RunCurves read_run_curves(const std::string& dir) {
  RunCurves run;
  run.dir = dir;
  std::error_code error;
  if (!fs::is_directory(dir, error))
    throw UserError("--run " + dir + " is not a directory; give a train --tensorboard-dir");
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (is_event_file(entry.path())) run.files.push_back(entry.path().string());
    if (entry.is_directory(error))
      for (const fs::directory_entry& inner : fs::directory_iterator(entry.path(), error))
        if (is_event_file(inner.path())) run.files.push_back(inner.path().string());
  }
  if (run.files.empty())
    throw UserError(
        "--run " + dir +
        " holds no TensorBoard event file (events.out.tfevents.*); give the --tensorboard-dir of a "
        "megatune train run");
  std::sort(run.files.begin(), run.files.end());
  // Name order is time order (the file names start with the seconds they were created at).
  std::map<std::string, std::map<long long, double>> by_step;
  for (const std::string& file : run.files)
    for (const executor::ScalarEvent& e : executor::read_scalar_events(file))
      by_step[e.tag][e.step] = e.value;
  for (const auto& [tag, points] : by_step) run.series[tag].assign(points.begin(), points.end());
  return run;
}

void print_run_summary(const RunCurves& run, std::ostream& out) {
  out << "megatune report: " << run.dir << " (" << run.files.size() << " event file"
      << (run.files.size() == 1 ? "" : "s") << ")\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-28s %7s %9s %9s %12s %12s %12s %12s\n", "scalar", "points", "from",
                "to", "first", "last", "min", "max");
  out << line;
  for (const auto& [tag, points] : run.series) {
    if (!is_summarized(tag, points)) continue;
    const auto [lo, hi] = value_range(points);
    std::snprintf(line, sizeof line, "  %-28s %7zu %9lld %9lld %12s %12s %12s %12s\n", tag.c_str(),
                  points.size(), points.front().first, points.back().first,
                  number(points.front().second).c_str(), number(points.back().second).c_str(),
                  number(lo).c_str(), number(hi).c_str());
    out << line;
  }
}

std::string run_report_html(const RunCurves& run) {
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>megatune report: "
    << base::html_escape(run.dir)
    << "</title>\n<style>body{font-family:sans-serif;margin:20px}svg{display:block;margin:12px 0}"
       "table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right}"
       "td:first-child,th:first-child{text-align:left}</style></head><body>\n";
  s << "<h1>Training run " << base::html_escape(run.dir) << "</h1>\n";
  for (const Chart& chart : charts_of(run)) s << chart_svg(run, chart);
  s << "<h2>Scalars</h2>\n<table><tr><th>scalar</th><th>points</th><th>last "
       "step</th><th>last</th><th>min</th>"
       "<th>max</th></tr>\n";
  for (const auto& [tag, points] : run.series) {
    if (!is_summarized(tag, points)) continue;
    const auto [lo, hi] = value_range(points);
    s << "<tr><td>" << base::html_escape(tag) << "</td><td>" << points.size() << "</td><td>"
      << points.back().first << "</td><td>" << number(points.back().second) << "</td><td>" << number(lo)
      << "</td><td>" << number(hi) << "</td></tr>\n";
  }
  s << "</table>\n</body></html>\n";
  return s.str();
}

}  // namespace megatune::tools
