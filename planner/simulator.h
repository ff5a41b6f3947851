// Step simulator: prices the step program of a (model, parallel config) with an OpPricer and replays it
// with the event engine; reports step time, MFU, bubble, exposed communication, per-kind times and a trace.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/step_program.h"
#include "planner/chrome_trace.h"
#include "planner/event_engine.h"
#include "planner/op_pricer.h"

namespace megatune::planner {

enum class SimulationGranularity {
  kPass,    // one task per forward/backward pass (ops priced once per layer kind): the planner's fast path
  kKernel,  // one task per op of the step program: traces, op-level comparisons
};

class SimulationCache;  // simulation_cache.h

struct SimulationOptions {
  SimulationGranularity granularity = SimulationGranularity::kPass;
  // false: one representative rank per pipeline stage (ranks differing only in tp/cp/dp/ep coordinates
  // behave identically; their collectives are priced for the full group). true: every rank of the world.
  bool all_ranks = false;
  bool record_trace = false;
  bool record_op_timeline = false;  // kernel level: fill SimulationResult::op_timelines
  layouts::StepProgramOptions step;
  // Megatron's --tp-comm-overlap: TP all-gathers and reduce-scatters overlap their GEMMs in chunks
  // (tp_comm_overlap.h); needs sequence parallelism.
  bool tp_comm_overlap = false;
  // What the simulations of one search share (parsed layouts, pass prices); none: all per simulation.
  SimulationCache* cache = nullptr;
};

inline constexpr int kOpKindCount = static_cast<int>(layouts::OpKind::kBroadcast) + 1;
inline constexpr int kProvenanceCount = 5;

struct KindTime {
  double total_s = 0.0;
  std::int64_t count = 0;
};

struct StageReport {
  int pp_rank = 0;
  int rank = 0;  // the global rank simulated for this stage
  double finish_s = 0.0;
  double compute_s = 0.0;
  double exposed_comm_s = 0.0;
  double pipeline_wait_s = 0.0;
  double async_comm_s = 0.0;
};

// Predicted timing of one step-program op (index = its position in layouts::build_step_program(rank).ops).
// start_s < 0: the op has no task of its own (a CP ring transfer, priced into its attention kernel's stall).
struct OpTiming {
  double start_s = -1.0, end_s = -1.0;
};
struct RankOpTimeline {
  int rank = 0;  // global rank
  std::vector<OpTiming> ops;
};

struct SimulationResult {
  double step_time_s = 0.0;
  double model_flops = 0.0;  // per iteration, Megatron's formula (recompute not counted)
  double mfu = 0.0;
  double tflops_per_gpu = 0.0;
  double tokens_per_s = 0.0;
  // Mean over stages of (time waiting on other stages) / (compute + exposed communication): 1F1B with
  // equal stages and free communication gives (p - 1) / m.
  double bubble_fraction = 0.0;
  double exposed_comm_s = 0.0;  // on the stage with the largest finish time
  double compute_s = 0.0;       // same stage
  // exposed_comm_s by what it moved (CommCategory, planner/event_engine.h: TP, CP, EP, PP, DP, other).
  std::array<double, kCommCategoryCount> exposed_comm_by_category{};
  std::vector<StageReport> stages;
  int critical_stage = 0;                           // pp rank whose kinds are tabulated
  std::array<KindTime, kOpKindCount> kind_times{};  // per op kind on the critical stage, one iteration
  std::array<std::int64_t, kProvenanceCount> provenance_counts{};  // ops priced, by provenance
  int simulated_ranks = 0;
  std::vector<TraceProcess> trace_processes;
  std::vector<TraceEvent> trace_events;
  std::vector<RankOpTimeline> op_timelines;  // per simulated rank, with record_op_timeline (kernel level)

  // Per-kind table, aligned text, sorted by time.
  std::string kind_table() const;
};

// Simulates one iteration. The config must be valid for the model (ParallelConfig::validate).
SimulationResult simulate(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                          const OpPricer& pricer, const SimulationOptions& options = {});

// A lower bound of simulate(model, config, pricer, options).step_time_s at pass granularity (the planner's),
// much cheaper than simulate(), from pass times priced exactly as the simulation prices them (same options:
// the gradient dtype, --tp-comm-overlap): each pp rank's compute stream runs all of its passes one after
// another, after the first microbatch's forward filled the ranks before it and before the last
// microbatch's backward drains back through them (pipeline_lower_bound in simulation_cache.h). With
// kPassesAndGradientSync also: the rank's blocking gradient reductions follow its last pass, and its
// communication stream runs every overlapped reduction and parameter gather one after another. The planner
// skips candidates whose bound exceeds the k-th best simulated step time. Granularity, all_ranks and the
// recording switches of `options` are ignored.
enum class BoundTerms { kPasses, kPassesAndGradientSync };
double step_time_lower_bound(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                             const OpPricer& pricer, const SimulationOptions& options = {},
                             BoundTerms terms = BoundTerms::kPassesAndGradientSync);

}  // namespace megatune::planner
