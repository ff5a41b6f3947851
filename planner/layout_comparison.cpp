// The --against comparison: a two-column table of predictions and time terms, and the largest difference.
#include "planner/layout_comparison.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "planner/event_engine.h"

namespace megatune::planner {
namespace {

// One printf-formatted number.
std::string text(const char* format, double value) {
  char buf[48];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}
std::string seconds(double s) { return text("%.3f s", s); }
std::string comparison_percent(double fraction) { return text("%.1f%%", 100.0 * fraction); }

std::string memory(const PlanCandidate& c, std::int64_t capacity_bytes, double usable_bytes) {
  const double gib = 1024.0 * 1024.0 * 1024.0;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f/%.1f GiB%s", c.peak_memory_bytes / gib, capacity_bytes / gib,
                c.peak_memory_bytes > usable_bytes ? " (does not fit)" : "");
  return buf;
}

// Where a step goes on its critical pp rank: compute, each category of exposed communication, the rest
// (pipeline bubble and waiting on other ranks).
struct Term {
  std::string name;
  double yours_s = 0.0, pick_s = 0.0;
};

std::vector<Term> time_terms(const SimulationResult& yours, const SimulationResult& pick) {
  std::vector<Term> terms = {{"compute (incl. recomputation)", yours.compute_s, pick.compute_s}};
  for (int c = 0; c < kCommCategoryCount; ++c)
    terms.push_back({std::string(comm_category_name(static_cast<CommCategory>(c))) + " communication exposed",
                     yours.exposed_comm_by_category[c], pick.exposed_comm_by_category[c]});
  auto bubble = [](const SimulationResult& s) { return s.step_time_s - s.compute_s - s.exposed_comm_s; };
  terms.push_back({"pipeline bubble and waiting", bubble(yours), bubble(pick)});
  return terms;
}

// "the plan's pick is 0.860 s (15.6%) faster per step: 0.712 s less pipeline bubble and waiting".
std::string verdict(const PlanCandidate& yours, const PlanCandidate& pick, const std::vector<Term>& terms) {
  const double gap = yours.simulation.step_time_s - pick.simulation.step_time_s;
  if (gap == 0.0) return "both layouts take the same time per step";
  const bool pick_faster = gap > 0;
  const double slower = pick_faster ? yours.simulation.step_time_s : pick.simulation.step_time_s;
  const Term& most = *std::max_element(terms.begin(), terms.end(), [&](const Term& a, const Term& b) {
    return (pick_faster ? a.yours_s - a.pick_s : a.pick_s - a.yours_s) <
           (pick_faster ? b.yours_s - b.pick_s : b.pick_s - b.yours_s);
  });
  const double saved = pick_faster ? most.yours_s - most.pick_s : most.pick_s - most.yours_s;
  std::ostringstream out;
  out << (pick_faster ? "the plan's pick" : "your layout") << " is " << seconds(std::abs(gap)) << " ("
      << comparison_percent(std::abs(gap) / slower) << ") faster per step";
  if (saved > 0) out << ": " << seconds(saved) << " less " << most.name;
  return out.str();
}

}  // namespace

std::string format_layout_comparison(const PlanCandidate& yours, const PlanCandidate& pick,
                                     std::int64_t capacity_bytes, double usable_bytes) {
  const SimulationResult& y = yours.simulation;
  const SimulationResult& p = pick.simulation;
  std::vector<std::vector<std::string>> rows = {
      {"", "your layout (--against)", "the plan's pick"},
      {"knobs", describe(yours), describe(pick)},
      {"pipeline layout", yours.layout, pick.layout},
      {"step time", seconds(y.step_time_s), seconds(p.step_time_s)},
      {"MFU", comparison_percent(y.mfu), comparison_percent(p.mfu)},
      {"memory (peak pp rank)", memory(yours, capacity_bytes, usable_bytes),
       memory(pick, capacity_bytes, usable_bytes)},
      {"bubble (mean over stages)", comparison_percent(y.bubble_fraction), comparison_percent(p.bubble_fraction)},
      {"where one step goes, on the critical pp rank (" + std::to_string(y.critical_stage) + " / " +
           std::to_string(p.critical_stage) + "):",
       "", ""}};
  const std::vector<Term> terms = time_terms(y, p);
  for (const Term& t : terms) rows.push_back({"  " + t.name, seconds(t.yours_s), seconds(t.pick_s)});
  std::size_t name_width = 0, yours_width = 0;
  for (const auto& row : rows) {
    if (!row[1].empty() || !row[2].empty()) name_width = std::max(name_width, row[0].size());
    yours_width = std::max(yours_width, row[1].size());
  }
  std::ostringstream out;
  for (const auto& row : rows) {
    if (row[1].empty() && row[2].empty()) {
      out << "  " << row[0] << '\n';
      continue;
    }
    out << "  " << row[0] << std::string(name_width - row[0].size() + 2, ' ') << row[1]
        << std::string(yours_width - row[1].size() + 2, ' ') << row[2] << '\n';
  }
  out << "  " << verdict(yours, pick, terms) << '\n';
  return out.str();
}

}  // namespace megatune::planner
