// Predicted vs measured: a traced run (calibration/measured_run.h) set beside the simulation of the same
// (model, layout, cluster): step time, MFU, bubble, exposed communication and memory; per op kind and per op
// (joined by step-program id) per traced rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "calibration/measured_run.h"
#include "layouts/model_spec.h"
#include "layouts/op.h"
#include "layouts/parallel_config.h"
#include "planner/memory_model.h"
#include "planner/simulator.h"

namespace megatune::calibration {

struct ComparedOp {
  int id = 0;  // index in the rank's step program
  layouts::Op op;
  double predicted_s = -1;  // < 0: no task of its own in the simulation (a CP ring transfer)
  double measured_s = 0;    // mean over the traced iterations
  double predicted_start_s = -1;
  double measured_start_s = 0, measured_first_s = 0;  // start and time in the first traced iteration
};

struct KindComparison {
  layouts::OpKind kind = layouts::OpKind::kGemm;
  std::int64_t count = 0;
  double predicted_s = 0, measured_s = 0;
};

// Measured per rank (means over the traced iterations): compute = the non-communication ops, exposed
// communication = the collectives (the executor's communication blocks its compute stream today), pipeline
// wait = the receives; bubble = pipeline wait / (compute + exposed communication), as the simulator defines
// it.
struct RankComparison {
  int rank = 0, tp = 0, pp = 0, dp = 0, cp = 0;
  int simulated_rank = 0;  // the rank whose simulated timeline stands for it (same pipeline stage)
  double predicted_step_s = 0, measured_step_s = 0;
  double predicted_compute_s = 0, measured_compute_s = 0;
  double predicted_exposed_comm_s = 0, measured_exposed_comm_s = 0;
  double predicted_bubble = 0, measured_bubble = 0;
  double measured_ops_s = 0;  // sum of op times; the rest of the step is host work between ops
  std::vector<ComparedOp> ops;
  std::vector<KindComparison> kinds;  // by measured time, largest first
  // Ops the executor issued after the step program's last op: (text, mean measured time); not in the sums.
  std::vector<std::pair<std::string, double>> unjoined;
};

struct MemoryColumn {
  std::string name;               // "measured arena", "executor sizing", "memory model (Megatron)"
  std::int64_t total_bytes = -1;  // -1: not available
  std::vector<std::pair<std::string, std::int64_t>> items;
  std::string note;
};

struct RunComparison {
  std::string model, layout, cluster, priced_from, device, timing, run_dir;
  int world_size = 1;
  double predicted_step_s = 0, measured_step_s = 0;  // measured: slowest rank's mean
  double predicted_mfu = 0, measured_mfu = -1;       // -1: no GPU peak (CPU run)
  double predicted_bubble = 0, measured_bubble = 0;
  double predicted_exposed_comm_s = 0, measured_exposed_comm_s = 0;  // critical stage / slowest rank
  double measured_sm_clock_mhz = -1, measured_power_w = -1;  // means of the per-iteration samples; -1: none
  std::vector<RankComparison> ranks;
  std::vector<MemoryColumn> memory;  // side by side
  std::vector<std::string> notes;
};

// The simulation must be kernel level with record_op_timeline; check_join(run, model, config, ..., step) must
// have passed. `memory` is given by the caller (the executor's sizing lives outside the planner).
RunComparison compare_run(const MeasuredRun& run, const layouts::ModelSpec& model,
                          const layouts::ParallelConfig& config, const planner::SimulationResult& simulation,
                          std::vector<MemoryColumn> memory, const layouts::StepProgramOptions& step = {});

// Ops of a rank sorted worst first: by |measured - predicted|, ops with no prediction last.
std::vector<ComparedOp> worst_offenders(const RankComparison& rank, std::size_t count);

}  // namespace megatune::calibration
