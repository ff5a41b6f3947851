// SimulationCache: what the simulations and lower bounds of one search share, so that candidates differing
// only in their pipeline arrangement or optimizer sharding price and parse nothing twice: each layer kind's
// pass prices per (step-shape knobs, placement of the pass groups), those placements per rank grid, each
// stage's parameters and its priced gradient sync, and the parsed pipeline layouts; all but the layouts are
// keyed by integers. One cache serves one model, pricer and option set (a search's): nothing in its keys
// tells models apart. Thread-safe.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cost_models/op_cost.h"
#include "layouts/model_spec.h"
#include "layouts/op.h"
#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"
#include "layouts/recompute_plan.h"
#include "layouts/step_program.h"
#include "planner/event_engine.h"
#include "planner/op_pricer.h"
#include "planner/simulator.h"

namespace megatune::planner {

// One pass (forward or backward of a layer kind on one microbatch): compute and blocking communication.
struct PassCost {
  double compute_s = 0.0, comm_s = 0.0;
  std::array<double, kCommCategoryCount> comm_by_category{};  // comm_s by what it moves
  std::array<KindTime, kOpKindCount> kinds{};
  void add_comm(CommCategory category, double seconds) {
    comm_s += seconds;
    comm_by_category[static_cast<int>(category)] += seconds;
  }
  void add(const PassCost& other);  // times and counts summed
};
struct SymbolCosts {
  PassCost forward, backward;  // of any micro-batch but the first (the FP8 weight casts are not in them)
  double weight_cast_s = 0.0;  // FP8: its weights' casts, which micro-batch 0's forward adds once
  std::array<std::int64_t, kProvenanceCount> provenance_counts{};  // of the ops priced for it
};

// The groups a layer's passes communicate over; a pass over any other is priced per simulation.
inline constexpr std::array<layouts::CommGroup, 5> kPassGroups = {
    layouts::CommGroup::kTensor, layouts::CommGroup::kContext, layouts::CommGroup::kExpert,
    layouts::CommGroup::kExpertTensor, layouts::CommGroup::kTensorExpert};
using PassPlacements = std::array<cost_models::CollectiveGroup, kPassGroups.size()>;

// The groups gradients are reduced and parameters gathered over, placed per pp rank.
inline constexpr std::array<layouts::CommGroup, 2> kSyncGroups = {layouts::CommGroup::kDataContext,
                                                                  layouts::CommGroup::kExpertData};
using SyncPlacements = std::array<cost_models::CollectiveGroup, kSyncGroups.size()>;
struct GridPlacements {
  PassPlacements pass;                          // every representative rank's
  std::vector<SyncPlacements> sync_by_pp_rank;  // the representative of each pp rank's
};

// A layer kind: E, dense t, MoE t, m or L, and how full recomputation treats it (layouts/recompute_plan.h):
// kept, the last layer of its unit (its backward starts with the unit's re-run), or re-run by a later one.
// The costs of a recomputed layer hold its own re-run, wherever in the pass its unit issues it. Keys are
// dense: 0 <= symbol_key(...) < kSymbolKeyCount.
inline constexpr int kSymbolKeysPerVariant = 8;  // the (symbol, moe) keys of one recompute variant
inline constexpr int kSymbolKeyCount = 3 * kSymbolKeysPerVariant;
int symbol_key(layouts::LayerSymbol symbol, bool moe,
               layouts::LayerRecompute recompute = layouts::LayerRecompute::kKept);

// One stage's gradient reductions and parameter gathers in issue order: each on the communication stream
// (overlapped) or on the compute stream after the rank's last pass, and its time.
struct SyncEntry {
  bool async = false;
  double seconds = 0.0;
};
using StageSync = std::vector<SyncEntry>;

// Per layer kind (symbol_key): its forward and backward pass times (compute + blocking communication), where
// priced.
using PassTimes = std::array<std::optional<std::pair<double, double>>, kSymbolKeyCount>;

class SimulationCache {
 public:
  // The pipeline layout of a valid config, parsed once per distinct arrangement.
  std::shared_ptr<const layouts::PipelineLayout> layout(const layouts::ModelSpec& model,
                                                        const layouts::ParallelConfig& config);
  // The placements of the config's rank grid (nullptr: not cached yet); they stay valid with the cache.
  const GridPlacements* placements(const layouts::ParallelConfig& config);
  void add_placements(const layouts::ParallelConfig& config, const GridPlacements& placements);
  // The parameters a stage of a valid layout (E? t* m* L?) holds on one rank of `shape`.
  std::shared_ptr<const layouts::StageParameters> stage_parameters(const layouts::ModelSpec& model,
                                                                   const layouts::RankShape& shape,
                                                                   const layouts::PipelineStage& stage);
  // One layer kind's pass costs under the config's step shape and those placements (nullptr: not cached
  // yet); they stay valid with the cache.
  const SymbolCosts* symbol_costs(const layouts::ParallelConfig& config, const PassPlacements& placements,
                                  int symbol);
  void add_symbol_costs(const layouts::ParallelConfig& config, const PassPlacements& placements, int symbol,
                        const SymbolCosts& costs);
  // Every layer kind's pass times under the config's step shape and those placements, in one look-up.
  PassTimes pass_times(const layouts::ParallelConfig& config, const PassPlacements& placements);
  // A stage's gradient sync (stage_sync) on a rank of `shape` whose sync groups sit at `placements` (nullptr:
  // not cached yet); add_stage_sync returns the cached entry. They stay valid with the cache.
  const StageSync* stage_sync(const layouts::RankShape& shape, const layouts::ParallelConfig& config,
                              const layouts::PipelineStage& stage, const SyncPlacements& placements);
  const StageSync* add_stage_sync(const layouts::RankShape& shape, const layouts::ParallelConfig& config,
                                  const layouts::PipelineStage& stage, const SyncPlacements& placements,
                                  StageSync sync);

 private:
  // The step-shape knobs and pass placements: what a layer kind's pass prices depend on.
  using ShapeKey = std::array<int, 10 + 2 * kPassGroups.size()>;
  using GridKey = std::array<int, 7>;
  using StageKey = std::array<int, 10>;
  using SyncKey = std::array<int, 10 + 7 + 2 * kSyncGroups.size()>;
  struct IntsHash {
    template <std::size_t N>
    std::size_t operator()(const std::array<int, N>& key) const;
  };
  // The layer kinds priced under one shape key.
  struct ShapeCosts {
    std::array<std::unique_ptr<const SymbolCosts>, kSymbolKeyCount> costs;
    PassTimes times;
  };
  static ShapeKey shape_key(const layouts::ParallelConfig& config, const PassPlacements& placements);
  static GridKey grid_key(const layouts::ParallelConfig& config);
  static StageKey stage_key(const layouts::RankShape& shape, const layouts::PipelineStage& stage);
  static SyncKey sync_key(const layouts::RankShape& shape, const layouts::ParallelConfig& config,
                          const layouts::PipelineStage& stage, const SyncPlacements& placements);

  std::mutex mutex_;
  std::unordered_map<ShapeKey, ShapeCosts, IntsHash> costs_;
  std::unordered_map<GridKey, GridPlacements, IntsHash> placements_;
  std::unordered_map<StageKey, std::shared_ptr<const layouts::StageParameters>, IntsHash> parameters_;
  std::unordered_map<SyncKey, StageSync, IntsHash> syncs_;
  std::unordered_map<std::string, std::shared_ptr<const layouts::PipelineLayout>> layouts_;
};

// A pp rank's gradient reductions and parameter gathers: those on its communication stream (overlapped:
// one after another, all before its optimizer step) and those on its compute stream after its last pass.
struct RankSync {
  double async_s = 0.0, blocking_s = 0.0;
  void add(const StageSync& stage);  // its entries, in order
};
// One chunk's (`stage`'s) from a price for each op (nullopt: cannot price it here).
std::optional<StageSync> stage_sync(const layouts::ModelSpec& model, const layouts::RankShape& shape,
                                    const layouts::ParallelConfig& config,
                                    const layouts::PipelineStage& stage,
                                    const layouts::StepProgramOptions& options, SimulationCache* cache,
                                    const std::function<std::optional<double>(const layouts::Op&)>& price);
// From the rank's chunks (`stages`, by chunk).
std::optional<RankSync> rank_sync(const layouts::ModelSpec& model, const layouts::RankShape& shape,
                                  const layouts::ParallelConfig& config,
                                  const std::vector<const layouts::PipelineStage*>& stages,
                                  const layouts::StepProgramOptions& options, SimulationCache* cache,
                                  const std::function<std::optional<double>(const layouts::Op&)>& price);

// The step time no schedule beats (step_time_lower_bound's argument). For each pp rank r: its compute
// stream runs each of its passes one after another, after the first microbatch's forward went through
// chunk 0 of ranks 0..r-1 and before the last microbatch's backward of chunk 0 goes back through them, then
// its blocking reductions; its communication stream runs every overlapped reduction and gather.
// `pass_s[i]` is stage i's (forward, backward) time (the layout's global order), `sync[r]` rank r's.
double pipeline_lower_bound(const layouts::PipelineLayout& layout, int num_microbatches,
                            const std::vector<std::pair<double, double>>& pass_s,
                            const std::vector<RankSync>& sync);

// The same bound from the cache (parsed layout, placements and every layer kind's prices) and `pricer`;
// nullopt when one of them is not cached yet. Without `with_sync` every rank's sync is taken as zero.
std::optional<double> cached_lower_bound(const layouts::ModelSpec& model,
                                         const layouts::ParallelConfig& config, const OpPricer& pricer,
                                         const layouts::StepProgramOptions& options, SimulationCache& cache,
                                         bool with_sync);

}  // namespace megatune::planner
