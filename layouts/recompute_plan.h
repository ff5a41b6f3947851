// Recompute plan: which layers of one model chunk full recomputation re-runs, and how they group into
// checkpointed units (Megatron's megatron/core/recompute.py checkpointed_forward, per TransformerBlock, i.e.
// per model chunk on its pipeline rank):
// - --recompute-method uniform N: the chunk's layers split into consecutive groups of N (the last holds the
//   rest); each group is one unit: only its input is saved, and the whole group is re-run right before the
//   backward of its last layer.
// - --recompute-method block N: the chunk's first N layers are units of one layer each; the rest keep all
//   their activations (N >= the chunk's layers: every layer is recomputed).
// MTP layers (Megatron's MultiTokenPredictionLayer) are checkpointed one by one under uniform (Megatron
// asserts N == 1 there; ParallelConfig::validate refuses uniform N > 1 with MTP) and not at all under block.
// Without full recomputation the plan is empty: every layer keeps its activations.
#pragma once
#include <vector>

#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"

namespace megatune::layouts {

// The recomputation flags (ParallelConfig's, copied into RankShape). Full recomputation without a method is
// uniform 1 (every layer its own unit).
struct RecomputeSettings {
  RecomputeGranularity granularity = RecomputeGranularity::kNone;
  RecomputeMethod method = RecomputeMethod::kNone;
  int num_layers = 0;  // --recompute-num-layers
  RecomputeSettings(
      RecomputeGranularity g = RecomputeGranularity::kNone,  // NOLINT(google-explicit-constructor)
      RecomputeMethod m = RecomputeMethod::kNone, int n = 0)
      : granularity(g), method(m), num_layers(n) {}
  bool full() const { return granularity == RecomputeGranularity::kFull; }
  friend bool operator==(const RecomputeSettings&, const RecomputeSettings&) = default;
  static RecomputeSettings of(const ParallelConfig& config) {
    return {config.recompute_granularity, config.recompute_method, config.recompute_num_layers};
  }
};

// One checkpointed unit: consecutive layers of the chunk, re-run together before the backward of the last.
struct RecomputeUnit {
  std::vector<int> layers;  // layer codes in forward order (decoder layers: global index; MTP: -3 - k)
  int last() const { return layers.back(); }
};

// How one layer fares under the plan.
enum class LayerRecompute {
  kKept,       // keeps its activations (its backward recomputes only the norm outputs, as without recompute)
  kUnitLast,   // the last layer of its unit: its backward starts with the unit's re-run (which leaves this
               // layer's norm outputs fresh)
  kUnitInner,  // re-run by its unit before the backward of a later layer (its norm outputs are recomputed
               // again in its own backward, as a kept layer's)
};

struct RecomputePlan {
  std::vector<int> layers;  // the chunk's layer codes in forward order (decoder layers, then MTP layers)
  std::vector<RecomputeUnit> units;      // in forward order; empty without full recomputation
  std::vector<LayerRecompute> of_layer;  // per entry of `layers`

  bool recomputed(int layer) const { return at(layer) != LayerRecompute::kKept; }
  LayerRecompute at(int layer) const;  // kKept for a layer the chunk does not hold
  // The unit whose re-run precedes `layer`'s backward (layer is its last), or null.
  const RecomputeUnit* unit_ending_at(int layer) const;
  const RecomputeUnit* unit_of(int layer) const;  // the unit holding `layer`, or null
  int recomputed_count() const;
  int largest_unit() const;  // layers in the largest unit (0: none)
};

// The plan of a chunk holding decoder layers `decoder_layers` and MTP layers `mtp_layers` (codes -3 - k), in
// forward order.
RecomputePlan plan_recompute(const RecomputeSettings& settings, const std::vector<int>& decoder_layers,
                             const std::vector<int>& mtp_layers = {});
// The plan of a pipeline stage (one model chunk).
RecomputePlan plan_recompute(const RecomputeSettings& settings, const PipelineStage& stage);
// plan_recompute's rule for one layer without building the plan (the planner's hot loops): the decoder layer
// at `position` of a chunk's `count`, and an MTP layer.
LayerRecompute decoder_layer_recompute(const RecomputeSettings& settings, int position, int count);
LayerRecompute mtp_layer_recompute(const RecomputeSettings& settings);

// Megatron FSDP optim_grads_params: the gathered parameter entries a chunk holds at once, each the size of
// the largest: 2 (the entry in use and the prefetched next one), or a recompute unit's `largest_unit` layers
// during its re-run, one more beside them when the chunk's tied LM head keeps the word embedding gathered.
int fsdp_gathered_entries(int largest_unit, bool head_reads_embedding);
// Megatron FSDP optim_grads and optim_grads_params: the whole-bucket fp32 gradient slots a rank holds at
// once, each the size of its largest bucket (beside the fp32 shard of every bucket): Megatron's bucket being
// back-propagated and the one whose reduce-scatter is still in flight. The executor reduce-scatters each
// bucket right after the backward that completes it, so its second slot holds the LM head's bucket, which
// the head's weight-gradient GEMMs write in the forward and which is reduced after its backward (a tied
// embedding's through the whole backward; the last chunk's head while another chunk's backward runs).
inline constexpr int kFsdpGradientBucketsInFlight = 2;
// Per symbol of the stage, in order: how its layer fares (E and L: kKept).
std::vector<LayerRecompute> symbol_recompute(const RecomputeSettings& settings, const PipelineStage& stage);

}  // namespace megatune::layouts
