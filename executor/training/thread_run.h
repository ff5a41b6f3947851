// CPU training of a parallel layout with its ranks as threads of this process (CpuBackend +
// ThreadCommunicator per rank): what `megatune train --device cpu` runs when the layout has several ranks,
// and what the layout tests hold against the single-rank run.
#pragma once
#include <functional>
#include <iosfwd>
#include <vector>

#include "executor/training/run_setup.h"

namespace megatune::executor {

// Trains every rank of `config` (config.world_size threads) and returns the last rank's iteration records
// (losses are reported on every rank). `log` receives the last rank's lines (Megatron logs from the last
// rank). `inspect` (optional) runs on each rank's thread after training, with its TrainingRun, before the
// threads join. A failing rank ends every rank; the first failure is rethrown (std::runtime_error, or the
// UserError when the configuration is refused). A blocking collective waits at most
// options.distributed_timeout_s().
std::vector<IterationRecord> train_on_threads(
    const layouts::ModelSpec& model, const layouts::ParallelConfig& config, const TrainOptions& options,
    std::ostream& log, const std::function<void(int rank, TrainingRun& run)>& inspect = {},
    bool record_first_iteration = false);

}  // namespace megatune::executor
