// Training of a parallel layout with its ranks as threads of this process (a backend + ThreadCommunicator
// per rank): what `megatune train --device cpu` runs when the layout has several ranks, and what the layout
// tests hold against the single-rank run. With CUDA backends (one per rank thread, on one GPU) it is the
// CUDA twin of the CPU threads: the CUDA kernels under a parallel layout, the data moved through the host.
#pragma once
#include <functional>
#include <iosfwd>
#include <memory>
#include <vector>

#include "executor/backend/backend.h"
#include "executor/training/run_setup.h"

namespace megatune::executor {

// Trains every rank of `config` (config.world_size threads) and returns the last rank's iteration records
// (losses are reported on every rank). `log` receives the last rank's lines (Megatron logs from the last
// rank). `inspect` (optional) runs on each rank's thread after training, with its TrainingRun, before the
// threads join. A failing rank ends every rank; the first failure is rethrown (std::runtime_error, or the
// UserError when the configuration is refused). A blocking collective waits at most
// options.distributed_timeout_s(). `make_backend` builds each rank's backend on its thread (empty: a
// CpuBackend, bf16 emulated when options.bf16).
using RankBackendFactory = std::function<std::unique_ptr<Backend>(int rank)>;
std::vector<IterationRecord> train_on_threads(
    const layouts::ModelSpec& model, const layouts::ParallelConfig& config, const TrainOptions& options,
    std::ostream& log, const std::function<void(int rank, TrainingRun& run)>& inspect = {},
    bool record_first_iteration = false, const RankBackendFactory& make_backend = {});

}  // namespace megatune::executor
