// Joining a measured training iteration to the step program: each op the executor issued (with its measured
// device time) is matched, in issue order, to the step-program op doing the same work, whose index is the
// op id shared with the simulator; the planner's price of that op is stored next to the measurement as a
// run (runs + run_ops tables) for the predicted-vs-measured comparison.
#pragma once
#include <cstdint>
#include <vector>

#include "cost_models/cost_model.h"
#include "cost_models/records.h"
#include "cost_models/sqlite_database.h"
#include "layouts/step_program.h"

namespace megatune::profiler {

struct MeasuredOp {
  layouts::Op op;
  double measured_s = 0;
};

struct JoinedRun {
  std::vector<cost_models::RunOp> ops;  // run_id left 0; op_id = index into the step program's ops
  int unmatched = 0;                    // executed ops with no counterpart in the program
  int matched_loosely = 0;              // matched on kind and shape only (labels or phase differ)
  double measured_total_s = 0;          // sum over matched ops
  double predicted_total_s = 0;         // sum over matched ops
};

// Matches in order: for each executed op, the next unmatched program op within `window` positions doing the
// same work (Op::same_work), else the same kind and shape; communication ops of the program that the
// executor does not issue (single GPU) are simply left unmatched.
JoinedRun join_to_step_program(const std::vector<MeasuredOp>& executed, const layouts::StepProgram& program,
                               const cost_models::CostModel& prices, int window = 256);

// Inserts `run` and its ops in one transaction; returns the run id.
std::int64_t store_joined_run(cost_models::Database& database, const cost_models::RunRecord& run,
                              const JoinedRun& joined);

}  // namespace megatune::profiler
