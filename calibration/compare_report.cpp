// The terminal report and the Perfetto trace of a predicted-vs-measured comparison.
#include "calibration/compare_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "planner/chrome_trace.h"

namespace megatune::calibration {
namespace {

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, fraction != 0 && fraction < 0.01 ? "%.3f %%" : "%.1f %%", 100.0 * fraction);
  return buf;
}

std::string report_line(const char* format, auto... values) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, values...);
  return buf;
}

void summary(std::ostringstream& out, const RunComparison& c) {
  out << report_line("\n  %-22s %14s %14s %12s\n", "", "predicted", "measured", "meas/pred");
  for (const SummaryRow& r : summary_rows(c))
    out << report_line("  %-22s %14s %14s %12s\n", r.name.c_str(), r.predicted.c_str(), r.measured.c_str(),
                       r.ratio.c_str());
}

// Items of two breakdowns whose bytes differ (by name; missing counts as 0).
void item_differences(std::ostringstream& out, const MemoryColumn& a, const MemoryColumn& b) {
  std::vector<std::string> names;
  for (const auto* column : {&a, &b})
    for (const auto& item : column->items)
      if (std::find(names.begin(), names.end(), item.first) == names.end()) names.push_back(item.first);
  auto bytes_of = [](const MemoryColumn& m, const std::string& name) {
    for (const auto& item : m.items)
      if (item.first == name) return item.second;
    return std::int64_t{0};
  };
  for (const std::string& name : names) {
    const std::int64_t x = bytes_of(a, name), y = bytes_of(b, name);
    if (x != y)
      out << report_line("    %-44s %s %lld B, %s %lld B\n", name.c_str(), a.name.c_str(),
                         static_cast<long long>(x), b.name.c_str(), static_cast<long long>(y));
  }
}

void memory_section(std::ostringstream& out, const RunComparison& c) {
  if (c.memory.empty()) return;
  out << "\nmemory (peak rank):\n";
  for (const MemoryColumn& m : c.memory)
    out << report_line(
        "  %-28s %14s  %s\n", m.name.c_str(),
        m.total_bytes < 0 ? "n/a" : planner::format_bytes(static_cast<double>(m.total_bytes)).c_str(),
        m.note.c_str());
  if (c.memory.size() >= 2 && c.memory[0].total_bytes >= 0 && c.memory[1].total_bytes >= 0) {
    if (c.memory[0].total_bytes == c.memory[1].total_bytes) {
      out << "  the " << c.memory[1].name << " predicts the " << c.memory[0].name << " exactly ("
          << c.memory[0].total_bytes << " bytes)\n";
    } else {
      out << "  " << c.memory[1].name << " - " << c.memory[0].name << ": "
          << (c.memory[1].total_bytes - c.memory[0].total_bytes) << " bytes, in:\n";
      item_differences(out, c.memory[0], c.memory[1]);
    }
  }
}

void ranks(std::ostringstream& out, const RunComparison& c) {
  out << "\nper rank (predicted / measured):\n"
      << report_line("  %-5s %-12s %21s %21s %21s %15s %12s\n", "rank", "pp tp dp cp", "step", "compute",
                     "exposed comm", "bubble", "meas. ops");
  for (const RankComparison& r : c.ranks) {
    auto pair = [](double p, double m) { return format_seconds(p) + " / " + format_seconds(m); };
    out << report_line("  %-5d %-12s %21s %21s %21s %15s %12s\n", r.rank,
                       report_line("%d %d %d %d", r.pp, r.tp, r.dp, r.cp).c_str(),
                       pair(r.predicted_step_s, r.measured_step_s).c_str(),
                       pair(r.predicted_compute_s, r.measured_compute_s).c_str(),
                       pair(r.predicted_exposed_comm_s, r.measured_exposed_comm_s).c_str(),
                       (percent(r.predicted_bubble) + " / " + percent(r.measured_bubble)).c_str(),
                       format_seconds(r.measured_ops_s).c_str());
  }
  out << "  (meas. ops: the sum of the measured op times; the rest of the measured step is host work and "
         "waits "
         "between ops)\n";
}

void kinds(std::ostringstream& out, const RankComparison& r) {
  double predicted_total = 0, measured_total = 0;
  for (const KindComparison& k : r.kinds) predicted_total += k.predicted_s, measured_total += k.measured_s;
  out << report_line("\nrank %d: per op kind (one iteration; measured: mean of the traced iterations)\n",
                     r.rank)
      << report_line("  %-16s %6s %13s %13s %10s %10s %10s\n", "op kind", "count", "predicted", "measured",
                     "meas/pred", "pred share", "meas share");
  for (const KindComparison& k : r.kinds)
    out << report_line("  %-16s %6lld %13s %13s %10s %10s %10s\n", layouts::op_kind_name(k.kind),
                       static_cast<long long>(k.count), format_seconds(k.predicted_s).c_str(),
                       format_seconds(k.measured_s).c_str(),
                       format_ratio(k.measured_s, k.predicted_s).c_str(),
                       percent(predicted_total > 0 ? k.predicted_s / predicted_total : 0).c_str(),
                       percent(measured_total > 0 ? k.measured_s / measured_total : 0).c_str());
  out << report_line("  %-16s %6zu %13s %13s %10s\n", "all ops", r.ops.size(),
                     format_seconds(predicted_total).c_str(), format_seconds(measured_total).c_str(),
                     format_ratio(measured_total, predicted_total).c_str());
}

void offenders(std::ostringstream& out, const RankComparison& r, int top) {
  if (top <= 0) return;
  out << report_line("\nrank %d: worst ops first (|measured - predicted|), joined by step-program id\n",
                     r.rank)
      << report_line("  %6s %-58s %12s %12s %10s\n", "id", "op", "predicted", "measured", "meas/pred");
  for (const ComparedOp& o : worst_offenders(r, static_cast<std::size_t>(top))) {
    std::string text = layouts::to_string(o.op);
    if (text.size() > 58) text = text.substr(0, 55) + "...";
    out << report_line("  %6d %-58s %12s %12s %10s\n", o.id, text.c_str(),
                       o.predicted_s < 0 ? "-" : format_seconds(o.predicted_s).c_str(),
                       format_seconds(o.measured_s).c_str(),
                       format_ratio(o.measured_s, o.predicted_s).c_str());
  }
}

}  // namespace

std::string format_seconds(double s) {
  char buf[32];
  const double a = s < 0 ? -s : s;
  if (a >= 1.0) {
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  } else if (a >= 1e-3) {
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  } else if (a >= 1e-5 || a == 0) {
    std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f us", s * 1e6);
  }
  return buf;
}

std::string format_ratio(double measured, double predicted) {
  if (!(predicted > 0) || measured < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", measured / predicted);
  return buf;
}

std::vector<SummaryRow> summary_rows(const RunComparison& c) {
  return {
      {"step time", format_seconds(c.predicted_step_s), format_seconds(c.measured_step_s),
       format_ratio(c.measured_step_s, c.predicted_step_s)},
      {"MFU", percent(c.predicted_mfu), c.measured_mfu < 0 ? "n/a" : percent(c.measured_mfu),
       c.measured_mfu < 0 ? "-" : format_ratio(c.measured_mfu, c.predicted_mfu)},
      {"pipeline bubble", percent(c.predicted_bubble), percent(c.measured_bubble), "-"},
      {"exposed comm", format_seconds(c.predicted_exposed_comm_s), format_seconds(c.measured_exposed_comm_s),
       format_ratio(c.measured_exposed_comm_s, c.predicted_exposed_comm_s)}};
}

std::string comparison_table(const RunComparison& c, int top_ops, int only_rank) {
  std::ostringstream out;
  out << "compared " << c.run_dir << ": " << c.model << ", " << c.layout << ", " << c.world_size << " rank"
      << (c.world_size == 1 ? "" : "s") << " on " << c.device << "\n";
  out << "simulated on " << c.cluster << "; priced from: " << c.priced_from << "\n";
  out << "measured by " << c.timing;
  if (c.measured_sm_clock_mhz >= 0) out << report_line("; SM clock %.0f MHz", c.measured_sm_clock_mhz);
  if (c.measured_power_w >= 0)
    out << report_line(", power %.0f W (after each traced step)", c.measured_power_w);
  out << "\n";
  for (const std::string& note : c.notes) out << "note: " << note << "\n";
  summary(out, c);
  memory_section(out, c);
  ranks(out, c);
  for (const RankComparison& r : c.ranks) {
    if (only_rank >= 0 && r.rank != only_rank) continue;
    kinds(out, r);
    offenders(out, r, top_ops);
  }
  return out.str();
}

double step_time_error(const RunComparison& c) {
  return c.measured_step_s > 0 ? (c.predicted_step_s - c.measured_step_s) / c.measured_step_s : 0.0;
}

double kendall_tau(const std::vector<RunComparison>& runs) {
  int concordant = 0, discordant = 0;
  for (std::size_t i = 0; i < runs.size(); ++i)
    for (std::size_t j = i + 1; j < runs.size(); ++j) {
      const double p = runs[i].predicted_step_s - runs[j].predicted_step_s;
      const double m = runs[i].measured_step_s - runs[j].measured_step_s;
      if (p * m > 0) ++concordant;
      if (p * m < 0) ++discordant;
    }
  const int pairs = static_cast<int>(runs.size() * (runs.size() - 1) / 2);
  return pairs > 0 ? static_cast<double>(concordant - discordant) / pairs : 1.0;
}

std::string layouts_table(const std::vector<RunComparison>& runs) {
  std::ostringstream out;
  out << "\nper run (error = (predicted - measured) / measured; negative: optimistic)\n"
      << report_line("  %-24s %-44s %12s %12s %9s\n", "run", "layout", "predicted", "measured", "error");
  double sum = 0, worst = 0;
  for (const RunComparison& c : runs) {
    const double e = step_time_error(c);
    sum += std::fabs(e);
    worst = std::max(worst, std::fabs(e));
    out << report_line("  %-24s %-44s %12s %12s %8.1f%%\n", c.run_dir.c_str(), c.layout.substr(0, 44).c_str(),
                       format_seconds(c.predicted_step_s).c_str(), format_seconds(c.measured_step_s).c_str(),
                       100 * e);
  }
  out << report_line("  mean |error| %.1f %%, max %.1f %%, Kendall tau of the rankings %.2f\n",
                     runs.empty() ? 0.0 : 100 * sum / static_cast<double>(runs.size()), 100 * worst,
                     kendall_tau(runs));
  return out.str();
}

void write_comparison_trace(std::ostream& out, const RunComparison& c) {
  std::vector<planner::TraceProcess> processes;
  std::vector<planner::TraceEvent> events;
  for (const RankComparison& r : c.ranks) {
    processes.push_back(
        {2 * r.rank, report_line("rank %d predicted (simulated rank %d)", r.rank, r.simulated_rank)});
    processes.push_back({2 * r.rank + 1, report_line("rank %d measured", r.rank)});
    for (const ComparedOp& o : r.ops) {
      planner::TraceEvent e;
      e.thread = !o.op.is_communication() ? planner::TraceThread::kCompute
                 : (o.op.kind == layouts::OpKind::kSend || o.op.kind == layouts::OpKind::kRecv)
                     ? planner::TraceThread::kP2p
                     : planner::TraceThread::kComm;
      e.name = o.op.label.empty() ? layouts::op_kind_name(o.op.kind) : o.op.label;
      e.category = layouts::op_kind_name(o.op.kind);
      e.args = {{"id", std::to_string(o.id)},
                {"op", layouts::to_string(o.op)},
                {"predicted", o.predicted_s < 0 ? "-" : format_seconds(o.predicted_s)},
                {"measured", format_seconds(o.measured_s)},
                {"measured/predicted", format_ratio(o.measured_s, o.predicted_s)}};
      if (o.predicted_s >= 0) {
        e.pid = 2 * r.rank;
        e.start_s = o.predicted_start_s;
        e.duration_s = o.predicted_s;
        events.push_back(e);
      }
      e.pid = 2 * r.rank + 1;
      e.start_s = o.measured_start_s;
      e.duration_s = o.measured_first_s;
      events.push_back(std::move(e));
    }
  }
  planner::write_chrome_trace(out, processes, events);
}

}  // namespace megatune::calibration
