// `megatune profile --trace`: a short `megatune train` run of a model on GPU 0 (mock data, one GPU), whose
// last iteration's ops are timed on the device (the CUDA backend's per-op event timing), joined to the step
// program's op ids with the planner's price of each, and stored as a run in the cost database. CUPTI traces
// the same run; its total kernel time per iteration is reported next to the per-op sum as a cross-check.
#pragma once
#include <cstdint>
#include <string>

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
  double iteration_s = 0;     // wall time of the last iteration (backend synchronized)
  double cupti_kernel_s = 0;  // CUPTI kernel busy time per iteration (mean over the traced run)
  double measured_mfu = 0, predicted_mfu = 0;
};

// Trains `iterations` (>= 2) steps and stores the last one. `prices` prices the program's ops (built from
// the same database or the embedded data).
TracedTrainingResult trace_training(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                    int iterations, const cost_models::CostModel& prices,
                                    cost_models::Database& database, const DeviceIdentity& identity);

}  // namespace megatune::profiler::cuda
