// Building a profiling sweep: the deduplicated GEMM, attention and memory-bound shapes a model issues under
// every candidate TP / CP / EP / micro-batch / sequence-parallel layout (read from the step program that
// the planner prices and the executor runs), a generic grid for fitting, and NCCL collectives over sizes
// and every group size the GPUs allow.
#pragma once
#include <cstdint>
#include <vector>

#include "layouts/fp8.h"
#include "layouts/model_spec.h"
#include "profiler/sweep_items.h"

namespace megatune::profiler {

struct SweepCandidates {
  std::vector<int> tensor_parallel = {1, 2, 4, 8};
  std::vector<int> context_parallel = {1, 2};
  std::vector<int> expert_parallel = {1, 2, 4, 8};  // MoE models only
  std::vector<int> micro_batch = {1, 2, 4};
  bool sequence_parallel_variants = true;  // with and without SP when tp > 1
  // FP8 settings of the step programs (profile's FP8 flags): with FP8 on, the linears' GEMMs are FP8 items
  // and their casts memory-bound FP8 casts (MemoryBoundItem), as `train --fp8-format` issues them.
  layouts::Fp8Settings fp8;
};

struct ModelSweepReport {
  int layouts_expanded = 0;
  int layouts_invalid = 0;          // candidate combinations the model does not allow (heads % tp, ...)
  int cross_attention_skipped = 0;  // attention ops with seq_q != seq_kv (context-parallel chunks): the
                                    // executor's kernels are self-attention only
};

// The kernels of one rank's step program for each valid candidate layout (pp 1; dp = ep for MoE so that
// the expert grid fits), deduplicated by database key.
Sweep model_sweep(const layouts::ModelSpec& model, const SweepCandidates& candidates,
                  ModelSweepReport* report = nullptr);

// A model-independent grid for fitting: GEMMs over powers of two, attention over batch / heads / groups /
// sequence / head dim, memory-bound kinds over sizes. `quick` keeps just enough points for every fit.
Sweep generic_kernel_grid(bool quick);

// Every collective op over group sizes 2..gpus and sizes min_bytes..max_bytes in powers of two (powers of
// four when quick). Empty when gpus < 2.
std::vector<CollectiveItem> collective_sweep(int gpus, bool quick, std::int64_t min_bytes = 1024,
                                             std::int64_t max_bytes = std::int64_t(1) << 30);

// Appends the items of `from` whose database key `into` does not hold yet.
void merge_sweep(Sweep& into, const Sweep& from);

}  // namespace megatune::profiler
