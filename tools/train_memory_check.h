// `megatune train` on a GPU refuses a model that does not fit before it allocates anything: the predicted
// arena of the worst pipeline stage (the executor's own sizing pass, as `--dry-run` prints it) plus the
// fixed workspaces is held against the GPU's free memory, and a refusal names the need, the free memory and
// what would fit (recomputation, micro-batch 1, a sharded optimizer, more GPUs).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "executor/backend/backend.h"
#include "executor/training/run_setup.h"

namespace megatune::tools {

struct DeviceMemory {
  std::int64_t free_bytes = 0;
  std::int64_t total_bytes = 0;
};

// The CUDA backend's GEMM workspace, optimizer tables and kernel scratch, which the sizing pass leaves out.
constexpr std::int64_t kFixedWorkspaceAllowanceBytes = std::int64_t{256} << 20;

// A fresh backend that only counts, in the storage sizes of the backend being checked.
using SizingBackendFactory = std::function<std::unique_ptr<executor::Backend>()>;

// The largest arena over the layout's pipeline stages (UserError for layouts the executor cannot run).
std::int64_t predicted_arena_bytes(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                   const executor::TrainOptions& options, const SizingBackendFactory& sizing);

// Throws UserError (one line) when the predicted arena plus kFixedWorkspaceAllowanceBytes exceeds
// memory.free_bytes.
void require_arena_fits(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                        const executor::TrainOptions& options, DeviceMemory memory,
                        const SizingBackendFactory& sizing);

}  // namespace megatune::tools
