// Whether a (model, layout) fits in a GPU's free memory before anything is allocated, and if not, what
// would: the predicted need itemized, the free memory, and the nearest layouts that fit (full
// recomputation, micro-batch 1, a sharded optimizer, or the fewest GPUs with a TP/PP split), so that
// `megatune train` refuses a model that does not fit with advice instead of a raw allocation failure.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "planner/memory_model.h"

namespace megatune::planner {

// The advice part: "it fits with --recompute-granularity full --micro-batch-size 1" and/or "on 4 GPUs with
// --tp 4 ..." ("" when nothing within 1024 GPUs fits).
std::string fitting_alternatives(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                 std::int64_t free_bytes, const MemoryOptions& options = {});

// Whether a layout fits, as the caller judges it (e.g. the executor's own arena sizing).
using LayoutFits = std::function<bool(const layouts::ParallelConfig&)>;

// As above, with `same_gpus_fit` judging the variants on the same GPUs (recomputation, micro-batch 1, a
// sharded optimizer); layouts on more GPUs are judged by the memory model against free_bytes.
std::string fitting_alternatives(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                                 std::int64_t free_bytes, const LayoutFits& same_gpus_fit,
                                 const MemoryOptions& options = {});

// Throws UserError "<model> (<layout>) needs about X per GPU (...) but the GPU has F free of T: <advice>"
// when the predicted peak exceeds free_bytes. total_bytes may be 0 (then only the free memory is named).
void require_fits_in_memory(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                            std::int64_t free_bytes, std::int64_t total_bytes,
                            const MemoryOptions& options = {});

}  // namespace megatune::planner
