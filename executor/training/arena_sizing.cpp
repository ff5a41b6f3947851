// size_rank_arena: a refusing communicator over the rank's ProcessGroups, and the trainer's sizing pass.
#include "executor/training/arena_sizing.h"

#include <stdexcept>

#include "executor/parallel/communicator.h"
#include "executor/parallel/process_groups.h"
#include "executor/training/trainer.h"

namespace megatune::executor {
namespace {

class SizingCommunicator final : public Communicator {
 public:
  SizingCommunicator(Backend& backend, ProcessGroups groups)
      : Communicator(backend), groups_(std::move(groups)) {}
  int world_rank() const override { return groups_.world_rank(); }
  int world_size() const override { return groups_.world_size(); }
  int rank(CommGroup group) const override { return groups_.rank_in(group); }
  int size(CommGroup group) const override { return groups_.size(group); }
  int global_rank(CommGroup group, int rank_in_group) const override {
    return groups_.global_rank(group, rank_in_group);
  }
  void abort(const std::string& message) override { throw std::runtime_error(message); }

 protected:
  CommHandle do_all_reduce(CommGroup, Tensor, ReduceOp) override { refuse(); }
  CommHandle do_all_gather(CommGroup, Tensor, Tensor) override { refuse(); }
  CommHandle do_reduce_scatter(CommGroup, Tensor, Tensor) override { refuse(); }
  CommHandle do_broadcast(CommGroup, Tensor, int) override { refuse(); }
  CommHandle do_all_to_all(CommGroup, Tensor, Tensor) override { refuse(); }
  CommHandle do_batch_p2p(CommGroup, const std::vector<P2pTransferArgs>&) override { refuse(); }

 private:
  [[noreturn]] static void refuse() { throw std::logic_error("sizing communicator: sizing moves no data"); }
  ProcessGroups groups_;
};

}  // namespace

RankArena size_rank_arena(const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                          const TrainOptions& options, int rank, Backend& backend) {
  RunConfig run = build_run_config(model, config, options, rank);
  if (run.schedule.items.empty())
    run.schedule = single_stage_schedule(run.trainer.model.num_layers, run.trainer.batch.num_microbatches);
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  SizingCommunicator communicator(backend, ProcessGroups(grid, rank));
  RankArena arena;
  arena.rank = rank;
  arena.coordinates = grid.dense_coordinates(rank);
  arena.breakdown = size_training_arena(run.trainer, run.schedule, backend, communicator);
  for (const ArenaUse& use : arena.breakdown) arena.total_bytes += use.bytes;
  return arena;
}

std::vector<int> one_rank_per_stage(const layouts::ParallelConfig& config) {
  const layouts::RankGrid grid = layouts::RankGrid::from_config(config);
  std::vector<int> ranks;
  for (int pp = 0; pp < grid.pp(); ++pp)
    ranks.push_back(grid.rank_of(layouts::DenseCoordinates{0, 0, 0, pp}));
  return ranks;
}

}  // namespace megatune::executor
