// The free-memory check of `megatune train` against the executor's own arena sizing.
#include "tools/train_memory_check.h"

#include <algorithm>
#include <sstream>

#include "base/user_error.h"
#include "executor/training/arena_sizing.h"
#include "planner/memory_fit.h"
#include "planner/memory_model.h"

namespace megatune::tools {

std::int64_t predicted_arena_bytes(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                   const executor::TrainOptions& options,
                                   const SizingBackendFactory& sizing) {
  std::int64_t worst = 0;
  for (const int rank : executor::one_rank_per_stage(config)) {
    const std::unique_ptr<executor::Backend> backend = sizing();
    worst = std::max(worst, executor::size_rank_arena(model, config, options, rank, *backend).total_bytes);
  }
  return worst;
}

void require_arena_fits(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                        const executor::TrainOptions& options, DeviceMemory memory,
                        const SizingBackendFactory& sizing) {
  const std::int64_t usable = memory.free_bytes - kFixedWorkspaceAllowanceBytes;
  const std::int64_t need = predicted_arena_bytes(model, config, options, sizing);
  if (need <= usable) return;
  const planner::LayoutFits fits = [&](const layouts::ParallelConfig& variant) {
    try {
      variant.validate(model);
      return predicted_arena_bytes(model, variant, options, sizing) <= usable;
    } catch (const std::exception&) {
      return false;
    }
  };
  std::ostringstream out;
  out << model.name << " (" << executor::describe_layout(model, config) << ") needs a "
      << planner::format_bytes(static_cast<double>(need))
      << " arena per GPU (the executor's sizing, as --dry-run prints it; "
      << planner::format_bytes(static_cast<double>(kFixedWorkspaceAllowanceBytes))
      << " more for workspaces) but the GPU has "
      << planner::format_bytes(static_cast<double>(memory.free_bytes)) << " free";
  if (memory.total_bytes > 0) out << " of " << planner::format_bytes(static_cast<double>(memory.total_bytes));
  out << ": " << planner::fitting_alternatives(model, config, usable, fits);
  throw UserError(out.str());
}

}  // namespace megatune::tools
