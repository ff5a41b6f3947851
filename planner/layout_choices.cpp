// Pipeline arrangements per pipeline size: the even split and its interleaved forms, lighter first/last
// ranks and (with virtual stages) lighter first/last stages, and the user's pinned layout string or split
// flags.
#include "planner/layout_choices.h"

#include <algorithm>
#include <functional>
#include <set>

#include "layouts/pipeline_layout.h"

namespace megatune::planner {

using layouts::PipelineLayout;

void LayoutChoice::apply(const layouts::ModelSpec& model, layouts::ParallelConfig& config) const {
  const bool split_flags =
      first_stage_layers >= 0 || last_stage_layers >= 0 || account_for_embedding || account_for_loss;
  if (!layout_string.empty()) {
    config.pipeline_model_parallel_layout = layout_string;
  } else if (split_flags) {
    config.decoder_first_pipeline_num_layers = first_stage_layers;
    config.decoder_last_pipeline_num_layers = last_stage_layers;
    config.account_for_embedding_in_pipeline_split = account_for_embedding;
    config.account_for_loss_in_pipeline_split = account_for_loss;
    if (vpp > 1) config.num_virtual_stages_per_pipeline_rank = vpp;
  } else if (vpp > 1) {
    config.num_layers_per_virtual_pipeline_stage = model.num_layers / (config.pp() * vpp);
  }
}

namespace {

// Collects distinct arrangements; a split that does not exist for the layer count is skipped.
class ChoiceList {
 public:
  // `make` builds the layout; `prototype` says how the flags express it (layout_string set for "string").
  void try_add(const std::function<PipelineLayout()>& make, LayoutChoice prototype, bool as_string) {
    try {
      auto layout = std::make_shared<const PipelineLayout>(make());
      std::string text = layout->to_string();
      if (!seen_.insert(text).second) return;
      prototype.vpp = layout->vpp();
      prototype.stages = std::move(layout);
      if (as_string) prototype.layout_string = std::move(text);
      out_.push_back(std::move(prototype));
    } catch (const std::exception&) {
      // This split does not exist for the layer count; skip it.
    }
  }
  std::vector<LayoutChoice> take() { return std::move(out_); }

 private:
  std::vector<LayoutChoice> out_;
  std::set<std::string> seen_;
};

// The virtual-stage counts to try at `pp`: the pinned one, else 1 and (with VPP searched) 2..max.
std::vector<int> virtual_stage_counts(int pp, const SearchSpace& space) {
  if (space.virtual_stages > 0) return {space.virtual_stages};
  std::vector<int> out = {1};
  if (pp > 1 && space.virtual_pipeline)
    for (int v = 2; v <= space.max_virtual_stages; ++v) out.push_back(v);
  return out;
}

// --decoder-first/last-pipeline-num-layers or --account-for-embedding/loss-in-pipeline-split: Megatron's
// derived split with those flags, at every virtual-stage count it divides.
void add_pinned_split(const layouts::ModelSpec& model, int pp, const SearchSpace& space, ChoiceList& list) {
  LayoutChoice flags;
  flags.first_stage_layers = space.first_stage_layers;
  flags.last_stage_layers = space.last_stage_layers;
  flags.account_for_embedding = space.account_for_embedding;
  flags.account_for_loss = space.account_for_loss;
  const bool uneven = space.first_stage_layers >= 0 || space.last_stage_layers >= 0;
  for (int v : virtual_stage_counts(pp, space)) {
    list.try_add(
        [&] {
          return uneven ? PipelineLayout::uneven(model.num_layers, pp, space.first_stage_layers,
                                                 space.last_stage_layers, v, model.mtp_num_layers)
                        : PipelineLayout::accounting_for_embedding_and_loss(
                              model.num_layers, pp, space.account_for_embedding, space.account_for_loss, v,
                              model.mtp_num_layers);
        },
        flags, false);
  }
}

// Fewer decoder layers on the first pp rank (embedding) and the last (output layer + loss), no VPP.
void add_uneven_ranks(const layouts::ModelSpec& model, int pp, ChoiceList& list) {
  const int layers = model.num_layers;
  const int base = (layers + pp - 1) / pp;
  for (int first = std::max(1, base - 3); first <= base; ++first) {
    for (int last = std::max(1, base - 3); last <= base; ++last) {
      const int middle = layers - first - last;
      if (middle < 0) continue;
      if (pp == 2 ? middle != 0 : middle % (pp - 2) != 0) continue;
      if (pp > 2 && middle / (pp - 2) < std::max(first, last)) continue;  // middle stages carry the most
      list.try_add([&] { return PipelineLayout::uneven(layers, pp, first, last, 1, model.mtp_num_layers); },
                   {}, true);
    }
  }
}

// pp * vpp stages in global order: E and `first` layers, `middle` layers on each stage between, then `last`
// layers, the MTP layers and L.
PipelineLayout lighter_end_stages(const layouts::ModelSpec& model, int pp, int vpp, int first, int middle,
                                  int last) {
  using layouts::LayerSymbol;
  const int count = pp * vpp;
  std::vector<std::vector<LayerSymbol>> stages(count,
                                               std::vector<LayerSymbol>(middle, LayerSymbol::kDecoder));
  stages.front().assign(first, LayerSymbol::kDecoder);
  stages.front().insert(stages.front().begin(), LayerSymbol::kEmbedding);
  stages.back().assign(last, LayerSymbol::kDecoder);
  stages.back().insert(stages.back().end(), model.mtp_num_layers, LayerSymbol::kMtp);
  stages.back().push_back(LayerSymbol::kLoss);
  PipelineLayout layout = PipelineLayout::from_stages(std::move(stages), pp);
  layout.validate(model.num_layers, model.mtp_num_layers);
  return layout;
}

// With virtual stages: the first stage (embedding) and the last (output layer + loss) hold up to 3 decoder
// layers fewer than the others, as layout strings (Megatron's split flags lighten whole ranks, every chunk
// of them). This is how layer counts that no pp x vpp divides (126 over 32 x 2) still interleave.
void add_lighter_end_stages(const layouts::ModelSpec& model, int pp, const SearchSpace& space,
                            ChoiceList& list) {
  const int layers = model.num_layers;
  for (int v : virtual_stage_counts(pp, space)) {
    const int stages = pp * v;
    if (v < 2 || stages < 3) continue;
    const int most = layers / (stages - 2);  // the most a middle stage can hold
    for (int first = std::max(0, most - 3); first <= most; ++first) {
      for (int last = std::max(0, most - 3); last <= most; ++last) {
        const int rest = layers - first - last;
        if (rest < 0 || rest % (stages - 2) != 0) continue;
        const int middle = rest / (stages - 2);
        if (middle < std::max(first, last) || middle - std::min(first, last) > 3) continue;
        if (first == middle && last == middle) continue;  // the even split
        list.try_add([&] { return lighter_end_stages(model, pp, v, first, middle, last); }, {}, true);
      }
    }
  }
}

}  // namespace

bool pins_pipeline_split(const SearchSpace& space) {
  return space.first_stage_layers >= 0 || space.last_stage_layers >= 0 || space.account_for_embedding ||
         space.account_for_loss;
}

std::vector<LayoutChoice> layout_choices(const layouts::ModelSpec& model, int pp, const SearchSpace& space) {
  ChoiceList list;
  const int layers = model.num_layers;
  const int mtp = model.mtp_num_layers;
  if (!space.pipeline_layout.empty()) {
    list.try_add(
        [&] {
          PipelineLayout layout = PipelineLayout::parse(space.pipeline_layout, pp);
          layout.validate(layers, mtp);
          return layout;
        },
        {}, true);
    return list.take();
  }
  if (pins_pipeline_split(space)) {
    add_pinned_split(model, pp, space, list);
    return list.take();
  }
  if (space.virtual_stages > 0 || space.layers_per_virtual_stage > 0) {
    // A pinned virtual-pipeline size: the uniform split with those chunks only.
    const int v = space.virtual_stages > 0 ? space.virtual_stages
                                           : (layers % (pp * space.layers_per_virtual_stage) == 0
                                                  ? layers / (pp * space.layers_per_virtual_stage)
                                                  : 0);
    if (v > 0 && layers % (pp * v) == 0 && (v == 1 || pp > 1))
      list.try_add([&] { return PipelineLayout::uniform(layers, pp, v, mtp); }, {}, false);
    return list.take();
  }
  for (int v : virtual_stage_counts(pp, space)) {
    if (layers % (pp * v) == 0)
      list.try_add([&] { return PipelineLayout::uniform(layers, pp, v, mtp); }, {}, false);
  }
  if (pp > 1 && space.uneven_layouts) {
    add_uneven_ranks(model, pp, list);
    add_lighter_end_stages(model, pp, space, list);
  }
  return list.take();
}

}  // namespace megatune::planner
