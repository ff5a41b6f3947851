// Outputs of `megatune compare`: the aligned terminal report, the Perfetto trace with predicted and measured
// tracks, and the self-contained HTML report with inline SVG plots (compare_html.cpp).
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "calibration/run_comparison.h"

namespace megatune::calibration {

// Summary, per-rank rows, memory side by side, and for each rank (all, or only `only_rank` >= 0) the per-kind
// table and the `top_ops` worst offenders.
std::string comparison_table(const RunComparison& comparison, int top_ops = 15, int only_rank = -1);

// Chrome-trace JSON: for each traced rank a "predicted" process (pid 2r) and a "measured" process (pid 2r+1,
// the first traced iteration), one event per step-program op with its id, both times and the op in args.
void write_comparison_trace(std::ostream& out, const RunComparison& comparison);

// One HTML document (no scripts, no external resources): summary, per-kind bars, the timelines of up to
// `max_timeline_ranks` ranks (predicted above measured), memory side by side, the tables.
std::string comparison_html(const RunComparison& comparison, int top_ops = 25, int max_timeline_ranks = 4);

// The summary's rows (step time, MFU, bubble, exposed communication) as text: name, predicted, measured,
// measured / predicted. Shared by the table and the HTML.
struct SummaryRow {
  std::string name, predicted, measured, ratio;
};
std::vector<SummaryRow> summary_rows(const RunComparison& comparison);

// Several runs (layouts) side by side: one line per run with predicted and measured step time and the error,
// then Kendall's tau between the predicted and the measured ranking.
std::string layouts_table(const std::vector<RunComparison>& runs);
// The HTML of several runs: the error per layout plotted, then each run's report.
std::string comparison_html(const std::vector<RunComparison>& runs, int top_ops = 25,
                            int max_timeline_ranks = 1);
// (predicted - measured) / measured step time; negative: the prediction is optimistic.
double step_time_error(const RunComparison& comparison);
// Kendall's tau-a between the runs ranked by predicted and by measured step time (1: the same order).
double kendall_tau(const std::vector<RunComparison>& runs);

// "1.234 ms", "56.7 us", "2.100 s".
std::string format_seconds(double seconds);
// measured / predicted as "1.23x", or "-" when either is missing.
std::string format_ratio(double measured, double predicted);

}  // namespace megatune::calibration
