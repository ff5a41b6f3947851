// size_rank_arena: a refusing communicator over the rank's ProcessGroups, and the trainer's sizing pass.
#include "executor/training/arena_sizing.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "executor/model/moe_row_arena.h"
#include "executor/model/parameter_layout.h"
#include "executor/parallel/communicator.h"
#include "executor/parallel/process_groups.h"
#include "executor/parallel/state_labels.h"
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
  CommHandle do_all_to_all(CommGroup, Tensor, const std::vector<std::int64_t>&, Tensor,
                           const std::vector<std::int64_t>&) override {
    refuse();
  }
  CommHandle do_batch_p2p(CommGroup, const std::vector<P2pTransferArgs>&) override { refuse(); }

 private:
  [[noreturn]] static void refuse() { throw std::logic_error("sizing communicator: sizing moves no data"); }
  ProcessGroups groups_;
};

// The rank's parameter counts over its model chunks.
void count_parameters(const TrainerConfig& trainer, RankArena& arena) {
  std::vector<StageSpan> chunks =
      trainer.chunks.empty() ? std::vector<StageSpan>{StageSpan{}} : trainer.chunks;
  for (const StageSpan& chunk : chunks) {
    const ParameterLayout layout(trainer.model, chunk);
    for (const ParameterEntry& e : layout.entries()) {
      arena.parameters += e.numel();
      if (e.expert >= 0) arena.expert_parameters += e.numel();
    }
  }
}

// Megatron's bytes per parameter of the weights, gradients and optimizer state over d ranks (megatron.md
// §5; Megatron FSDP shards the fp32 gradients too under optim_grads, and the weights under
// optim_grads_params). An fp32 model's weights are its main parameters (4 B, the state its moments).
double megatron_bytes_per_parameter(bool bf16, layouts::DataParallelSharding sharding, int d) {
  const double weights = bf16 ? 2.0 : 4.0, grads = 4.0, state = bf16 ? 12.0 : 8.0;
  switch (sharding) {
    case layouts::DataParallelSharding::kNoShard:
      return weights + grads + state;
    case layouts::DataParallelSharding::kOptim:
      return weights + grads + state / d;
    case layouts::DataParallelSharding::kOptimGrads:
      return weights + (grads + state) / d;
    case layouts::DataParallelSharding::kOptimGradsParams:
      return (weights + grads + state) / d;
  }
  return weights + grads + state;
}

void add_state_bytes(const TrainerConfig& trainer, const Communicator& communicator, RankArena& arena) {
  count_parameters(trainer, arena);
  const double parameters = static_cast<double>(std::max<std::int64_t>(arena.parameters, 1));
  for (const char* state : {state_label::kModelParams, state_label::kMainGrads, state_label::kMainParams,
                            state_label::kMoments}) {
    ParameterStateBytes row;
    row.state = state;
    for (const ArenaUse& use : arena.breakdown)
      if (use.what == state) row.bytes += use.bytes;
    row.bytes_per_parameter = static_cast<double>(row.bytes) / parameters;
    arena.state_bytes.push_back(row);
  }
  const bool bf16 = trainer.compute_dtype != DType::kFP32;
  const layouts::DataParallelSharding dist =
      trainer.fsdp ? *trainer.fsdp
                   : (trainer.use_distributed_optimizer ? layouts::DataParallelSharding::kOptim
                                                        : layouts::DataParallelSharding::kNoShard);
  const double dense = static_cast<double>(arena.parameters - arena.expert_parameters),
               experts = static_cast<double>(arena.expert_parameters);
  arena.megatron_bytes_per_parameter =
      (dense * megatron_bytes_per_parameter(bf16, dist, communicator.size(CommGroup::kDataContext)) +
       experts * megatron_bytes_per_parameter(bf16, dist, communicator.size(CommGroup::kExpertData))) /
      parameters;
}

// The MoE layers' expert rows as the sizing pass took them (moe_row_arena.h), when the stage holds any.
void add_moe_rows_note(const TrainerConfig& trainer, const Communicator& communicator, RankArena& arena) {
  const bool sized = std::any_of(arena.breakdown.begin(), arena.breakdown.end(),
                                 [](const ArenaUse& u) { return u.what == MoeRowArena::kSavedLabel; });
  if (!sized) return;
  const TransformerConfig& model = trainer.model;
  const std::int64_t local_tokens =
      rank_shape(model, trainer.batch.micro_batch, trainer.batch.seq).tokens / model.tensor_parallel_size;
  const MoeExpertRows rows = moe_expert_rows(model, local_tokens, communicator.size(CommGroup::kExpert),
                                             communicator.size(CommGroup::kExpertTensor));
  arena.sizing_notes.push_back("MoE expert rows: " + std::to_string(rows.expected) +
                               " per layer and micro-batch (" + rows.rule + "; at most " +
                               std::to_string(rows.bound) + ")");
}

}  // namespace

std::string format_sizing_notes(const RankArena& arena) {
  std::string out;
  for (const std::string& note : arena.sizing_notes) out += "  " + note + "\n";
  return out;
}

std::string format_parameter_state_bytes(const RankArena& arena) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "  bytes per parameter by state (%.4g parameters on this rank):\n",
                static_cast<double>(arena.parameters));
  out += line;
  double total = 0.0;
  for (const ParameterStateBytes& row : arena.state_bytes) {
    std::snprintf(line, sizeof line, "    %-34s %6.2f  (%.3f GiB)\n", row.state.c_str(),
                  row.bytes_per_parameter, static_cast<double>(row.bytes) / (1024.0 * 1024.0 * 1024.0));
    out += line;
    total += row.bytes_per_parameter;
  }
  std::snprintf(line, sizeof line, "    %-34s %6.2f  (Megatron-LM: %.2f)\n", "total", total,
                arena.megatron_bytes_per_parameter);
  return out + line;
}

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
  add_state_bytes(run.trainer, communicator, arena);
  add_moe_rows_note(run.trainer, communicator, arena);
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
