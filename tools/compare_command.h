// `megatune compare`: a traced run (megatune train --trace-dir) beside the simulation of the same (model,
// layout, cluster): the terminal report, and optionally the HTML report and the Perfetto trace. Shared by
// tools/cmd_compare.cpp and the tests.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace megatune::tools {

struct CompareOptions {
  std::vector<std::string> runs;  // --run DIR [DIR...]: several runs add the per-layout error table
  std::string simulate_args;      // --simulate-args "--model ... --tp 2": replaces the run's own flags
  std::string plan;               // --plan plan.json: its megatune_train_args and cluster
  std::string cluster;            // --cluster: replaces the run's (or the plan's) cluster
  std::string db;                 // --db: cost database
  std::string html;               // --html FILE
  std::string perfetto;           // --perfetto FILE
  int top = 15;                   // --top: worst ops listed per rank
  int rank = -1;                  // --rank: only this rank's tables (-1: every rank)
  bool save = false;              // --save: store each rank as a run (runs + run_ops) in the --db database
  bool no_calibration = false;    // --no-calibration: price without the stored calibration
  // --leave-one-out: for each run, calibrate on the others and predict it (step time before and after);
  // replaces the per-run reports.
  bool leave_one_out = false;
  std::string hold_out = "run";  // --hold-out run|shape|model: what --leave-one-out holds out together
};

// Writes the report to `out` and the requested files (temporary file + rename); UserError on bad input.
void run_compare(const CompareOptions& options, std::ostream& out);

}  // namespace megatune::tools
