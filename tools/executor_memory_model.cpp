// executor_peak_memory: size_rank_arena over one rank per pipeline stage, each distinct stage sized once (a
// stage is keyed by the model, the layout's knobs, its model chunks and their activation slots), plus the
// non-arena buffers.
#include "tools/executor_memory_model.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "executor/backend/sizing_backend.h"
#include "executor/model/moe_row_arena.h"
#include "executor/training/arena_sizing.h"
#include "executor/training/trainer_schedule.h"  // activation_slots_per_chunk
#include "layouts/schedule.h"
#include "layouts/step_program.h"
#include "planner/plan_report.h"
#ifdef MEGATUNE_HAVE_CUDA
#include "executor/cuda/flash_attention.h"
#endif

namespace megatune::tools {
namespace {

// One stage's arena, or why the executor cannot size it.
struct SizedStage {
  std::vector<executor::ArenaUse> breakdown;
  std::vector<executor::ParameterStateBytes> state_bytes;
  std::int64_t total_bytes = 0;
  std::string error;  // non-empty: the executor refused the layout
};

// Sized stages and stage parameter counts by key; thread-safe. Two threads may size one key at once: both
// get the same answer.
class StageArenaCache {
 public:
  template <typename Count>
  std::int64_t find_or_count(const std::string& key, Count count) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = parameters_.find(key);
      if (it != parameters_.end()) return it->second;
    }
    const std::int64_t counted = count();
    std::lock_guard<std::mutex> lock(mutex_);
    return parameters_.emplace(key, counted).first->second;
  }

  template <typename Size>
  std::shared_ptr<const SizedStage> find_or_size(const std::string& key, Size size) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = stages_.find(key);
      if (it != stages_.end()) return it->second;
    }
    auto sized = std::make_shared<const SizedStage>(size());
    std::lock_guard<std::mutex> lock(mutex_);
    return stages_.emplace(key, std::move(sized)).first->second;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const SizedStage>> stages_;
  std::unordered_map<std::string, std::int64_t> parameters_;
};

// Everything of a (model, layout) that shapes each stage's arena, except how the layers are split over the
// stages (the stage key adds that stage's chunks).
std::string layout_key(const std::string& model_key, const layouts::ParallelConfig& c) {
  std::ostringstream key;
  key << model_key << '|' << c.world_size << ' ' << c.tp() << ' ' << c.pp() << ' ' << c.cp() << ' ' << c.ep()
      << ' ' << c.etp() << ' ' << c.dp() << ' ' << c.micro_batch_size << ' ' << c.resolved_global_batch_size()
      << ' ' << static_cast<int>(c.recompute_granularity) << ' ' << static_cast<int>(c.recompute_method)
      << ' ' << c.recompute_num_layers << ' ' << c.use_distributed_optimizer << c.overlap_grad_reduce
      << c.overlap_param_gather << c.overlap_p2p_comm << c.sequence_parallel_enabled() << ' '
      << c.micro_batch_group_size() << ' ' << static_cast<int>(c.rank_order) << ' '
      << static_cast<int>(c.moe_token_dispatcher_type) << ' ' << c.fsdp() << static_cast<int>(c.sharding());
  return key.str();
}

std::vector<executor::StageSpan> chunks_of(const layouts::PipelineLayout& layout, int pp_rank) {
  std::vector<executor::StageSpan> chunks;
  for (const layouts::PipelineStage* stage : layout.stages_of_rank(pp_rank))
    chunks.push_back({stage->first_decoder_layer, stage->num_decoder_layers, stage->has_embedding,
                      stage->has_loss, stage->first_mtp_layer, stage->num_mtp_layers});
  return chunks;
}

// The key of pp rank `pp_rank`'s stage: the layout's key, the rank's end position, its chunks and the
// activation slots the executor gives each chunk under the rank's schedule.
std::string stage_key(const std::string& layout, const layouts::ParallelConfig& config,
                      const layouts::PipelineLayout& pipeline, int pp_rank) {
  const std::vector<executor::StageSpan> chunks = chunks_of(pipeline, pp_rank);
  const layouts::RankSchedule schedule = layouts::build_rank_schedule(
      pipeline, config.num_microbatches(), config.micro_batch_group_size(), pp_rank);
  const std::vector<int> slots = executor::activation_slots_per_chunk(schedule, chunks);
  std::ostringstream key;
  key << layout << '|' << (pp_rank == 0) << (pp_rank + 1 == config.pp());
  for (std::size_t c = 0; c < chunks.size(); ++c)
    key << ' ' << chunks[c].first_layer << ':' << chunks[c].num_layers << ':' << chunks[c].has_embedding
        << chunks[c].has_loss << ':' << chunks[c].first_mtp_layer << ':' << chunks[c].num_mtp_layers << 'x'
        << slots[c];
  return key.str();
}

// The parameters pp rank `pp_rank` holds (the planner's count), keyed by what they depend on: the model,
// tp, ep, etp and the rank's chunks.
std::int64_t rank_parameters(StageArenaCache& cache, const std::string& model_key,
                             const layouts::ModelSpec& model, const layouts::RankShape& shape,
                             const layouts::PipelineLayout& pipeline, int pp_rank) {
  std::ostringstream key;
  key << model_key << '|' << shape.tp << ' ' << shape.ep << ' ' << shape.etp;
  for (const layouts::PipelineStage* stage : pipeline.stages_of_rank(pp_rank))
    key << ' ' << stage->to_string() << '@' << stage->first_decoder_layer << '/' << stage->first_mtp_layer;
  return cache.find_or_count(key.str(), [&] {
    std::int64_t total = 0;
    for (const layouts::PipelineStage* stage : pipeline.stages_of_rank(pp_rank)) {
      const layouts::StageParameters p = layouts::stage_parameters(model, shape, *stage);
      total += p.dense + p.expert;
    }
    return total;
  });
}

// A lower bound of every pp rank's peak under the executor's model and Megatron's fallback: unless FSDP
// optim_grads / optim_grads_params shards them, the gradient bytes of every parameter (the executor's whole
// gradient buffer, one element per parameter: the test holds its element count against the planner's), and
// unless optim_grads_params shards them 2 bytes of bf16 weights, before the main parameters and moments;
// both add the device buffers.
std::int64_t peak_lower_bound(StageArenaCache& cache, const std::string& model_key,
                              const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                              const layouts::RankShape& shape, const layouts::PipelineLayout& pipeline,
                              const planner::MemoryOptions& options, std::int64_t buffer_bytes) {
  const std::int64_t bytes_per_parameter =
      (config.shards_parameters() ? 0 : 2) +
      (config.shards_gradients() ? 0 : (options.grad_reduce_in_bf16 ? 2 : 4));
  std::int64_t most = 0;
  for (int pp = 0; pp < pipeline.pp(); ++pp)
    most = std::max(most, rank_parameters(cache, model_key, model, shape, pipeline, pp));
  return bytes_per_parameter * most + buffer_bytes;
}

// The stage as train sizes it, FP8 linears included (their weight copies, transposes and cast buffers).
SizedStage size_stage(const layouts::ModelSpec& model, const layouts::ParallelConfig& config, int rank,
                      const layouts::Fp8Settings& fp8) {
  SizedStage out;
  try {
    executor::TrainOptions train;
    train.bf16 = true;
    train.fp8 = fp8;
    const auto backend = executor_sizing_backend();
    executor::RankArena arena = executor::size_rank_arena(model, config, train, rank, *backend);
    out.breakdown = std::move(arena.breakdown);
    out.state_bytes = std::move(arena.state_bytes);
    out.total_bytes = arena.total_bytes;
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

planner::MemoryEstimate stage_estimate(const SizedStage& arena, int pp_rank,
                                       const planner::MemoryItem& buffers) {
  planner::MemoryEstimate e;
  e.pp_rank = pp_rank;
  for (const executor::ArenaUse& use : arena.breakdown) {
    // The MoE expert rows are blocks beside the arena, sized here to the balanced routing (moe_row_arena.h).
    const bool routed_rows =
        use.what == executor::MoeRowArena::kSavedLabel || use.what == executor::MoeRowArena::kScratchLabel;
    std::string note =
        std::string(routed_rows ? "executor, beside the arena (balanced routing), " : "executor arena, ") +
        std::to_string(use.allocations) + (use.allocations == 1 ? " allocation" : " allocations");
    for (const executor::ParameterStateBytes& state : arena.state_bytes)
      if (state.state == use.what) {
        char per[48];
        std::snprintf(per, sizeof per, ", %.2f bytes/parameter", state.bytes_per_parameter);
        note += per;
      }
    e.items.push_back({use.what, use.bytes, note});
  }
  e.buffer_bytes = buffers.bytes;
  e.items.push_back({"buffers outside the arena", e.buffer_bytes, "CUDA context, cuBLAS workspace, NCCL"});
  e.total_bytes = arena.total_bytes + e.buffer_bytes;
  return e;
}

planner::MemoryEstimate megatron_fallback(const layouts::ModelSpec& model,
                                          const layouts::ParallelConfig& config,
                                          const planner::MemoryOptions& options, const std::string& why) {
  planner::MemoryEstimate megatron = planner::peak_memory(model, config, options);
  megatron.items.insert(megatron.items.begin(),
                        {"(Megatron's model)", 0, "the executor cannot size it: " + why});
  return megatron;
}

// The peak over the stages, sizing each distinct stage once; stops early past options.stop_above_bytes.
// Throws what the executor says of a layout it cannot size.
planner::MemoryEstimate cached_peak(StageArenaCache& cache, const layouts::ModelSpec& model,
                                    const layouts::ParallelConfig& config,
                                    const planner::MemoryOptions& options) {
  const std::string model_key = planner::describe_model(model);
  const std::string layout = layout_key(model_key, config) + " " + layouts::describe(options.step.fp8);
  const layouts::PipelineLayout pipeline = config.resolved_pipeline_layout(model);
  const layouts::RankShape shape = layouts::resolve_rank_shape(model, config);
  const planner::MemoryItem buffers = planner::device_buffers(shape, options);
  if (options.stop_above_bytes > 0) {  // hopeless layouts are refused before any sizing
    const std::int64_t bound =
        peak_lower_bound(cache, model_key, model, config, shape, pipeline, options, buffers.bytes);
    if (bound > options.stop_above_bytes) {
      planner::MemoryEstimate e;
      e.total_bytes = bound;
      e.buffer_bytes = buffers.bytes;
      e.items.push_back({"(lower bound)", bound, "parameters and gradients alone"});
      e.complete = false;
      return e;
    }
  }
  const std::vector<int> ranks = executor::one_rank_per_stage(config);
  std::shared_ptr<const SizedStage> peak;
  int peak_pp = 0;
  bool complete = true;
  for (int pp = 0; pp < static_cast<int>(ranks.size()); ++pp) {
    std::shared_ptr<const SizedStage> stage =
        cache.find_or_size(stage_key(layout, config, pipeline, pp),
                           [&] { return size_stage(model, config, ranks[pp], options.step.fp8); });
    if (!stage->error.empty()) throw std::runtime_error(stage->error);
    if (!peak || stage->total_bytes > peak->total_bytes) {
      peak = std::move(stage);
      peak_pp = pp;
    }
    if (options.stop_above_bytes > 0 && peak->total_bytes + buffers.bytes > options.stop_above_bytes &&
        pp + 1 < static_cast<int>(ranks.size())) {
      complete = false;
      break;
    }
  }
  planner::MemoryEstimate e = stage_estimate(*peak, peak_pp, buffers);
  e.parameters = planner::estimate_memory(model, config, peak_pp, options).parameters;
  e.complete = complete;
  return e;
}

}  // namespace

std::unique_ptr<executor::Backend> executor_sizing_backend() {
#ifdef MEGATUNE_HAVE_CUDA
  return std::make_unique<executor::SizingBackend>(nullptr, executor::cuda::flash_attention_unsupported);
#else
  return std::make_unique<executor::SizingBackend>();
#endif
}

planner::PeakMemoryFunction executor_peak_memory() {
  auto cache = std::make_shared<StageArenaCache>();
  return [cache](const layouts::ModelSpec& model, const layouts::ParallelConfig& config,
                 const planner::MemoryOptions& options) {
    try {
      return cached_peak(*cache, model, config, options);
    } catch (const std::exception& e) {
      return megatron_fallback(model, config, options, e.what());
    }
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
