// SimulationCache: keyed maps under one mutex; the pipeline bound from stage pass times.
#include "planner/simulation_cache.h"

#include <algorithm>

namespace megatune::planner {

using layouts::LayerSymbol;
using layouts::PipelineStage;

int symbol_key(LayerSymbol symbol, bool moe, layouts::LayerRecompute recompute) {
  constexpr std::array<LayerSymbol, 4> kinds = {LayerSymbol::kEmbedding, LayerSymbol::kDecoder,
                                                LayerSymbol::kMtp, LayerSymbol::kLoss};
  const int kind = static_cast<int>(std::find(kinds.begin(), kinds.end(), symbol) - kinds.begin());
  return kind * 2 + (moe ? 1 : 0) + kSymbolKeysPerVariant * static_cast<int>(recompute);
}

void PassCost::add(const PassCost& other) {
  compute_s += other.compute_s;
  comm_s += other.comm_s;
  for (int c = 0; c < kCommCategoryCount; ++c) comm_by_category[c] += other.comm_by_category[c];
  for (int k = 0; k < kOpKindCount; ++k) {
    kinds[k].total_s += other.kinds[k].total_s;
    kinds[k].count += other.kinds[k].count;
  }
}

template <std::size_t N>
std::size_t SimulationCache::IntsHash::operator()(const std::array<int, N>& key) const {
  std::size_t h = 1469598103934665603ull;
  for (int v : key) h = (h ^ static_cast<std::size_t>(static_cast<unsigned>(v))) * 1099511628211ull;
  return h;
}

SimulationCache::ShapeKey SimulationCache::shape_key(const layouts::ParallelConfig& c,
                                                     const PassPlacements& placements) {
  ShapeKey key{c.tp(),
               c.cp(),
               c.ep(),
               c.etp(),
               c.micro_batch_size,
               c.sequence_parallel_enabled() ? 1 : 0,
               static_cast<int>(c.recompute_granularity),
               0,  // full recomputation's method and unit size: in the symbol's recompute variant
               0,
               static_cast<int>(c.moe_token_dispatcher_type)};
  std::size_t at = 10;
  for (const cost_models::CollectiveGroup& placement : placements) {
    key[at++] = placement.size;
    key[at++] = placement.nodes;
  }
  return key;
}

SimulationCache::StageKey SimulationCache::stage_key(const layouts::RankShape& shape,
                                                     const PipelineStage& stage) {
  // A valid layout's stage is E? t* m* L?: its counts and first layers say which layers it holds.
  return {shape.tp,
          shape.ep,
          shape.etp,
          stage.first_decoder_layer,
          stage.num_decoder_layers,
          stage.first_mtp_layer,
          stage.num_mtp_layers,
          stage.has_embedding ? 1 : 0,
          stage.has_loss ? 1 : 0,
          static_cast<int>(stage.symbols.size())};
}

SimulationCache::SyncKey SimulationCache::sync_key(const layouts::RankShape& shape,
                                                   const layouts::ParallelConfig& config,
                                                   const PipelineStage& stage,
                                                   const SyncPlacements& placements) {
  SyncKey key{};
  const StageKey parameters = stage_key(shape, stage);
  std::copy(parameters.begin(), parameters.end(), key.begin());
  std::size_t at = parameters.size();
  for (int v : {stage.vpp_rank, shape.dp, shape.cp, shape.edp, static_cast<int>(config.sharding()),
                config.overlap_grad_reduce ? 1 : 0, config.overlap_param_gather ? 1 : 0})
    key[at++] = v;
  for (const cost_models::CollectiveGroup& placement : placements) {
    key[at++] = placement.size;
    key[at++] = placement.nodes;
  }
  return key;
}

SimulationCache::GridKey SimulationCache::grid_key(const layouts::ParallelConfig& c) {
  return {c.world_size, c.tp(), c.cp(), c.pp(), c.ep(), c.etp(), static_cast<int>(c.rank_order)};
}

std::shared_ptr<const layouts::PipelineLayout> SimulationCache::layout(const layouts::ModelSpec& model,
                                                                       const layouts::ParallelConfig& c) {
  const std::string key = c.pipeline_model_parallel_layout + '|' + std::to_string(model.num_layers) + ' ' +
                          std::to_string(model.mtp_num_layers) + ' ' + std::to_string(c.pp()) + ' ' +
                          std::to_string(c.num_layers_per_virtual_pipeline_stage) + ' ' +
                          std::to_string(c.num_virtual_stages_per_pipeline_rank) + ' ' +
                          std::to_string(c.decoder_first_pipeline_num_layers) + ' ' +
                          std::to_string(c.decoder_last_pipeline_num_layers) + ' ' +
                          std::to_string(c.account_for_embedding_in_pipeline_split) +
                          std::to_string(c.account_for_loss_in_pipeline_split);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = layouts_.find(key);
    if (it != layouts_.end()) return it->second;
  }
  auto parsed = std::make_shared<const layouts::PipelineLayout>(c.resolved_pipeline_layout(model));
  std::lock_guard<std::mutex> lock(mutex_);
  return layouts_.emplace(key, std::move(parsed)).first->second;
}

const GridPlacements* SimulationCache::placements(const layouts::ParallelConfig& config) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = placements_.find(grid_key(config));
  return it == placements_.end() ? nullptr : &it->second;
}

void SimulationCache::add_placements(const layouts::ParallelConfig& config,
                                     const GridPlacements& placements) {
  std::lock_guard<std::mutex> lock(mutex_);
  placements_.emplace(grid_key(config), placements);
}

std::shared_ptr<const layouts::StageParameters> SimulationCache::stage_parameters(
    const layouts::ModelSpec& model, const layouts::RankShape& shape, const PipelineStage& stage) {
  const StageKey key = stage_key(shape, stage);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = parameters_.find(key);
    if (it != parameters_.end()) return it->second;
  }
  auto counted =
      std::make_shared<const layouts::StageParameters>(layouts::stage_parameters(model, shape, stage));
  std::lock_guard<std::mutex> lock(mutex_);
  return parameters_.emplace(key, std::move(counted)).first->second;
}

const SymbolCosts* SimulationCache::symbol_costs(const layouts::ParallelConfig& config,
                                                 const PassPlacements& placements, int symbol) {
  const ShapeKey key = shape_key(config, placements);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = costs_.find(key);
  return it == costs_.end() ? nullptr : it->second.costs[symbol].get();
}

void SimulationCache::add_symbol_costs(const layouts::ParallelConfig& config,
                                       const PassPlacements& placements, int symbol,
                                       const SymbolCosts& costs) {
  const ShapeKey key = shape_key(config, placements);
  std::lock_guard<std::mutex> lock(mutex_);
  ShapeCosts& shape = costs_[key];
  if (shape.costs[symbol]) return;  // another thread priced it first: the same costs
  shape.costs[symbol] = std::make_unique<const SymbolCosts>(costs);
  shape.times[symbol] = {
      {costs.forward.compute_s + costs.forward.comm_s, costs.backward.compute_s + costs.backward.comm_s}};
}

PassTimes SimulationCache::pass_times(const layouts::ParallelConfig& config,
                                      const PassPlacements& placements) {
  const ShapeKey key = shape_key(config, placements);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = costs_.find(key);
  return it == costs_.end() ? PassTimes{} : it->second.times;
}

const StageSync* SimulationCache::stage_sync(const layouts::RankShape& shape,
                                             const layouts::ParallelConfig& config,
                                             const PipelineStage& stage, const SyncPlacements& placements) {
  const SyncKey key = sync_key(shape, config, stage, placements);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = syncs_.find(key);
  return it == syncs_.end() ? nullptr : &it->second;
}

const StageSync* SimulationCache::add_stage_sync(const layouts::RankShape& shape,
                                                 const layouts::ParallelConfig& config,
                                                 const PipelineStage& stage, const SyncPlacements& placements,
                                                 StageSync sync) {
  const SyncKey key = sync_key(shape, config, stage, placements);
  std::lock_guard<std::mutex> lock(mutex_);
  return &syncs_.emplace(key, std::move(sync)).first->second;
}

void RankSync::add(const StageSync& stage) {
  for (const SyncEntry& entry : stage) (entry.async ? async_s : blocking_s) += entry.seconds;
}

std::optional<StageSync> stage_sync(const layouts::ModelSpec& model, const layouts::RankShape& shape,
                                    const layouts::ParallelConfig& config, const PipelineStage& stage,
                                    const layouts::StepProgramOptions& options, SimulationCache* cache,
                                    const std::function<std::optional<double>(const layouts::Op&)>& price) {
  const std::shared_ptr<const layouts::StageParameters> parameters =
      cache != nullptr
          ? cache->stage_parameters(model, shape, stage)
          : std::make_shared<const layouts::StageParameters>(layouts::stage_parameters(model, shape, stage));
  StageSync sync;
  for (const layouts::GradBucket& bucket :
       layouts::grad_sync_buckets(shape, config, *parameters, stage.vpp_rank, options)) {
    const std::optional<double> reduce = price(bucket.op);
    if (!reduce) return std::nullopt;
    sync.push_back({config.overlap_grad_reduce, *reduce});
    // The gather after the step (FSDP optim_grads_params gathers in the passes instead).
    if (!config.shards_optimizer_state() || config.shards_parameters()) continue;
    const std::optional<double> gather = price(layouts::param_gather_op(bucket));
    if (!gather) return std::nullopt;
    sync.push_back({config.overlap_param_gather, *gather});
  }
  return sync;
}

std::optional<RankSync> rank_sync(const layouts::ModelSpec& model, const layouts::RankShape& shape,
                                  const layouts::ParallelConfig& config,
                                  const std::vector<const PipelineStage*>& stages,
                                  const layouts::StepProgramOptions& options, SimulationCache* cache,
                                  const std::function<std::optional<double>(const layouts::Op&)>& price) {
  RankSync sync;
  for (const PipelineStage* stage : stages) {
    const std::optional<StageSync> entries = stage_sync(model, shape, config, *stage, options, cache, price);
    if (!entries) return std::nullopt;
    sync.add(*entries);
  }
  return sync;
}

double pipeline_lower_bound(const layouts::PipelineLayout& layout, int num_microbatches,
                            const std::vector<std::pair<double, double>>& pass_s,
                            const std::vector<RankSync>& sync) {
  double bound = 0.0, fill = 0.0, drain = 0.0;
  for (int pp_rank = 0; pp_rank < layout.pp(); ++pp_rank) {
    double work = 0.0;
    for (const PipelineStage* stage : layout.stages_of_rank(pp_rank))
      work += pass_s[stage->stage_index].first + pass_s[stage->stage_index].second;
    const RankSync& s = sync[pp_rank];
    bound = std::max({bound, fill + work * num_microbatches + std::max(drain, s.blocking_s), s.async_s});
    const std::pair<double, double>& first_chunk = pass_s[layout.stage(pp_rank, 0).stage_index];
    fill += first_chunk.first;  // what the next ranks wait for
    drain += first_chunk.second;
  }
  return bound * (1.0 - 1e-12);  // the simulation adds the same times in another order
}

namespace {

// Each stage's (forward, backward) pass time from the cached layer-kind prices; nullopt when one is missing.
std::optional<std::vector<std::pair<double, double>>> cached_pass_s(const layouts::ModelSpec& model,
                                                                    const layouts::ParallelConfig& config,
                                                                    const layouts::PipelineLayout& layout,
                                                                    const PassPlacements& placements,
                                                                    SimulationCache& cache) {
  const PassTimes symbols = cache.pass_times(config, placements);
  const layouts::RecomputeSettings recompute = layouts::RecomputeSettings::of(config);
  std::vector<std::pair<double, double>> pass_s(layout.stages().size());
  for (const PipelineStage& stage : layout.stages()) {
    int next_layer = stage.first_decoder_layer, position = 0;
    for (LayerSymbol sym : stage.symbols) {
      const bool moe = sym == LayerSymbol::kDecoder && model.is_moe_layer(next_layer);
      layouts::LayerRecompute variant = layouts::LayerRecompute::kKept;
      if (sym == LayerSymbol::kDecoder) {
        ++next_layer;
        variant = layouts::decoder_layer_recompute(recompute, position++, stage.num_decoder_layers);
      } else if (sym == LayerSymbol::kMtp) {
        variant = layouts::mtp_layer_recompute(recompute);
      }
      const std::optional<std::pair<double, double>>& cost = symbols[symbol_key(sym, moe, variant)];
      if (!cost) return std::nullopt;
      pass_s[stage.stage_index].first += cost->first;
      pass_s[stage.stage_index].second += cost->second;
    }
  }
  return pass_s;
}

}  // namespace

std::optional<double> cached_lower_bound(const layouts::ModelSpec& model,
                                         const layouts::ParallelConfig& config, const OpPricer& pricer,
                                         const layouts::StepProgramOptions& options, SimulationCache& cache,
                                         bool with_sync) {
  const GridPlacements* placements = cache.placements(config);
  if (placements == nullptr) return std::nullopt;
  const std::shared_ptr<const layouts::PipelineLayout> layout = cache.layout(model, config);
  const std::optional<std::vector<std::pair<double, double>>> pass_s =
      cached_pass_s(model, config, *layout, placements->pass, cache);
  if (!pass_s) return std::nullopt;
  const layouts::RankShape shape = layouts::resolve_rank_shape(model, config);
  std::vector<RankSync> sync(layout->pp());
  for (int pp_rank = 0; with_sync && pp_rank < layout->pp(); ++pp_rank) {
    const SyncPlacements& placed = placements->sync_by_pp_rank[pp_rank];
    auto price = [&](const layouts::Op& op) -> std::optional<double> {
      const auto group = std::find(kSyncGroups.begin(), kSyncGroups.end(), op.group);
      if (group == kSyncGroups.end()) return std::nullopt;
      return pricer.price(op, placed[group - kSyncGroups.begin()]).time_s;
    };
    for (const PipelineStage* stage : layout->stages_of_rank(pp_rank)) {
      const StageSync* entries = cache.stage_sync(shape, config, *stage, placed);
      if (entries == nullptr) {
        std::optional<StageSync> priced = stage_sync(model, shape, config, *stage, options, &cache, price);
        if (!priced) return std::nullopt;
        entries = cache.add_stage_sync(shape, config, *stage, placed, std::move(*priced));
      }
      sync[pp_rank].add(*entries);
    }
  }
  return pipeline_lower_bound(*layout, config.num_microbatches(), *pass_s, sync);
}

}  // namespace megatune::planner
