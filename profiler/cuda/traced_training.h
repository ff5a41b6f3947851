// `megatune profile --trace`: a short `megatune train` run of a model on GPU 0 (mock data, one GPU), whose
// last iteration's ops are timed from CUPTI records (each op issued inside its own external-correlation
// range through Backend::set_op_observer; an op's time is the device busy time of its kernels), joined to
// the step program's op ids with the planner's price of each, and stored as a run in the cost database.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cost_models/cost_model.h"
#include "cost_models/sqlite_database.h"
#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "profiler/profile_session.h"
#include "profiler/run_join.h"

namespace megatune::profiler::cuda {

struct TracedTrainingResult {
  std::int64_t run_id = 0;
  int iterations = 0;
  int ops_per_iteration = 0;
  JoinedRun joined;
  double iteration_s = 0;               // wall time of the last iteration (backend synchronized)
  double cupti_kernel_s = 0;            // CUPTI kernel busy time per iteration (mean over the traced run)
  double attributed_s = 0;              // sum of the last iteration's per-op CUPTI busy times
  double unattributed_s = 0;            // per iteration: device busy time issued outside every op range
  int ops_without_activity = 0;         // last-iteration ops with no CUPTI record (stored as 0 s)
  std::vector<MeasuredOp> slowest_ops;  // the last iteration's five longest ops
  double measured_mfu = 0, predicted_mfu = 0;
};

// Trains `iterations` (>= 2) steps and stores the last one. `prices` prices the program's ops (built from
// the same database or the embedded data).
TracedTrainingResult trace_training(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                    int iterations, const cost_models::CostModel& prices,
                                    cost_models::Database& database, const DeviceIdentity& identity);

}  // namespace megatune::profiler::cuda
