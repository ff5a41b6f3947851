// A rank's arena for a (model, layout) without running anything (`megatune train --dry-run`, the executor
// column of `megatune compare`): size_training_arena with a communicator that holds the rank's groups of the
// layout (so tensor-parallel shapes size as they run) and refuses every transfer; and the bytes per parameter
// each training state (parameters, gradients, main parameters, moments) takes on the rank.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/training/run_setup.h"

namespace megatune::executor {

// One training state's arena bytes on a rank (an arena label of state_labels.h) and its bytes per parameter.
struct ParameterStateBytes {
  std::string state;
  std::int64_t bytes = 0;
  double bytes_per_parameter = 0.0;
};

struct RankArena {
  int rank = 0;
  layouts::DenseCoordinates coordinates;
  std::vector<ArenaUse> breakdown;
  std::int64_t total_bytes = 0;
  std::int64_t parameters = 0;         // the rank's parameters (over its model chunks, without padding)
  std::int64_t expert_parameters = 0;  // of them, the routed experts'
  // The model parameters, the fp32 gradients, the fp32 main parameters and the AdamW moments, in that order.
  std::vector<ParameterStateBytes> state_bytes;
  // Megatron's bytes per parameter for the same state (megatron.md §5: bf16 18 or 6 + 12/d, fp32 16 or
  // 8 + 8/d, d = dp x cp for dense parameters and expert-dp for routed experts'), averaged over the rank's.
  double megatron_bytes_per_parameter = 0.0;
  // How the breakdown sized what depends on the step's data, one line each (the MoE layers' expert rows:
  // a sizing pass routes nothing, so they take the balanced count).
  std::vector<std::string> sizing_notes;
};

// `backend` counts in its own storage sizes (a SizingBackend: the CUDA backend's; a CpuBackend: 4 bytes per
// element) and must not have reserved its arena. UserError for layouts the executor cannot run.
RankArena size_rank_arena(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                          const TrainOptions& options, int rank, Backend& backend);

// The sizing notes of `arena`, one indented line each.
std::string format_sizing_notes(const RankArena& arena);

// The state rows of `arena` as a table (bytes per parameter, their total against Megatron's figure).
std::string format_parameter_state_bytes(const RankArena& arena);

// The ranks worth sizing: one per pipeline stage (tp / cp / dp peers hold the same shapes).
std::vector<int> one_rank_per_stage(const layouts::ParallelConfig& config);

}  // namespace megatune::executor
