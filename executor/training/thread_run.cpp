// train_on_threads: one backend, ThreadCommunicator and TrainingRun per rank thread.
#include "executor/training/thread_run.h"

#include <chrono>
#include <mutex>
#include <ostream>
#include <sstream>

#include "base/user_error.h"
#include "executor/cpu/cpu_backend.h"
#include "executor/cpu/thread_communicator.h"
#include "executor/cpu/thread_world.h"
#include "executor/parallel/process_groups.h"
#include "layouts/rank_grid.h"

namespace megatune::executor {

std::vector<IterationRecord> train_on_threads(const layouts::ModelSpec& model,
                                              const layouts::ParallelConfig& config,
                                              const TrainOptions& options, std::ostream& log,
                                              const std::function<void(int, TrainingRun&)>& inspect,
                                              bool record_first_iteration,
                                              const RankBackendFactory& make_backend) {
  const int world = config.world_size;
  // Refuse a layout the executor cannot run on the caller's thread, before any rank starts.
  for (int r = 0; r < world; ++r) (void)rank_layout(model, config, r);
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  std::vector<IterationRecord> records;
  std::mutex user_error_mutex;
  std::string user_error;
  const auto timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(options.distributed_timeout_s() * 1e3));
  try {
    run_thread_ranks(
        world,
        [&](int rank, ThreadWorld& threads) {
          try {
            RunConfig run = build_run_config(model, config, options, rank);
            run.record_first_iteration = record_first_iteration;
            const std::unique_ptr<Backend> backend =
                make_backend ? make_backend(rank)
                             : std::make_unique<CpuBackend>(/*emulate_bf16=*/options.bf16);
            ThreadCommunicator communicator(*backend, threads, ProcessGroups(grid, rank));
            std::ostringstream quiet;
            const bool last = rank == world - 1;
            TrainingRun training(std::move(run), *backend, communicator, last ? log : quiet);
            std::vector<IterationRecord> mine = training.run();
            if (inspect) inspect(rank, training);
            if (last) records = std::move(mine);
          } catch (const UserError& e) {
            std::lock_guard<std::mutex> lock(user_error_mutex);
            if (user_error.empty()) user_error = e.what();
            throw;
          }
        },
        timeout);
  } catch (const std::runtime_error&) {
    if (!user_error.empty()) throw UserError(user_error);
    throw;
  }
  return records;
}

}  // namespace megatune::executor
