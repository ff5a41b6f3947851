// Recompute plan: Megatron's uniform / block full recomputation over one model chunk's layers.
#include "layouts/recompute_plan.h"

#include <algorithm>

namespace megatune::layouts {

namespace {

void add_recompute_unit(RecomputePlan& plan, std::vector<int> layers) {
  if (layers.empty()) return;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const auto at = std::find(plan.layers.begin(), plan.layers.end(), layers[i]) - plan.layers.begin();
    plan.of_layer[at] = i + 1 == layers.size() ? LayerRecompute::kUnitLast : LayerRecompute::kUnitInner;
  }
  plan.units.push_back({std::move(layers)});
}

}  // namespace

RecomputePlan plan_recompute(const RecomputeSettings& settings, const std::vector<int>& decoder_layers,
                             const std::vector<int>& mtp_layers) {
  RecomputePlan plan;
  plan.layers = decoder_layers;
  plan.layers.insert(plan.layers.end(), mtp_layers.begin(), mtp_layers.end());
  plan.of_layer.assign(plan.layers.size(), LayerRecompute::kKept);
  if (!settings.full()) return plan;
  const int n = std::max(1, settings.num_layers);
  const int count = static_cast<int>(decoder_layers.size());
  if (settings.method == RecomputeMethod::kBlock) {
    for (int i = 0; i < std::min(n, count); ++i) add_recompute_unit(plan, {decoder_layers[i]});
    return plan;  // Megatron skips recompute of MTP layers under block
  }
  for (int first = 0; first < count; first += n) {
    const int end = std::min(first + n, count);
    add_recompute_unit(plan, std::vector<int>(decoder_layers.begin() + first, decoder_layers.begin() + end));
  }
  for (int m : mtp_layers) add_recompute_unit(plan, {m});
  return plan;
}

RecomputePlan plan_recompute(const RecomputeSettings& settings, const PipelineStage& stage) {
  std::vector<int> decoder, mtp;
  for (int i = 0; i < stage.num_decoder_layers; ++i) decoder.push_back(stage.first_decoder_layer + i);
  for (int k = 0; k < stage.num_mtp_layers; ++k) mtp.push_back(-3 - (stage.first_mtp_layer + k));
  return plan_recompute(settings, decoder, mtp);
}

LayerRecompute decoder_layer_recompute(const RecomputeSettings& settings, int position, int count) {
  if (!settings.full()) return LayerRecompute::kKept;
  const int n = std::max(1, settings.num_layers);
  if (settings.method == RecomputeMethod::kBlock)
    return position < n ? LayerRecompute::kUnitLast : LayerRecompute::kKept;
  return position % n == n - 1 || position == count - 1 ? LayerRecompute::kUnitLast
                                                        : LayerRecompute::kUnitInner;
}

LayerRecompute mtp_layer_recompute(const RecomputeSettings& settings) {
  return settings.full() && settings.method != RecomputeMethod::kBlock ? LayerRecompute::kUnitLast
                                                                       : LayerRecompute::kKept;
}

std::vector<LayerRecompute> symbol_recompute(const RecomputeSettings& settings, const PipelineStage& stage) {
  std::vector<LayerRecompute> out(stage.symbols.size(), LayerRecompute::kKept);
  if (!settings.full()) return out;
  int position = 0;
  for (std::size_t i = 0; i < stage.symbols.size(); ++i) {
    if (stage.symbols[i] == LayerSymbol::kDecoder)
      out[i] = decoder_layer_recompute(settings, position++, stage.num_decoder_layers);
    if (stage.symbols[i] == LayerSymbol::kMtp) out[i] = mtp_layer_recompute(settings);
  }
  return out;
}

LayerRecompute RecomputePlan::at(int layer) const {
  const auto it = std::find(layers.begin(), layers.end(), layer);
  return it == layers.end() ? LayerRecompute::kKept : of_layer[it - layers.begin()];
}

const RecomputeUnit* RecomputePlan::unit_of(int layer) const {
  for (const RecomputeUnit& u : units)
    if (std::find(u.layers.begin(), u.layers.end(), layer) != u.layers.end()) return &u;
  return nullptr;
}

const RecomputeUnit* RecomputePlan::unit_ending_at(int layer) const {
  for (const RecomputeUnit& u : units)
    if (u.last() == layer) return &u;
  return nullptr;
}

int RecomputePlan::recomputed_count() const {
  int n = 0;
  for (const RecomputeUnit& u : units) n += static_cast<int>(u.layers.size());
  return n;
}

int RecomputePlan::largest_unit() const {
  std::size_t n = 0;
  for (const RecomputeUnit& u : units) n = std::max(n, u.layers.size());
  return static_cast<int>(n);
}

int fsdp_gathered_entries(int largest_unit, bool head_reads_embedding) {
  return std::max(2, largest_unit + (head_reads_embedding ? 1 : 0));
}

}  // namespace megatune::layouts
