// The pipeline arrangements the planner tries at one pipeline size: Megatron's even split, interleaved
// chunks, lighter first/last stages (per rank, and per stage with virtual stages), or exactly what the user
// pinned (a layout string, the virtual-stage flags, --decoder-first/last-pipeline-num-layers,
// --account-for-embedding/loss-in-pipeline-split).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "layouts/model_spec.h"
#include "layouts/parallel_config.h"
#include "layouts/pipeline_layout.h"
#include "planner/search.h"

namespace megatune::planner {

// One pipeline arrangement of the layers, and how Megatron's flags express it.
struct LayoutChoice {
  int vpp = 1;
  std::string layout_string;  // --pipeline-model-parallel-layout, "" when the flags below give it
  // Always set: the stages, as the config apply() sets resolves them (shared by its candidates).
  std::shared_ptr<const layouts::PipelineLayout> stages;
  // Megatron's split flags (a pinned split): -1 / false when not given.
  int first_stage_layers = -1, last_stage_layers = -1;
  bool account_for_embedding = false, account_for_loss = false;

  // Sets the config's pipeline flags (layout string, split flags, virtual stages) to this arrangement.
  void apply(const layouts::ModelSpec& model, layouts::ParallelConfig& config) const;
};

// True when the space pins Megatron's split flags (--decoder-first/last-pipeline-num-layers,
// --account-for-embedding/loss-in-pipeline-split): only that split is tried.
bool pins_pipeline_split(const SearchSpace& space);

// Every arrangement to try at pipeline size `pp` (none when nothing divides), each once.
std::vector<LayoutChoice> layout_choices(const layouts::ModelSpec& model, int pp, const SearchSpace& space);

}  // namespace megatune::planner
