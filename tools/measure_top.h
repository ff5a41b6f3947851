// `megatune plan --measure-top K`: run the plan's top K candidates a few iterations as `megatune train`
// child processes with a trace, set the measured step times beside the predicted ones, fit a calibration
// from the traces, re-simulate the candidates with it and re-rank them by measured step time (that measured
// half is calibration/measured_candidates.h; this file trains the candidates).
#pragma once
#include <cstddef>
#include <ostream>
#include <string>

#include "cost_models/cluster_spec.h"
#include "cost_models/cost_model.h"
#include "layouts/fp8.h"
#include "layouts/model_spec.h"
#include "planner/search.h"

namespace megatune::tools {

struct MeasureTopOptions {
  int candidates = 0;           // --measure-top K (0: off)
  int iterations = 6;           // --measure-iterations: iterations each candidate trains
  std::string device = "cuda";  // --measure-device cuda|cpu
  std::string keep_dir;         // --measure-keep DIR: keep the traced runs there (empty: a removed temporary)
  double timeout_s = 600;       // --measure-timeout: wall-clock limit of each candidate's run
  std::string db;               // plan's --db (a calibration is stored there when named)
  bool save = false;            // plan's --save (stores the calibration in the default database on a GPU)
  layouts::Fp8Settings fp8;     // plan's FP8 flags: every candidate trains with them
};

// The traced window of a run of `iterations`: its last min(3, iterations - 1) iterations (at least one).
// Returns "START:COUNT" for --trace-iterations.
std::string measure_trace_window(int iterations);

struct MeasureTopResult {
  std::size_t fastest = 0;  // index in PlanResult::ranked of the fastest measured candidate
  // One line of JSON: per candidate tried, in predicted order, its predicted rank, knobs and layout, and
  // either its predicted, measured and calibrated step times and MFUs or why it failed.
  std::string json;
};

// Measures the top K of `result.ranked` (UserError when none of them ran), prints the predicted-vs-measured
// table, fits a calibration and re-simulates with it (`pricing` gets the fitted calibration), prints the
// re-ranked order and stores the calibration when options ask for it.
MeasureTopResult measure_top_candidates(const MeasureTopOptions& options, const layouts::ModelSpec& model,
                                        const cost_models::ClusterSpec& cluster,
                                        const planner::PlanResult& result,
                                        const layouts::StepProgramOptions& step,
                                        cost_models::CostModel& pricing, std::ostream& out);

}  // namespace megatune::tools
