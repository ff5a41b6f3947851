// Planner search: enumerate parallel layouts (TP, PP, VPP, uneven pipeline layouts, DP, CP, EP, expert TP,
// micro-batch, recomputation, distributed optimizer, SP), prune invalid and out-of-memory ones cheaply,
// simulate the rest on several threads and rank them by predicted step time.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"
#include "planner/memory_model.h"
#include "planner/op_pricer.h"
#include "planner/simulator.h"

namespace megatune::planner {

struct SearchSpace {
  // Empty: every value that can work (TP: powers of two up to the NVLink domain; PP: divisors of the
  // world up to the layer count; CP: powers of two with 2*cp dividing the sequence; EP: divisors of the
  // experts; micro-batch: 1, 2, 4, 8). CP only with at least 512 tokens per rank.
  std::vector<int> tp, pp, cp, ep, etp, micro_batch;
  bool allow_tp_across_nodes = false;  // TP larger than a node's GPUs
  bool virtual_pipeline = true;        // interleaved 1F1B with uniform chunks
  bool uneven_layouts = true;          // first/last stages with fewer layers (embedding, loss)
  std::vector<layouts::RecomputeGranularity> recompute = {layouts::RecomputeGranularity::kNone,
                                                          layouts::RecomputeGranularity::kSelective,
                                                          layouts::RecomputeGranularity::kFull};
  std::vector<bool> distributed_optimizer = {false, true};
  // Megatron FSDP strategies tried beside them (--use-megatron-fsdp), on grids with dp x cp > 1. optim runs
  // the distributed optimizer's program; optim_grads only differs from it in Megatron's memory model.
  // optim_grads_params adds the gathers before each forward and backward and holds 1/d of the bf16 weights
  // plus the gathered entries, under Megatron's memory model and megatune's (the executor keeps the whole
  // gradient buffer): it wins where the weights do not fit otherwise.
  std::vector<layouts::DataParallelSharding> fsdp = {layouts::DataParallelSharding::kOptimGradsParams};
  std::vector<bool> sequence_parallel = {true, false};  // only meaningful with tp > 1
  int max_virtual_stages = 8;
  // Pinned by the user's Megatron flags: a --pipeline-model-parallel-layout string (the only layout tried,
  // at every pp that divides its stages), --num-virtual-stages-per-pipeline-rank (> 0: only that vpp) and
  // --num-layers-per-virtual-pipeline-stage (> 0: only layouts with that many layers per chunk).
  std::string pipeline_layout;
  int virtual_stages = 0;
  int layers_per_virtual_stage = 0;
  // --data-parallel-size (> 0: only layouts with that many data-parallel replicas).
  int dp = 0;
  // --decoder-first/last-pipeline-num-layers (>= 0) or --account-for-embedding/loss-in-pipeline-split:
  // the only pipeline split tried, at every pp and virtual-stage count it fits.
  int first_stage_layers = -1, last_stage_layers = -1;
  bool account_for_embedding = false, account_for_loss = false;
  // Full recomputation's method and layers per unit: pinned (--recompute-method / --recompute-num-layers),
  // every full candidate runs with them; otherwise these (uniform 1) and, where no lighter recomputation
  // fits and uniform 1 does, block at 1/2 and 1/4 of a chunk's layers (under an injected memory model, which
  // sizes lazily, where the space holds no lighter recomputation: --recompute-granularity full). Then
  // settings every candidate runs with: the MoE token dispatcher, the interleaved schedule's microbatch group
  // size (0: pp) and Megatron's rank order.
  layouts::RecomputeMethod recompute_method = layouts::RecomputeMethod::kUniform;
  int recompute_num_layers = 1;
  bool recompute_pinned = false;
  layouts::MoeDispatcher moe_dispatcher = layouts::MoeDispatcher::kAllToAll;
  int microbatch_group_size = 0;
  layouts::RankOrder rank_order = layouts::RankOrder::kTpCpEpDpPp;
};

// Where a running search stands, for a progress display.
struct SearchProgress {
  const char* phase = "";  // "bounding" (the candidates' lower bounds) or "simulating"
  std::int64_t done = 0, total = 0;
  double best_step_s = 0.0;  // the fastest candidate simulated so far; 0 before the first
};

struct PlanRequest {
  layouts::ModelSpec model;  // seq_length set
  int world_size = 0;
  int global_batch_size = 0;
  SearchSpace space;
  MemoryOptions memory;
  // The memory model candidates must fit by (empty: Megatron's, peak_memory); its name for the report.
  PeakMemoryFunction peak_memory_of;
  MemoryModelKind memory_model = MemoryModelKind::kMegatron;
  layouts::StepProgramOptions step;
  // --tp-comm-overlap: the TP collectives of sequence-parallel candidates overlap their GEMMs.
  bool tp_comm_overlap = false;
  double memory_headroom_fraction = 0.0;  // keep this fraction of the GPU's memory free
  int top_k = 10;
  int threads = 2;
  // --time-limit (> 0): past this many seconds the search stops bounding and simulating once a candidate
  // has been simulated, and returns the best found so far (PlanStatistics::stopped_by_time_limit). The
  // enumeration always completes.
  double time_limit_s = 0.0;
  // Called from the calling thread while the search runs.
  std::function<void(const SearchProgress&)> progress;
};

// A layout the search considers.
struct LayoutCandidate {
  layouts::ParallelConfig config;
  // The config's pipeline stages (shared by the candidates of one arrangement) and their Megatron layout
  // string (uniform or not), given for the ranked candidates of a PlanResult.
  std::shared_ptr<const layouts::PipelineLayout> stages;
  std::string layout;
  int vpp = 1;
  std::int64_t peak_memory_bytes = 0;
  int peak_memory_pp_rank = 0;
};

// A simulated layout.
struct PlanCandidate : LayoutCandidate {
  SimulationResult simulation;  // trace not recorded
};

struct PlanStatistics {
  std::int64_t enumerated = 0;
  std::int64_t invalid = 0;          // rejected by ParallelConfig::validate
  std::int64_t out_of_memory = 0;    // rejected by the memory model
  std::int64_t pruned_by_bound = 0;  // lower bound above the k-th best simulated step time
  std::int64_t simulated = 0;
  std::int64_t failed = 0;  // simulation errors (reported in first_failure)
  std::string first_failure;
  double seconds = 0.0;
  double simulate_seconds = 0.0;  // wall time of the simulation phase
  bool stopped_by_time_limit = false;
  std::int64_t not_reached = 0;  // candidates the time limit left unsimulated (and unpruned)
};

struct PlanResult {
  std::vector<PlanCandidate> ranked;  // best first, at most top_k
  PlanStatistics statistics;
  std::int64_t memory_capacity_bytes = 0;
  // Why the winner beats the runner-up: the term (compute, exposed communication, pipeline bubble) that
  // differs most. Empty with fewer than two candidates.
  std::string why_winner;
};

// Runs the search. Throws UserError when no layout fits (naming the smallest memory found and the way out).
PlanResult plan(const PlanRequest& request, const OpPricer& pricer);

// Compact description: "tp8 pp4 vpp2 dp32 cp1 ep1 etp8 mbs1 sel sp dopt".
std::string describe(const LayoutCandidate& candidate);

}  // namespace megatune::planner
