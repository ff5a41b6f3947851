// A rank's arena for a (model, layout) without running anything (`megatune train --dry-run`, the executor
// column of `megatune compare`): size_training_arena with a communicator that holds the rank's groups of the
// layout (so tensor-parallel shapes size as they run) and refuses every transfer.
#pragma once
#include <cstdint>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/training/run_setup.h"

namespace megatune::executor {

struct RankArena {
  int rank = 0;
  layouts::DenseCoordinates coordinates;
  std::vector<ArenaUse> breakdown;
  std::int64_t total_bytes = 0;
};

// `backend` counts in its own storage sizes (a SizingBackend: the CUDA backend's; a CpuBackend: 4 bytes per
// element) and must not have reserved its arena. UserError for layouts the executor cannot run.
RankArena size_rank_arena(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                          const TrainOptions& options, int rank, Backend& backend);

// The ranks worth sizing: one per pipeline stage (tp / cp / dp peers hold the same shapes).
std::vector<int> one_rank_per_stage(const layouts::ParallelConfig& config);

}  // namespace megatune::executor
