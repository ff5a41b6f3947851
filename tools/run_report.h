// `megatune report --run DIR`: a training run's curves from the TensorBoard event files its
// --tensorboard-dir holds (executor/training/tensorboard_writer.h): a text summary of every scalar, and a
// self-contained HTML page with an inline SVG chart per quantity (loss with the validation loss, learning
// rate, grad norm, throughput and MFU, memory, MoE and MTP losses) over the iterations.
#pragma once
#include <iosfwd>
#include <map>
#include <string>
#include <vector>

namespace megatune::tools {

struct RunCurves {
  std::string dir;
  std::vector<std::string> files;  // the event files read, in name order
  // Each tag's (step, value) points in step order; a step written twice (a resumed run) keeps its last.
  std::map<std::string, std::vector<std::pair<long long, double>>> series;
};

// Reads every events.out.tfevents.* file directly in `dir` or one level below it. UserError naming the
// directory when it holds none, or naming a damaged file.
RunCurves read_run_curves(const std::string& dir);

// The text summary: one line per tag (points, first and last step, first, last, min and max values).
void print_run_summary(const RunCurves& run, std::ostream& out);

// The HTML page (written whole or not at all by the caller).
std::string run_report_html(const RunCurves& run);

}  // namespace megatune::tools
