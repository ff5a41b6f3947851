// executor_peak_memory: size_rank_arena over one rank per pipeline stage, plus the non-arena buffers.
#include "tools/executor_memory_model.h"

#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "executor/backend/sizing_backend.h"
#include "executor/training/arena_sizing.h"
#ifdef MEGATUNE_HAVE_CUDA
#include "executor/cuda/flash_attention.h"
#endif

namespace megatune::tools {
namespace {

std::unique_ptr<executor::Backend> cuda_sizing_backend() {
#ifdef MEGATUNE_HAVE_CUDA
  return std::make_unique<executor::SizingBackend>(nullptr, executor::cuda::flash_attention_unsupported);
#else
  return std::make_unique<executor::SizingBackend>();
#endif
}

planner::MemoryEstimate stage_estimate(const executor::RankArena& arena, int pp_rank,
                                       const planner::MemoryEstimate& megatron) {
  planner::MemoryEstimate e;
  e.pp_rank = pp_rank;
  for (const executor::ArenaUse& use : arena.breakdown) {
    std::string note = "executor arena, " + std::to_string(use.allocations) +
                       (use.allocations == 1 ? " allocation" : " allocations");
    for (const executor::ParameterStateBytes& state : arena.state_bytes)
      if (state.state == use.what) {
        char per[48];
        std::snprintf(per, sizeof per, ", %.2f bytes/parameter", state.bytes_per_parameter);
        note += per;
      }
    e.items.push_back({use.what, use.bytes, note});
  }
  e.buffer_bytes = megatron.buffer_bytes;
  e.items.push_back({"buffers outside the arena", e.buffer_bytes, "CUDA context, cuBLAS workspace, NCCL"});
  e.total_bytes = arena.total_bytes + e.buffer_bytes;
  e.parameters = megatron.parameters;
  return e;
}

}  // namespace

planner::PeakMemoryFunction executor_peak_memory() {
  return [](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
            const planner::MemoryOptions& options) {
    executor::TrainOptions train;
    train.bf16 = true;
    planner::MemoryEstimate peak;
    bool first = true;
    try {
      for (int rank : executor::one_rank_per_stage(config)) {
        const auto backend = cuda_sizing_backend();
        const executor::RankArena arena = executor::size_rank_arena(model, config, train, rank, *backend);
        const int pp_rank = arena.coordinates.pp;
        planner::MemoryEstimate e =
            stage_estimate(arena, pp_rank, planner::estimate_memory(model, config, pp_rank, options));
        if (first || e.total_bytes > peak.total_bytes) peak = std::move(e);
        first = false;
      }
    } catch (const std::exception& e) {
      planner::MemoryEstimate megatron = planner::peak_memory(model, config, options);
      megatron.items.insert(
          megatron.items.begin(),
          {"(Megatron's model)", 0, std::string("the executor cannot size it: ") + e.what()});
      return megatron;
    }
    return peak;
  };
}

planner::PeakMemoryFunction peak_memory_function(planner::MemoryModelKind kind) {
  if (kind == planner::MemoryModelKind::kMegatune) return executor_peak_memory();
  return [](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
            const planner::MemoryOptions& options) { return planner::peak_memory(model, config, options); };
}

void add_memory_model_flag(CLI::App& command, planner::MemoryModelKind& kind, const std::string& group) {
  command
      .add_option_function<std::string>(
          "--memory-model",
          [&kind](const std::string& name) {
            kind = name == "megatron" ? planner::MemoryModelKind::kMegatron
                                      : planner::MemoryModelKind::kMegatune;
          },
          std::string("Memory model layouts must fit by: megatune (the executor's own arena, as train "
                      "--dry-run sizes it) or megatron (Megatron-LM's); default ") +
              planner::memory_model_name(kind))
      ->check(CLI::IsMember({"megatune", "megatron"}))
      ->group(group);
}

}  // namespace megatune::tools
