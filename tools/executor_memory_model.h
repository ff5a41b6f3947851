// The executor's own memory model for the planner: a layout's peak is the largest arena its pipeline stages
// allocate in `megatune train` (the trainer's sizing pass on a SizingBackend, the CUDA backend's storage
// sizes: what `megatune train --dry-run` prints), plus the device memory outside the arena (CUDA context,
// cuBLAS workspace, NCCL buffers: Megatron's model's buffer item). The planner cannot depend on the executor,
// so tools/ hands this function to it.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>

#include "planner/memory_model.h"

namespace megatune::executor {
class Backend;
}

namespace megatune::tools {

// A layout the executor cannot size (one it cannot run yet) falls back to Megatron's model, saying so in the
// estimate's first item.
planner::PeakMemoryFunction executor_peak_memory();

// The backend executor_peak_memory sizes stages on: the CUDA backend's storage sizes and, where CUDA is
// built, its attention kernels' shape support (a shape they refuse takes the reference path's buffers).
std::unique_ptr<executor::Backend> executor_sizing_backend();

// The estimator for a --memory-model choice: the executor's (megatune) or Megatron's (planner::peak_memory).
planner::PeakMemoryFunction peak_memory_function(planner::MemoryModelKind kind);

// --memory-model megatune|megatron (default: the value `kind` holds) in the given help group.
void add_memory_model_flag(CLI::App& command, planner::MemoryModelKind& kind, const std::string& group);

}  // namespace megatune::tools
