// comparison_html: one self-contained HTML page (inline CSS and SVG, no script, nothing fetched) with the
// predicted-vs-measured plots: per-kind bars, both timelines of a rank one above the other, memory side by
// side.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "base/html_escape.h"
#include "calibration/compare_report.h"

namespace megatune::calibration {
namespace {

std::string svg_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// A fixed colour per op kind.
const char* kind_colour(layouts::OpKind kind) {
  static const char* palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
                                  "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#1f77b4", "#aec7e8",
                                  "#ffbb78", "#98df8a", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                  "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"};
  return palette[static_cast<int>(kind) % (sizeof palette / sizeof palette[0])];
}

constexpr const char* kPredicted = "#4e79a7";
constexpr const char* kMeasured = "#e15759";

// Two horizontal bars per kind, each panel scaled to its own largest value: absolute times and shares.
std::string kind_bars(const RankComparison& r) {
  const int row = 34, label_w = 150, bar_w = 320, gap = 60;
  const int height = 30 + row * static_cast<int>(r.kinds.size());
  double pmax = 0, mmax = 0, ptotal = 0, mtotal = 0;
  for (const KindComparison& k : r.kinds) {
    pmax = std::max(pmax, k.predicted_s), mmax = std::max(mmax, k.measured_s);
    ptotal += k.predicted_s, mtotal += k.measured_s;
  }
  const double tmax = std::max(pmax, mmax);
  std::ostringstream s;
  s << "<svg class=\"kinds\" width=\"" << label_w + 2 * bar_w + gap + 80 << "\" height=\"" << height
    << "\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">\n"
    << "<text x=\"" << label_w
    << "\" y=\"14\" font-weight=\"bold\">time per iteration (common scale)</text>\n"
    << "<text x=\"" << label_w + bar_w + gap << "\" y=\"14\" font-weight=\"bold\">share of op time</text>\n";
  int y = 26;
  for (const KindComparison& k : r.kinds) {
    const char* name = layouts::op_kind_name(k.kind);
    s << "<text x=\"" << label_w - 6 << "\" y=\"" << y + 16 << "\" text-anchor=\"end\">" << name
      << "</text>\n";
    auto bar = [&](double x0, double value, double scale, int dy, const char* colour,
                   const std::string& tip) {
      const double w = scale > 0 ? bar_w * value / scale : 0;
      s << "<rect x=\"" << x0 << "\" y=\"" << y + dy << "\" width=\"" << svg_number(std::max(w, 0.5))
        << "\" height=\"12\" fill=\"" << colour << "\"><title>" << base::html_escape(tip)
        << "</title></rect>\n";
    };
    const std::string p = std::string(name) + " predicted " + format_seconds(k.predicted_s);
    const std::string m = std::string(name) + " measured " + format_seconds(k.measured_s);
    bar(label_w, k.predicted_s, tmax, 2, kPredicted, p);
    bar(label_w, k.measured_s, tmax, 16, kMeasured, m);
    bar(label_w + bar_w + gap, ptotal > 0 ? k.predicted_s / ptotal : 0, 1.0, 2, kPredicted, p);
    bar(label_w + bar_w + gap, mtotal > 0 ? k.measured_s / mtotal : 0, 1.0, 16, kMeasured, m);
    s << "<text x=\"" << label_w + 2 * bar_w + gap + 4 << "\" y=\"" << y + 16 << "\">"
      << base::html_escape(format_ratio(k.measured_s, k.predicted_s)) << "</text>\n";
    y += row;
  }
  s << "</svg>\n";
  return s.str();
}

// Predicted lane above the measured lane, each scaled to its own span, one rect per op.
std::string timelines(const RankComparison& r) {
  const int width = 1100, left = 90, lane_h = 34;
  double pspan = 0, mspan = 0;
  for (const ComparedOp& o : r.ops) {
    if (o.predicted_s >= 0) pspan = std::max(pspan, o.predicted_start_s + o.predicted_s);
    mspan = std::max(mspan, o.measured_start_s + o.measured_first_s);
  }
  std::ostringstream s;
  s << "<svg class=\"timeline\" width=\"" << width + left + 10 << "\" height=\"" << 2 * lane_h + 50
    << "\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">\n";
  auto lane = [&](int y, const char* name, double span, bool predicted) {
    s << "<text x=\"4\" y=\"" << y + 14 << "\">" << name << "</text>\n"
      << "<text x=\"4\" y=\"" << y + 28 << "\" fill=\"#555\">" << base::html_escape(format_seconds(span))
      << "</text>\n"
      << "<rect x=\"" << left << "\" y=\"" << y << "\" width=\"" << width << "\" height=\"" << lane_h - 6
      << "\" fill=\"#f4f4f4\"/>\n";
    if (span <= 0) return;
    for (const ComparedOp& o : r.ops) {
      const double start = predicted ? o.predicted_start_s : o.measured_start_s;
      const double duration = predicted ? o.predicted_s : o.measured_first_s;
      if (duration < 0) continue;
      const bool comm = o.op.is_communication();
      s << "<rect x=\"" << svg_number(left + width * start / span) << "\" y=\"" << y + (comm ? 16 : 0)
        << "\" width=\"" << svg_number(std::max(0.3, width * duration / span)) << "\" height=\""
        << (comm ? 12 : 15) << "\" fill=\"" << kind_colour(o.op.kind) << "\"><title>" << o.id << " "
        << base::html_escape(layouts::to_string(o.op)) << ": " << base::html_escape(format_seconds(duration))
        << "</title></rect>\n";
    }
  };
  lane(8, "predicted", pspan, true);
  lane(8 + lane_h, "measured", mspan, false);
  // Legend of the kinds present.
  std::vector<layouts::OpKind> present;
  for (const KindComparison& k : r.kinds) present.push_back(k.kind);
  int x = left;
  for (layouts::OpKind kind : present) {
    s << "<rect x=\"" << x << "\" y=\"" << 2 * lane_h + 24 << "\" width=\"10\" height=\"10\" fill=\""
      << kind_colour(kind) << "\"/><text x=\"" << x + 13 << "\" y=\"" << 2 * lane_h + 33 << "\">"
      << layouts::op_kind_name(kind) << "</text>\n";
    x += 16 + 7 * static_cast<int>(std::string(layouts::op_kind_name(kind)).size()) + 10;
  }
  s << "</svg>\n";
  return s.str();
}

// One stacked column per memory source, on a common scale.
std::string memory_bars(const std::vector<MemoryColumn>& columns) {
  const int col_w = 120, gap = 150, height = 320, top = 20;
  double vmax = 0, vmin = 0;
  for (const MemoryColumn& c : columns) {
    if (c.total_bytes <= 0) continue;
    vmax = std::max(vmax, static_cast<double>(c.total_bytes));
    vmin =
        vmin == 0 ? static_cast<double>(c.total_bytes) : std::min(vmin, static_cast<double>(c.total_bytes));
  }
  // Totals ten times apart would leave the small columns invisible: then each column fills the height.
  const bool own_scale = vmin > 0 && vmax > 10 * vmin;
  std::ostringstream s;
  if (own_scale) s << "<p>Columns differ more than tenfold: each is scaled to its own total.</p>\n";
  s << "<svg class=\"memory\" width=\"" << static_cast<int>(columns.size()) * (col_w + gap) + 20
    << "\" height=\"" << height + 60 << "\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">\n";
  for (std::size_t i = 0; i < columns.size(); ++i) {
    const MemoryColumn& c = columns[i];
    const int x = 10 + static_cast<int>(i) * (col_w + gap);
    s << "<text x=\"" << x << "\" y=\"" << top + height + 16 << "\" font-weight=\"bold\">"
      << base::html_escape(c.name) << "</text>\n<text x=\"" << x << "\" y=\"" << top + height + 30 << "\">"
      << (c.total_bytes < 0 ? "n/a"
                            : base::html_escape(planner::format_bytes(static_cast<double>(c.total_bytes))))
      << "</text>\n";
    if (c.total_bytes <= 0 || vmax <= 0) continue;
    const double scale = own_scale ? static_cast<double>(c.total_bytes) : vmax;
    double y = top + height;
    int index = 0;
    for (const auto& [name, bytes] : c.items) {
      const double h = height * static_cast<double>(bytes) / scale;
      y -= h;
      s << "<rect x=\"" << x << "\" y=\"" << svg_number(y) << "\" width=\"" << col_w << "\" height=\""
        << svg_number(std::max(h, 0.3)) << "\" fill=\"" << kind_colour(static_cast<layouts::OpKind>(index++))
        << "\" stroke=\"#fff\" stroke-width=\"0.5\"><title>" << base::html_escape(name) << ": "
        << base::html_escape(planner::format_bytes(static_cast<double>(bytes))) << "</title></rect>\n";
      if (h >= 11)
        s << "<text x=\"" << x + col_w + 4 << "\" y=\"" << svg_number(y + h / 2 + 4) << "\">"
          << base::html_escape(name.substr(0, 24)) << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

void write_head(std::ostringstream& h, const std::string& title) {
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>megatune compare: "
    << base::html_escape(title)
    << "</title>\n<style>body{font-family:sans-serif;margin:20px;color:#222}"
       "table{border-collapse:collapse;margin:8px 0 18px}td,th{border:1px solid #ccc;padding:3px 8px;"
       "text-align:right;font-size:13px}th{background:#eee}td.l,th.l{text-align:left}"
       ".legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 "
       "12px}</style></head>\n<body>\n";
}

// One run's sections: its heading, summary, memory, and per rank the kind bars, timelines and worst ops.
void write_report(std::ostringstream& h, const RunComparison& c, int top_ops, int max_timeline_ranks) {
  h << "<h1>Predicted vs measured: " << base::html_escape(c.model) << "</h1>\n<p>"
    << base::html_escape(c.layout) << ", " << c.world_size << " rank(s) on " << base::html_escape(c.device)
    << ". Run <code>" << base::html_escape(c.run_dir) << "</code>; simulated on "
    << base::html_escape(c.cluster) << ", priced from " << base::html_escape(c.priced_from)
    << ". Measured by " << base::html_escape(c.timing) << ".</p>\n";
  for (const std::string& note : c.notes) h << "<p><b>Note:</b> " << base::html_escape(note) << "</p>\n";
  h << "<p class=\"legend\"><span style=\"background:" << kPredicted
    << "\"></span>predicted<span style=\"background:" << kMeasured << "\"></span>measured</p>\n";
  h << "<h2 id=\"summary\">Summary</h2>\n<table><tr><th class=\"l\"></th><th>predicted</th><th>measured</th>"
       "<th>measured/predicted</th></tr>\n";
  for (const SummaryRow& r : summary_rows(c))
    h << "<tr><td class=\"l\">" << r.name << "</td><td>" << base::html_escape(r.predicted) << "</td><td>"
      << base::html_escape(r.measured) << "</td><td>" << base::html_escape(r.ratio) << "</td></tr>\n";
  h << "</table>\n<h2 id=\"memory\">Memory</h2>\n"
    << memory_bars(c.memory) << "<table><tr><th class=\"l\">source</th>"
    << "<th>total</th><th class=\"l\">note</th></tr>\n";
  for (const MemoryColumn& m : c.memory)
    h << "<tr><td class=\"l\">" << base::html_escape(m.name) << "</td><td>"
      << (m.total_bytes < 0 ? "n/a"
                            : base::html_escape(planner::format_bytes(static_cast<double>(m.total_bytes))))
      << "</td><td class=\"l\">" << base::html_escape(m.note) << "</td></tr>\n";
  h << "</table>\n";
  int shown = 0;
  for (const RankComparison& r : c.ranks) {
    h << "<h2 id=\"rank" << r.rank << "\">Rank " << r.rank << " (pp" << r.pp << " tp" << r.tp << " dp" << r.dp
      << " cp" << r.cp << ")</h2>\n<h3>Per op kind</h3>\n"
      << kind_bars(r);
    if (shown++ < max_timeline_ranks)
      h << "<h3>Timelines (predicted: simulated rank " << r.simulated_rank
        << "; measured: first traced iteration; each scaled to its own span)</h3>\n"
        << timelines(r);
    h << "<h3>Worst ops first</h3>\n<table><tr><th>id</th><th "
         "class=\"l\">op</th><th>predicted</th><th>measured</th>"
         "<th>measured/predicted</th></tr>\n";
    for (const ComparedOp& o : worst_offenders(r, static_cast<std::size_t>(top_ops)))
      h << "<tr><td>" << o.id << "</td><td class=\"l\">" << base::html_escape(layouts::to_string(o.op))
        << "</td><td>" << (o.predicted_s < 0 ? "-" : base::html_escape(format_seconds(o.predicted_s)))
        << "</td><td>" << base::html_escape(format_seconds(o.measured_s)) << "</td><td>"
        << base::html_escape(format_ratio(o.measured_s, o.predicted_s)) << "</td></tr>\n";
    h << "</table>\n";
  }
}

// Signed step-time error per run, (predicted - measured) / measured, as bars left (optimistic) and right of
// 0.
std::string error_bars(const std::vector<RunComparison>& runs) {
  const int row = 22, label_w = 420, half = 220;
  double emax = 0.01;
  for (const RunComparison& c : runs) emax = std::max(emax, std::fabs(step_time_error(c)));
  std::ostringstream s;
  s << "<svg class=\"errors\" width=\"" << label_w + 2 * half + 80 << "\" height=\""
    << 30 + row * static_cast<int>(runs.size())
    << "\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">\n"
    << "<line x1=\"" << label_w + half << "\" y1=\"4\" x2=\"" << label_w + half << "\" y2=\""
    << 24 + row * static_cast<int>(runs.size()) << "\" stroke=\"#888\"/>\n";
  int y = 10;
  for (const RunComparison& c : runs) {
    const double e = step_time_error(c), w = half * std::fabs(e) / emax;
    s << "<text x=\"" << label_w - 6 << "\" y=\"" << y + 12 << "\" text-anchor=\"end\">"
      << base::html_escape(c.run_dir) << ": " << base::html_escape(c.layout) << "</text>\n<rect x=\""
      << svg_number(e < 0 ? label_w + half - w : label_w + half) << "\" y=\"" << y << "\" width=\""
      << svg_number(std::max(w, 0.5)) << "\" height=\"14\" fill=\"" << (e < 0 ? kPredicted : kMeasured)
      << "\"><title>" << svg_number(100 * e) << " %</title></rect>\n<text x=\"" << label_w + 2 * half + 6
      << "\" y=\"" << y + 12 << "\">" << svg_number(100 * e) << " %</text>\n";
    y += row;
  }
  s << "</svg>\n";
  return s.str();
}

}  // namespace

std::string comparison_html(const RunComparison& c, int top_ops, int max_timeline_ranks) {
  std::ostringstream h;
  write_head(h, c.model);
  write_report(h, c, top_ops, max_timeline_ranks);
  h << "</body></html>\n";
  return h.str();
}

std::string comparison_html(const std::vector<RunComparison>& runs, int top_ops, int max_timeline_ranks) {
  std::ostringstream h;
  write_head(h, std::to_string(runs.size()) + " runs");
  h << "<h1>Predicted vs measured: " << runs.size()
    << " runs</h1>\n<p>Step-time error per run, (predicted - "
       "measured) / measured: left of the line the prediction is optimistic. Kendall tau of the two "
       "rankings: "
    << svg_number(kendall_tau(runs)) << ".</p>\n"
    << error_bars(runs)
    << "<table><tr><th class=\"l\">run</th><th class=\"l\">layout</th><th>predicted</th><th>measured</th>"
       "<th>error</th></tr>\n";
  for (const RunComparison& c : runs)
    h << "<tr><td class=\"l\">" << base::html_escape(c.run_dir) << "</td><td class=\"l\">"
      << base::html_escape(c.layout) << "</td><td>" << base::html_escape(format_seconds(c.predicted_step_s))
      << "</td><td>" << base::html_escape(format_seconds(c.measured_step_s)) << "</td><td>"
      << svg_number(100 * step_time_error(c)) << " %</td></tr>\n";
  h << "</table>\n";
  for (const RunComparison& c : runs) write_report(h, c, top_ops, max_timeline_ranks);
  h << "</body></html>\n";
  return h.str();
}

}  // namespace megatune::calibration
